"""CSRF protection for the admin's HTML forms: a signed, expiring, actor-bound double-submit token.

On every page the admin makes sure the browser holds a cookie with a token,
and puts the same token in a hidden field of each form.  The token is
``<nonce>.<expires>.<HMAC-SHA256(secret, actor, mount path, nonce, expires)>``
(see ``outboxkit.admin.signed_values``).  A POST is accepted only when

* the field equals the cookie,
* the signature checks out for the actor the application's auth dependency
  admitted *now* and for this admin's mount path, and
* the token has not expired (``OUTBOXKIT_ADMIN_CSRF_TOKEN_SECONDS``,
  two hours by default).

A page on another site can make a browser send the cookie, but it cannot
read it to fill in the field, and it cannot plant a cookie of its own (for
example from a sibling subdomain) without the secret.  A token leaked from
one admin's browser is worthless to another admin, and worthless to anyone
once it expires.  A page re-issues the token once less than half its
lifetime is left, so a form is always good for at least half the lifetime.

The cookie is scoped to the admin's mount path (``Path=/admin``) and named
``outboxkit_csrf_<tag>``, where the tag derives from the secret and the mount
path, so two admins on one host (other prefixes, other ports) keep separate
cookies.

The key is shared by every worker and host of the application: by default
one the kit generates once and keeps in the database (see
``outboxkit.admin.router.signing_key``), so a form rendered by one process
is accepted by any other.

The JSON API does not use this token: its POST routes accept only
``Content-Type: application/json``, which a cross-site form or a no-CORS
``fetch`` cannot send.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from outboxkit.admin.signed_values import Signer
from outboxkit.clock import Clock

__all__ = ["CSRF_COOKIE", "CSRF_FIELD", "CsrfTokens"]

CSRF_COOKIE = "outboxkit_csrf"  # the prefix of the cookie's name; see CsrfTokens.cookie_name
CSRF_FIELD = "csrf_token"
_PURPOSE = "csrf"


class CsrfTokens:
    """Issues and checks double-submit tokens for one admin router."""

    def __init__(self, signer: Signer, *, clock: Clock, lifetime_seconds: int) -> None:
        self._signer = signer
        self._clock = clock
        self.lifetime_seconds = lifetime_seconds

    def cookie_name(self, mount_path: str) -> str:
        return f"{CSRF_COOKIE}_{self._signer.tag(mount_path)}"

    def issue(self, *, actor: str, mount_path: str) -> str:
        expires = self._clock.now() + timedelta(seconds=self.lifetime_seconds)
        nonce = secrets.token_urlsafe(18).replace(".", "_")
        return self._signer.sign(_PURPOSE, binding=(actor, mount_path), fields=(nonce,), expires=expires)

    def is_valid(self, token: str | None, *, actor: str, mount_path: str) -> bool:
        """Issued by this router to ``actor`` for ``mount_path``, and not expired."""
        return self._signer.unsign(token, _PURPOSE, binding=(actor, mount_path), now=self._clock.now()) is not None

    def is_fresh(self, token: str | None, *, actor: str, mount_path: str) -> bool:
        """Valid, with at least half its lifetime left: good to hand out in a form."""
        if not self.is_valid(token, actor=actor, mount_path=mount_path):
            return False
        assert token is not None
        return self._signer.expires_at(token) - self._clock.now().timestamp() >= self.lifetime_seconds / 2

    def ready(self) -> None:
        """Fetch the signing key now (it may come from the database): call it off the event loop."""
        self._signer.ready()

    def has_key(self) -> bool:
        """Whether the signing key is at hand (fetched, or given): pages rendered without it carry no token."""
        return self._signer.has_key()

    def refusal_hint(self) -> str:
        """Why a genuine form may be refused here, when there is a cause the person can act on; else ``""``."""
        return str(getattr(self._signer.source, "hint", ""))

    def accepts(self, *, cookie: str | None, submitted: str | None, actor: str, mount_path: str) -> bool:
        """A POST is genuine: the form's token is the cookie's, ours, for this actor, and not expired."""
        if not cookie or not submitted:
            return False
        same = secrets.compare_digest(cookie.encode("utf-8", "surrogatepass"), submitted.encode("utf-8", "surrogatepass"))
        return same and self.is_valid(cookie, actor=actor, mount_path=mount_path)
