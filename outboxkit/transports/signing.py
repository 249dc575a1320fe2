"""Signed requests, as Standard Webhooks defines them.

An outbox that declares ``OutboxOptions(sign_webhooks=True)`` sends every
attempt with three more headers::

    webhook-id: <the row's idempotency key>          (the same on every attempt)
    webhook-timestamp: <Unix seconds of this attempt>
    webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">

so a receiver can check, with any Standard Webhooks library, that the request
comes from the holder of the secret, that its body was not changed on the
way, and that it is recent (receivers usually refuse a timestamp more than
five minutes away from their clock; each attempt is signed when it is sent).
The body signed is exactly the bytes sent: ``Delivery.body()``, or nothing.

Secrets are in the ``whsec_<base64>`` form the receivers' libraries read.
Several at once sign with each, space-separated in ``webhook-signature``, as
the standard allows; that is how a secret is rotated without a moment where
a receiver refuses: add the new secret, let the receiver switch, then remove
the old one.  They come from settings (``OUTBOXKIT_OUTBOXES__<KEY>__WEBHOOK_SECRETS``,
see ``outboxkit.settings``) and never appear in a repr, a log line or an
error message: a malformed one is named by its position, not its value.

An outbox that signs owns these three headers: ``webhook-id``,
``webhook-timestamp`` and ``webhook-signature`` set by ``build_delivery``
are replaced.

Signing wraps the transport (``SigningTransport``), so it applies to
``HttpTransport`` and to a transport of the application's own alike; the
drainer wraps its transport when its outbox signs.  Its cost is measured in
bench/signing.py (docs/destinations.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Callable, Iterable, Mapping

from outboxkit.errors import InvalidTypeError, InvalidValueError
from outboxkit.policy import AttemptResult
from outboxkit.transports.base import Delivery, Transport

__all__ = ["SECRET_PREFIX", "SigningTransport", "WebhookSecrets"]

SECRET_PREFIX = "whsec_"
SIGNATURE_VERSION = "v1"
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
# Secrets shorter than this are refused: an HMAC key of a few bytes can be guessed.
MINIMUM_SECRET_BYTES = 16


class WebhookSecrets:
    """One or more signing secrets in ``whsec_<base64>`` form, decoded once and never shown.

    ``WebhookSecrets(["whsec_...", "whsec_..."])``; each item may also be a
    pydantic ``SecretStr``.  The first secret is the current one; the others
    sign too while a rotation is under way.
    """

    __slots__ = ("_keys",)

    def __init__(self, secrets: Iterable[object]) -> None:
        if isinstance(secrets, (str, bytes)) or not isinstance(secrets, Iterable):
            raise InvalidTypeError("webhook secrets must be a list of 'whsec_...' strings")
        keys: list[bytes] = []
        for position, secret in enumerate(secrets, start=1):
            keys.append(_decode(_reveal(secret, position), position))
        if not keys:
            raise InvalidValueError("webhook secrets must hold at least one 'whsec_...' secret")
        self._keys = tuple(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"WebhookSecrets(<{len(self._keys)} hidden>)"

    __str__ = __repr__

    def __reduce__(self) -> tuple[object, ...]:
        raise InvalidTypeError("WebhookSecrets cannot be pickled: the secrets would leave the process")

    def signature(self, message_id: str, timestamp: int, body: bytes) -> str:
        """The ``webhook-signature`` value: ``v1,<base64>`` per secret, space-separated."""
        content = f"{message_id}.{timestamp}.".encode() + body
        return " ".join(
            f"{SIGNATURE_VERSION},{base64.b64encode(hmac.digest(key, content, hashlib.sha256)).decode('ascii')}"
            for key in self._keys
        )

    def headers(self, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
        """The three headers of one signed request."""
        return {
            ID_HEADER: message_id,
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: self.signature(message_id, timestamp, body),
        }


def _reveal(secret: object, position: int) -> str:
    reveal = getattr(secret, "get_secret_value", None)  # a pydantic SecretStr, from settings
    value = reveal() if callable(reveal) else secret
    if not isinstance(value, str):
        raise InvalidTypeError(f"webhook secret #{position} must be a 'whsec_...' string, got {type(value).__name__}")
    return value


def _decode(secret: str, position: int) -> bytes:
    """The key bytes of one ``whsec_`` secret; an error names its position, never its value."""
    form = f"webhook secret #{position} must be '{SECRET_PREFIX}' followed by base64 of at least {MINIMUM_SECRET_BYTES} bytes"
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidValueError(f"{form}; it does not start with '{SECRET_PREFIX}'")
    encoded = secret[len(SECRET_PREFIX) :].strip()
    try:
        # Unpadded base64 is accepted, as the receivers' libraries accept it.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidValueError(f"{form}; what follows the prefix is not base64") from None
    if len(key) < MINIMUM_SECRET_BYTES:
        raise InvalidValueError(f"{form}; it decodes to {len(key)} bytes")
    return key


class SigningTransport:
    """A transport that signs each attempt, then sends it through the transport it wraps.

    ``webhook-id`` is the idempotency key (the same on every attempt of a
    row), ``webhook-timestamp`` the moment of this attempt (``now``, Unix
    seconds, the system clock by default: receivers compare it with theirs).
    ``close()`` closes the wrapped transport.
    """

    def __init__(self, transport: Transport, secrets: WebhookSecrets, *, now: Callable[[], float] = time.time) -> None:
        if not isinstance(secrets, WebhookSecrets):
            raise InvalidTypeError(f"SigningTransport needs WebhookSecrets, got {type(secrets).__name__}")
        self.transport = transport
        self._secrets = secrets
        self._now = now

    def __repr__(self) -> str:
        return f"SigningTransport({self.transport!r}, {self._secrets!r})"

    def sign(self, delivery: Delivery, *, idempotency_key: str) -> Delivery:
        """A copy of ``delivery`` carrying the three Standard Webhooks headers for this moment."""
        headers: Mapping[str, str] = self._secrets.headers(idempotency_key, int(self._now()), delivery.body() or b"")
        return delivery.with_headers(headers)

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        signed = self.sign(delivery, idempotency_key=idempotency_key)
        return self.transport.send(signed, idempotency_key=idempotency_key, timeout=timeout)

    def close(self) -> None:
        self.transport.close()
