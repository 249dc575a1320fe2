"""Verifying Standard Webhooks signatures: the one module that imports ``standardwebhooks``.

A request is accepted when, in this order:

1. it carries ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature``;
2. its timestamp is within ``tolerance_seconds`` (default 300) of the
   receiver's clock, either way, so a captured request cannot be replayed
   later;
3. one of the signatures in ``webhook-signature`` (space-separated, ``v1,<base64>``)
   is the HMAC-SHA256 of ``<id>.<timestamp>.<body>`` under one of the
   receiver's secrets.

Several secrets are how a secret is rotated without a refused request: the
receiver accepts the old and the new, the sender switches, then the old one
is removed.  The signatures are computed and the ``whsec_`` secrets decoded by
the ``standardwebhooks`` package, the reference implementation of the
standard, so this receiver agrees with every Standard Webhooks sender
(outboxkit's ``SigningTransport`` included) by construction.  The timestamp is
checked here rather than by the package's ``Webhook.verify``, whose tolerance
is fixed at five minutes and whose clock cannot be injected.

The package is the ``inbox`` extra (``pip install 'outboxkit[inbox]'``); it
is imported when a ``WebhookVerifier`` is built, and its absence is reported
with that hint.  Secrets never appear in a repr or an error message: a bad one
is named by its position.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from outboxkit.clock import Clock, SystemClock
from outboxkit.errors import ConfigurationError, InvalidWebhookSignature

__all__ = ["DEFAULT_TOLERANCE_SECONDS", "INSTALL_HINT", "VerifiedWebhook", "WebhookVerifier"]

INSTALL_HINT = "pip install 'outboxkit[inbox]'"
DEFAULT_TOLERANCE_SECONDS = 300.0
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
# More signatures than this in one header is not a rotation, it is someone guessing.
MAXIMUM_SIGNATURES = 10


@dataclass(frozen=True)
class VerifiedWebhook:
    """What a verified request says about itself: its message id and when it was signed."""

    message_id: str
    timestamp: datetime


def _standardwebhooks() -> Any:
    try:
        import standardwebhooks
    except ImportError:
        raise ConfigurationError(
            f"verifying webhooks needs the standardwebhooks package: {INSTALL_HINT}"
        ) from None
    return standardwebhooks


class WebhookVerifier:
    """Checks requests against ``secrets`` (``whsec_<base64>``, one or more) and a timestamp ``tolerance_seconds``."""

    def __init__(
        self, secrets: Sequence[str], *, tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS, clock: Clock | None = None
    ) -> None:
        package = _standardwebhooks()
        if isinstance(secrets, str) or not isinstance(secrets, Sequence) or not secrets:
            raise ConfigurationError(
                "webhook secrets must be a non-empty list of 'whsec_<base64>' strings (several while rotating)"
            )
        self._signers: list[Any] = []
        for position, secret in enumerate(secrets, start=1):
            if not isinstance(secret, str) or not secret.startswith("whsec_"):
                raise ConfigurationError(f"webhook secret {position} must be a string in the form 'whsec_<base64>'")
            try:
                self._signers.append(package.Webhook(secret))
            except Exception:  # binascii.Error, EmptyWebhookSecretError: never echo the value
                raise ConfigurationError(f"webhook secret {position} is not 'whsec_' followed by base64") from None
        if isinstance(tolerance_seconds, bool) or not isinstance(tolerance_seconds, (int, float)) or not (
            math.isfinite(tolerance_seconds) and tolerance_seconds > 0
        ):
            raise ConfigurationError(f"tolerance_seconds must be a positive number of seconds, got {tolerance_seconds!r}")
        self.tolerance_seconds = float(tolerance_seconds)
        self.clock = clock or SystemClock()

    def __repr__(self) -> str:
        return f"WebhookVerifier(secrets=<{len(self._signers)} hidden>, tolerance_seconds={self.tolerance_seconds:g})"

    def verify(self, body: bytes, headers: Mapping[str, str]) -> VerifiedWebhook:
        """The request's id and timestamp if ``body`` and ``headers`` verify; otherwise ``InvalidWebhookSignature``."""
        lowered = {key.lower(): value for key, value in headers.items()}
        message_id = lowered.get(ID_HEADER)
        stamp = lowered.get(TIMESTAMP_HEADER)
        signatures = lowered.get(SIGNATURE_HEADER)
        if not (message_id and stamp and signatures):
            raise InvalidWebhookSignature(f"the request lacks {ID_HEADER}, {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}")
        if not stamp.isdigit() or len(stamp) > 12:
            raise InvalidWebhookSignature(f"{TIMESTAMP_HEADER} must be Unix seconds")
        timestamp = datetime.fromtimestamp(int(stamp), tz=timezone.utc)
        skew = (self.clock.now() - timestamp).total_seconds()
        if abs(skew) > self.tolerance_seconds:
            direction = "old" if skew > 0 else "far in the future"
            raise InvalidWebhookSignature(
                f"the request's timestamp is {abs(skew):.0f} s {direction}, beyond the tolerance of "
                f"{self.tolerance_seconds:g} s"
            )
        passed = signatures.split(" ")[:MAXIMUM_SIGNATURES]
        for signer in self._signers:
            expected = signer.sign(msg_id=message_id, timestamp=timestamp, data=body).encode()
            if any(hmac.compare_digest(expected, candidate.encode()) for candidate in passed):
                return VerifiedWebhook(message_id=message_id, timestamp=timestamp)
        raise InvalidWebhookSignature("no signature in the request matches a secret of this receiver")
