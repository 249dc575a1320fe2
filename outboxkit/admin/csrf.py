"""CSRF protection for the admin's HTML forms: a signed double-submit token.

On every page the admin makes sure the browser holds a cookie with a token
``<nonce>.<HMAC-SHA256(secret, nonce)>``, and puts the same token in a
hidden field of each form.  A POST is accepted only when the field equals the
cookie and the signature checks out.  A page on another site can make a
browser send the cookie, but it cannot read it to fill in the field, and it
cannot plant a cookie of its own (for example from a sibling subdomain)
without the secret.

The secret is per router.  With several worker processes, pass the same
``csrf_secret`` to every worker, or a form rendered by one worker is refused
by another.

The JSON API does not use this token: its POST routes accept only
``Content-Type: application/json``, which a cross-site form or a no-CORS
``fetch`` cannot send.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["CSRF_COOKIE", "CSRF_FIELD", "CsrfTokens"]

CSRF_COOKIE = "outboxkit_csrf"
CSRF_FIELD = "csrf_token"


class CsrfTokens:
    """Issues and checks double-submit tokens signed with one secret."""

    def __init__(self, secret: str | bytes | None = None) -> None:
        if secret is None:
            secret = secrets.token_bytes(32)
        elif isinstance(secret, str):
            secret = secret.encode()
        if len(secret) < 16:
            raise ValueError("csrf_secret must be at least 16 bytes long")
        self._secret = secret

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._sign(nonce)}"

    def is_valid(self, token: str | None) -> bool:
        """The token was issued with this secret."""
        if not token or len(token) > 200:
            return False
        nonce, _, signature = token.partition(".")
        return bool(nonce) and hmac.compare_digest(signature.encode(), self._sign(nonce).encode())

    def accepts(self, *, cookie: str | None, submitted: str | None) -> bool:
        """A POST is genuine: the form's token is the cookie's, and it is ours."""
        if not cookie or not submitted:
            return False
        return hmac.compare_digest(cookie.encode(), submitted.encode()) and self.is_valid(cookie)
