"""Standard Webhooks signing: the spec's test vector, real requests verified by the reference library, secrets hidden.

The integration tests drain real rows to a real receiver on 127.0.0.1 that
verifies each request with the ``standardwebhooks`` package, as a partner's
endpoint would, and answers 401 to a request it cannot verify.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import standardwebhooks
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import DeclarativeBase

from outboxkit import (
    AttemptResult,
    CallableTransport,
    ConfigurationError,
    Delivery,
    Drainer,
    InvalidTypeError,
    InvalidValueError,
    Outbox,
    OutboxKit,
    OutboxKitSettings,
    OutboxOptions,
)
from outboxkit.settings import NON_SETTING_PREFIXES, NON_SETTING_VARIABLES
from outboxkit.transports.signing import SigningTransport, WebhookSecrets
from tests.support.models import SampleEvent

# The test vector published with the Standard Webhooks specification.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

NEW_SECRET = "whsec_bmV3LXNlY3JldC1mb3ItdGhlLXRlc3RzLTAx"  # base64 of b"new-secret-for-the-tests-01"
OLD_SECRET = "whsec_b2xkLXNlY3JldC1mb3ItdGhlLXRlc3RzLTAy"  # base64 of b"old-secret-for-the-tests-02"
NEVER_CONNECTED = "postgresql+psycopg://nobody@127.0.0.1:1/never_connected"


# -- a receiver that verifies, as a partner's endpoint does ----------------------


@dataclass(frozen=True)
class Arrival:
    headers: dict[str, str]
    body: bytes
    verified: bool


class VerifyingReceiver:
    """Answers 204 to a request ``standardwebhooks`` verifies with ``secret``, 401 to any other."""

    def __init__(self, secret: str) -> None:
        self.arrivals: list[Arrival] = []
        self._arrived = threading.Condition()
        verifier = standardwebhooks.Webhook(secret)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = dict(self.headers.items())
                try:
                    verifier.verify(body, headers)
                    verified = True
                except standardwebhooks.WebhookVerificationError:
                    verified = False
                self.send_response(204 if verified else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                with receiver._arrived:
                    receiver.arrivals.append(Arrival(headers={k.lower(): v for k, v in headers.items()}, body=body,
                                                     verified=verified))
                    receiver._arrived.notify_all()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> VerifyingReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def signed_drainer(make_drainer: Any) -> Any:
    """``signed_drainer(secrets) -> Drainer`` for SampleEvent, signing with ``secrets``."""
    return lambda secrets: make_drainer(sign_webhooks=True, webhook_secrets=WebhookSecrets(secrets))


def insert_rows(engine: Engine, url: str, payloads: list[dict[str, Any]]) -> None:
    from sqlalchemy import insert

    with engine.begin() as connection:
        connection.execute(insert(SampleEvent), [{"target_url": url, "payload": payload} for payload in payloads])


def read_rows(engine: Engine) -> list[SampleEvent]:
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        return list(session.scalars(select(SampleEvent).order_by(SampleEvent.id)))


# -- the signature itself --------------------------------------------------------


def test_the_specification_test_vector_is_reproduced_exactly():
    assert WebhookSecrets([SPEC_SECRET]).signature(SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE


def test_an_unpadded_secret_signs_as_the_padded_one():
    unpadded = NEW_SECRET.rstrip("=")
    padded = NEW_SECRET + "=" * (-len(NEW_SECRET.removeprefix("whsec_")) % 4)
    assert WebhookSecrets([unpadded]).signature("id", 1, b"{}") == WebhookSecrets([padded]).signature("id", 1, b"{}")


def test_several_secrets_each_sign_and_the_reference_library_accepts_either():
    secrets = WebhookSecrets([NEW_SECRET, OLD_SECRET])
    headers = secrets.headers("row-key", 1_900_000_000, b'{"a":1}')
    assert list(headers) == ["webhook-id", "webhook-timestamp", "webhook-signature"]
    parts = headers["webhook-signature"].split(" ")
    assert len(parts) == 2 and all(part.startswith("v1,") for part in parts)
    assert parts[0] == WebhookSecrets([NEW_SECRET]).signature("row-key", 1_900_000_000, b'{"a":1}')
    assert parts[1] == WebhookSecrets([OLD_SECRET]).signature("row-key", 1_900_000_000, b'{"a":1}')


def test_the_signing_transport_signs_each_attempt_at_its_own_time_with_the_same_id():
    seen: list[Delivery] = []

    def handler(delivery: Delivery, key: str) -> int:
        seen.append(delivery)
        return 503

    moments = iter([1_900_000_000.9, 1_900_000_042.2])
    transport = SigningTransport(CallableTransport(handler), WebhookSecrets([NEW_SECRET]), now=lambda: next(moments))
    delivery = Delivery(url="http://127.0.0.1:1/hook", json={"n": 1}, headers={"Webhook-Id": "mine", "X-Kind": "k"})
    for _ in range(2):
        assert transport.send(delivery, idempotency_key="key-1", timeout=1) == AttemptResult(status_code=503)
    assert [sent.headers["webhook-id"] for sent in seen] == ["key-1", "key-1"]
    assert [sent.headers["webhook-timestamp"] for sent in seen] == ["1900000000", "1900000042"]
    assert seen[0].headers["webhook-signature"] == WebhookSecrets([NEW_SECRET]).signature("key-1", 1_900_000_000, b'{"n":1}')
    assert "Webhook-Id" not in seen[0].headers  # the outbox owns the three headers
    assert seen[0].headers["X-Kind"] == "k"
    assert delivery.headers == {"Webhook-Id": "mine", "X-Kind": "k"}  # the application's object is untouched


def test_a_delivery_without_a_body_signs_the_empty_body():
    seen: list[Delivery] = []
    transport = SigningTransport(CallableTransport(lambda d, k: seen.append(d) or 200), WebhookSecrets([NEW_SECRET]),
                                 now=lambda: 1_900_000_000)
    transport.send(Delivery(url="http://127.0.0.1:1/ping", method="GET"), idempotency_key="k", timeout=1)
    assert seen[0].headers["webhook-signature"] == WebhookSecrets([NEW_SECRET]).signature("k", 1_900_000_000, b"")


# -- bad secrets: a clear error that never shows the value ---------------------------


@pytest.mark.parametrize(
    ("secrets", "complaint"),
    [
        (["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], "#1 must be 'whsec_'.*does not start with 'whsec_'"),
        ([NEW_SECRET, "whsec_not*base64!"], "#2 .*not base64"),
        (["whsec_c2hvcnQ="], "#1 .*decodes to 5 bytes"),
        ([], "at least one"),
        ([NEW_SECRET, 42], "#2 must be a 'whsec_...' string, got int"),
    ],
)
def test_a_bad_secret_is_refused_by_position_without_its_value(secrets, complaint):
    with pytest.raises((InvalidValueError, InvalidTypeError), match=complaint) as raised:
        WebhookSecrets(secrets)
    for secret in secrets:
        if isinstance(secret, str) and len(secret) > 8:
            assert secret.removeprefix("whsec_") not in str(raised.value)


def test_one_string_instead_of_a_list_is_refused():
    with pytest.raises(InvalidTypeError, match="a list of 'whsec_...' strings"):
        WebhookSecrets(NEW_SECRET)  # type: ignore[arg-type]


def test_secrets_are_never_shown_in_a_repr_and_cannot_be_pickled():
    secrets = WebhookSecrets([NEW_SECRET, OLD_SECRET])
    options = OutboxOptions(job_name="signed", sign_webhooks=True, webhook_secrets=secrets)
    transport = SigningTransport(CallableTransport(lambda d, k: 200), secrets)
    for shown in (repr(secrets), str(secrets), repr(options), repr(transport)):
        assert "bmV3" not in shown and "b2xk" not in shown and "whsec_" not in shown
    assert repr(secrets) == "WebhookSecrets(<2 hidden>)"
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(secrets)


def test_secrets_without_signing_and_a_list_of_strings_are_refused_in_the_options():
    with pytest.raises(ConfigurationError, match="has webhook secrets but does not sign"):
        OutboxOptions(job_name="unsigned", webhook_secrets=WebhookSecrets([NEW_SECRET]))
    listed = OutboxOptions(job_name="signed", sign_webhooks=True, webhook_secrets=[NEW_SECRET, OLD_SECRET])
    assert isinstance(listed.webhook_secrets, WebhookSecrets) and len(listed.webhook_secrets) == 2
    with pytest.raises(ConfigurationError, match="outbox 'signed': webhook secrets must be a list"):
        OutboxOptions(job_name="signed", sign_webhooks=True, webhook_secrets=NEW_SECRET)
    with pytest.raises(ConfigurationError, match="outbox 'signed': webhook secret #1 must be 'whsec_'") as raised:
        OutboxOptions(job_name="signed", sign_webhooks=True, webhook_secrets=["not-a-whsec-value"])
    assert "not-a-whsec-value" not in str(raised.value)
    with pytest.raises(ConfigurationError, match="sign_webhooks must be True or False"):
        OutboxOptions(job_name="signed", sign_webhooks="yes")  # type: ignore[arg-type]


# -- secrets from settings ---------------------------------------------------------


class SignedBase(DeclarativeBase):
    pass


class SignedEvent(Outbox, SignedBase):
    __tablename__ = "signed_event_outbox"
    __outbox__ = OutboxOptions(job_name="signed-events", sign_webhooks=True)

    def build_delivery(self) -> Delivery:
        return Delivery(url="http://127.0.0.1:1/signed")


@pytest.fixture
def offline_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    for name in list(os.environ):
        upper = name.upper()
        if upper.startswith("OUTBOXKIT_") and upper not in NON_SETTING_VARIABLES and not upper.startswith(NON_SETTING_PREFIXES):
            monkeypatch.delenv(name)
    engine = create_engine(NEVER_CONNECTED)
    yield engine
    engine.dispose()


def test_secrets_come_from_the_environment_comma_separated(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SIGNED_EVENTS__WEBHOOK_SECRETS", f"{NEW_SECRET}, {OLD_SECRET}")
    with OutboxKit(offline_engine, [SignedEvent], transport=CallableTransport(lambda d, k: 200)) as kit:
        secrets = kit.options(SignedEvent).webhook_secrets
        assert isinstance(secrets, WebhookSecrets) and len(secrets) == 2
        transport = kit.drainer(SignedEvent).transport
        assert isinstance(transport, SigningTransport)
        assert NEW_SECRET not in repr(kit.settings) and NEW_SECRET not in repr(kit.options(SignedEvent))


def test_an_outbox_that_signs_without_a_secret_fails_at_start_up_naming_the_variable(offline_engine):
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_OUTBOXES__SIGNED_EVENTS__WEBHOOK_SECRETS=whsec_"):
        OutboxKit(offline_engine, [SignedEvent], settings=OutboxKitSettings())


def test_secrets_for_an_outbox_that_does_not_sign_fail_at_start_up(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__WEBHOOK_SECRETS", NEW_SECRET)
    with pytest.raises(ConfigurationError, match="has webhook secrets but does not sign"):
        OutboxKit(offline_engine, [SampleEvent])


def test_a_malformed_secret_in_the_environment_is_named_by_variable_not_shown(offline_engine, monkeypatch):
    secrets = "whsec_c2VjcmV0LXRoYXQtaXMtc2hvcnQ,nope-secret-value"
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SIGNED_EVENTS__WEBHOOK_SECRETS", secrets)
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_OUTBOXES__SIGNED_EVENTS.*#2 must be 'whsec_'") as raised:
        OutboxKit(offline_engine, [SignedEvent])
    assert "nope-secret-value" not in str(raised.value) and "c2VjcmV0" not in str(raised.value)


def test_a_secret_of_the_wrong_type_in_the_json_form_is_not_repeated_in_the_error(offline_engine, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES", '{"signed_events": {"webhook_secrets": [1234567890123]}}')
    with pytest.raises(ConfigurationError, match="not shown: it is a secret") as raised:
        OutboxKit(offline_engine, [SignedEvent])
    assert "1234567890123" not in str(raised.value)


def test_a_drainer_built_directly_refuses_to_sign_without_a_secret(engine):
    options = dataclasses.replace(SampleEvent.__outbox__, sign_webhooks=True)
    with pytest.raises(ConfigurationError, match="signs its requests .* but has no secret"):
        Drainer(engine, SampleEvent, transport=CallableTransport(lambda d, k: 200), options=options)


# -- real requests at a real receiver --------------------------------------------------


def test_real_requests_verify_with_the_reference_library(engine, signed_drainer):
    with VerifyingReceiver(NEW_SECRET) as receiver:
        insert_rows(engine, receiver.url + "/hook", [{"n": n, "text": "héllo"} for n in range(5)])
        result = signed_drainer([NEW_SECRET]).drain()
        assert result.delivered == 5, result
        assert all(arrival.verified for arrival in receiver.arrivals)
    rows = read_rows(engine)
    assert {row.status for row in rows} == {"done"}
    assert sorted(arrival.headers["webhook-id"] for arrival in receiver.arrivals) == sorted(
        str(row.idempotency_key) for row in rows
    )
    assert all(arrival.headers["idempotency-key"] == arrival.headers["webhook-id"] for arrival in receiver.arrivals)


def test_during_a_rotation_receivers_on_the_old_and_the_new_secret_both_accept(engine, signed_drainer):
    with VerifyingReceiver(OLD_SECRET) as old, VerifyingReceiver(NEW_SECRET) as new:
        insert_rows(engine, old.url + "/hook", [{"n": 1}])
        insert_rows(engine, new.url + "/hook", [{"n": 2}])
        assert signed_drainer([NEW_SECRET, OLD_SECRET]).drain().delivered == 2
        assert [arrival.verified for arrival in old.arrivals + new.arrivals] == [True, True]


def test_a_receiver_on_another_secret_refuses_and_the_row_is_stuck_not_lost(engine, signed_drainer):
    with VerifyingReceiver(OLD_SECRET) as receiver:
        insert_rows(engine, receiver.url + "/hook", [{"n": 1}])
        result = signed_drainer([NEW_SECRET]).drain()
        assert result.stuck == 1
        assert [arrival.verified for arrival in receiver.arrivals] == [False]
    (row,) = read_rows(engine)
    assert row.status == "stuck" and row.last_status_code == 401
