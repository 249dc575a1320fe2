"""Signed, expiring values for the admin's cookies (CSRF tokens and flash notices).

A signed value is ``<field>.<field>....<expires>.<signature>``: the fields in
the clear, the expiry as Unix seconds, and an HMAC-SHA256 over a purpose, a
binding (who it was issued to, and where), the fields and the expiry.  The
binding is not stored in the value; the checker supplies it, so a value
issued to one actor, or for one admin mount, fails the check for another.
Fields must not contain ``.``.

Cookie names come from here too: each admin router names its cookies with a
short tag derived from its secret and its mount path, so two admins on one
host (two ports, two prefixes, two applications) never overwrite each
other's cookies.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections.abc import Callable, Sequence
from datetime import datetime

__all__ = ["Signer"]

MAX_SIGNED_LENGTH = 400


def _checked(secret: str | bytes) -> bytes:
    key = secret.encode() if isinstance(secret, str) else secret
    if len(key) < 16:
        raise ValueError("csrf_secret must be at least 16 bytes long")
    return key


class Signer:
    """Signs and checks values with one key of at least 16 bytes.

    The key is given, or ``None`` for a random one, or a function that returns it: called on first use (from
    a worker thread: ``ready``), and again on the next use if it raised, so a database that is down when the
    first page is asked for costs that page, not the process.
    """

    def __init__(self, secret: str | bytes | Callable[[], bytes] | None = None) -> None:
        self.source: Callable[[], bytes] | None = None
        self._secret: bytes | None = None
        self._lock = threading.Lock()
        if callable(secret):
            self.source = secret
        else:
            self._secret = _checked(secrets.token_bytes(32) if secret is None else secret)

    def has_key(self) -> bool:
        return self._secret is not None

    def ready(self) -> bytes:
        """The key, fetched first if it comes from a function."""
        if self._secret is None:
            with self._lock:
                if self._secret is None:
                    assert self.source is not None
                    self._secret = _checked(self.source())
        return self._secret

    def _signature(self, purpose: str, binding: Sequence[str], fields: Sequence[str]) -> str:
        # Length-prefixed parts, so no choice of actor or field can shift into another part.
        message = "".join(f"{len(part)}:{part};" for part in (purpose, *binding, *fields))
        return hmac.new(self.ready(), message.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def sign(self, purpose: str, *, binding: Sequence[str], fields: Sequence[str], expires: datetime) -> str:
        if any("." in field for field in fields):
            raise ValueError("signed fields must not contain '.'")
        all_fields = [*fields, str(int(expires.timestamp()))]
        return ".".join([*all_fields, self._signature(purpose, binding, all_fields)])

    def unsign(self, value: str | None, purpose: str, *, binding: Sequence[str], now: datetime) -> list[str] | None:
        """The fields of a value this signer issued for ``purpose`` and ``binding``, not yet expired; else ``None``."""
        if not value or len(value) > MAX_SIGNED_LENGTH:
            return None
        *fields, signature = value.split(".")
        if not fields:
            return None
        expected = self._signature(purpose, binding, fields)
        if not hmac.compare_digest(signature.encode("utf-8", "surrogatepass"), expected.encode()):
            return None
        expires = fields[-1]
        # ASCII digits only: "²".isdigit() is true, and int() would raise on it.
        if not (expires.isascii() and expires.isdigit()) or int(expires) <= now.timestamp():
            return None
        return fields[:-1]

    def expires_at(self, value: str) -> int:
        """The expiry (Unix seconds) of a value ``unsign`` accepted."""
        return int(value.split(".")[-2])

    def tag(self, label: str) -> str:
        """A short stable name part for ``label`` (e.g. a cookie name for one mount path)."""
        return self._signature("tag", (), (label,))[:10]
