"""Standard Webhooks verification (``outboxkit.inbox.verify``): secrets, tolerance, the install hint."""

from __future__ import annotations

import base64
import sys
from datetime import datetime, timedelta, timezone

import pytest
import standardwebhooks

from outboxkit import ManualClock
from outboxkit.errors import ConfigurationError, InvalidWebhookSignature
from outboxkit.inbox.verify import WebhookVerifier

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def signed(message_id: str, body: bytes, at: datetime, secret: str = SECRET) -> dict[str, str]:
    signature = standardwebhooks.Webhook(secret).sign(msg_id=message_id, timestamp=at, data=body)
    return {"Webhook-Id": message_id, "Webhook-Timestamp": str(int(at.timestamp())), "Webhook-Signature": signature}


def test_a_request_signed_by_the_reference_signer_verifies_with_any_header_case():
    verified = WebhookVerifier([SECRET], clock=ManualClock(NOW)).verify(b"{}", signed("m-1", b"{}", NOW))
    assert (verified.message_id, verified.timestamp) == ("m-1", NOW)


def test_the_tolerance_is_configurable_both_ways():
    verifier = WebhookVerifier([SECRET], tolerance_seconds=10, clock=ManualClock(NOW))
    verifier.verify(b"{}", signed("m-1", b"{}", NOW - timedelta(seconds=10)))
    with pytest.raises(InvalidWebhookSignature, match="11 s old"):
        verifier.verify(b"{}", signed("m-1", b"{}", NOW - timedelta(seconds=11)))
    with pytest.raises(InvalidWebhookSignature, match="future"):
        verifier.verify(b"{}", signed("m-1", b"{}", NOW + timedelta(seconds=11)))


@pytest.mark.parametrize(
    ("secrets", "message"),
    [
        ([], "non-empty list"),
        (SECRET, "non-empty list"),
        (["not-a-secret"], "secret 1 must be"),
        ([SECRET, "whsec_!!!"], "secret 2 is not"),
        ([SECRET, "whsec_"], "secret 2 is not"),
        ([SECRET, 7], "secret 2 must be"),
    ],
)
def test_bad_secrets_are_refused_at_start_up_by_position_never_by_value(secrets, message):
    with pytest.raises(ConfigurationError, match=message) as refused:
        WebhookVerifier(secrets)
    assert "whsec_!!!" not in str(refused.value)


@pytest.mark.parametrize("tolerance", [0, -1, float("nan"), float("inf"), True, "300"])
def test_a_bad_tolerance_is_refused(tolerance):
    with pytest.raises(ConfigurationError, match="tolerance_seconds"):
        WebhookVerifier([SECRET], tolerance_seconds=tolerance)


def test_the_repr_hides_the_secrets():
    assert SECRET not in repr(WebhookVerifier([SECRET, SECRET]))
    assert "2 hidden" in repr(WebhookVerifier([SECRET, SECRET]))


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "standardwebhooks", None)  # an import of it now raises ImportError
    with pytest.raises(ConfigurationError, match=r"pip install 'outboxkit\[inbox\]'"):
        WebhookVerifier([SECRET])
