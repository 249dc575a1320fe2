"""OpenTelemetry tracing (outboxkit.telemetry.tracing): spans in an in-memory exporter, headers at a real receiver.

Real PostgreSQL and the real receiver on 127.0.0.1; the spans come from the
OpenTelemetry SDK's in-memory exporter on a provider of the test's own (the
global provider is left alone).
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

import pytest
from opentelemetry import propagate, trace
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sqlalchemy import Text, insert, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outboxkit import Delivery, Outbox, OutboxKit, OutboxKitSettings, OutboxOptions
from outboxkit.errors import ConfigurationError
from outboxkit.telemetry.tracing import OutboxTracing, OutboxTracingMixin, current_trace_context
from tests.support.models import SampleEvent
from tests.support.receiver import Reply
from tests.unit.test_tracing import spans  # noqa: F401  (fixture)

QUIET = OutboxKitSettings(drain_interval_seconds=3600, listen_enabled=False)


class TracingBase(DeclarativeBase):
    pass


class TracedEvent(OutboxTracingMixin, Outbox, TracingBase):
    __tablename__ = "traced_event_outbox"
    __outbox__ = OutboxOptions(job_name="traced-events", backoff=(3600,))

    target_url: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)

    def build_delivery(self) -> Delivery:
        return Delivery(url=self.target_url, json=self.payload, headers=self.payload.get("headers", {}))


@pytest.fixture
def kit(engine):
    TracingBase.metadata.create_all(engine)
    kit = OutboxKit(engine, [TracedEvent, SampleEvent], settings=QUIET)
    yield kit
    kit.close()


def header(request, name: str) -> str | None:
    return next((value for key, value in request.headers.items() if key.lower() == name), None)


def named(exporter: InMemorySpanExporter, name: str) -> list:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_a_row_enqueued_in_a_span_is_delivered_in_its_trace_with_the_traceparent_at_the_receiver(kit, engine, receiver, spans):
    provider, exporter = spans
    with provider.get_tracer("the-application").start_as_current_span("grant credits") as business:
        with Session(engine) as session, session.begin():
            session.add(TracedEvent(target_url=receiver.url + "/grants", payload={"amount": 5}))
    with Session(engine) as session:
        stored = session.scalars(select(TracedEvent.trace_context)).one()
    assert json.loads(stored)["traceparent"].split("-")[1] == format(business.get_span_context().trace_id, "032x")

    OutboxTracing(kit, tracer_provider=provider)
    assert kit.drain(TracedEvent).delivered == 1

    [request] = receiver.requests
    [delivery] = named(exporter, "deliver traced-events")
    business_context, delivery_context = business.get_span_context(), delivery.get_span_context()
    assert delivery_context.trace_id == business_context.trace_id
    assert delivery.parent.span_id == business_context.span_id
    version, trace_id, parent_id, flags = header(request, "traceparent").split("-")
    assert (version, trace_id, parent_id) == ("00", f"{delivery_context.trace_id:032x}", f"{delivery_context.span_id:016x}")
    assert int(flags, 16) & 0x01  # sampled
    assert delivery.kind is trace.SpanKind.CLIENT
    assert delivery.attributes["outboxkit.outbox"] == "traced-events"
    assert delivery.attributes["outboxkit.idempotency_key"] == request.key
    assert delivery.attributes["outboxkit.attempt"] == 1
    assert delivery.attributes["http.response.status_code"] == 200
    assert delivery.attributes["outboxkit.row_id"] > 0
    assert delivery.status.is_ok
    [drain] = named(exporter, "drain traced-events")
    assert drain.attributes["outboxkit.drain.delivered"] == 1
    assert drain.attributes["outboxkit.drain.kind"] == "call"
    assert drain.start_time <= delivery.start_time and delivery.end_time <= drain.end_time


def test_a_row_without_a_stored_context_gets_a_trace_of_its_own_and_failures_are_errors(kit, engine, receiver, spans):
    provider, exporter = spans
    receiver.respond = lambda request: Reply(status=503)
    with socket.socket() as probe:  # a port nobody listens on: a refused connection
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    with engine.begin() as connection:  # no span is active: nothing to store
        connection.execute(
            insert(SampleEvent),
            [
                {"target_url": receiver.url + "/events", "payload": {"n": 1}},
                {"target_url": f"http://127.0.0.1:{closed_port}/events", "payload": {"n": 2}},
            ],
        )
    OutboxTracing(kit, tracer_provider=provider)
    result = kit.drain(SampleEvent)
    assert result.retried == 2

    deliveries = {span.attributes["url.full"]: span for span in named(exporter, "deliver sample-events")}
    answered, refused = deliveries[receiver.url + "/events"], deliveries[f"http://127.0.0.1:{closed_port}/events"]
    assert answered.parent is None and refused.parent is None
    assert answered.attributes["http.response.status_code"] == 503
    assert answered.status.status_code is trace.StatusCode.ERROR
    assert refused.attributes["error.type"] == "connection"
    assert "http.response.status_code" not in refused.attributes
    [request] = receiver.requests
    written: dict[str, str] = {}  # what the W3C propagator itself writes for that span
    TraceContextTextMapPropagator().inject(
        written, context=trace.set_span_in_context(NonRecordingSpan(answered.get_span_context()))
    )
    assert header(request, "traceparent") == written["traceparent"]


def test_a_propagator_the_application_set_writes_the_headers(kit, engine, receiver, spans):
    provider, exporter = spans
    with engine.begin() as connection:
        connection.execute(insert(SampleEvent), [{"target_url": receiver.url + "/events", "payload": {"n": 1}}])
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator(), _SpanIdHeader()]))
    try:
        OutboxTracing(kit, tracer_provider=provider)
        kit.drain(SampleEvent)
    finally:
        propagate.set_global_textmap(previous)
    [request] = receiver.requests
    [delivery] = named(exporter, "deliver sample-events")
    assert header(request, "traceparent").split("-")[2] == f"{delivery.get_span_context().span_id:016x}"
    assert header(request, "x-span-id") == f"{delivery.get_span_context().span_id:016x}"


class _SpanIdHeader(TextMapPropagator):
    """A propagator of the application's own: the span id in ``X-Span-Id``."""

    def extract(self, carrier, context=None, getter=None):
        return context

    def inject(self, carrier, context=None, setter=None):
        carrier["X-Span-Id"] = f"{trace.get_current_span(context).get_span_context().span_id:016x}"

    @property
    def fields(self):
        return {"X-Span-Id"}


def test_a_traceparent_set_by_build_delivery_is_sent_as_it_is(kit, engine, receiver, spans):
    provider, _ = spans
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with Session(engine) as session, session.begin():
        session.add(TracedEvent(target_url=receiver.url + "/grants", payload={"headers": {"traceparent": own}}))
    OutboxTracing(kit, tracer_provider=provider)
    kit.drain(TracedEvent)
    [request] = receiver.requests
    assert header(request, "traceparent") == own


def test_closed_tracing_records_nothing_and_sends_no_traceparent(kit, engine, receiver, spans):
    provider, exporter = spans
    OutboxTracing(kit, tracer_provider=provider).close()
    with Session(engine) as session, session.begin():
        session.add(TracedEvent(target_url=receiver.url + "/grants", payload={}))
    kit.drain(TracedEvent)
    [request] = receiver.requests
    assert header(request, "traceparent") is None
    assert exporter.get_finished_spans() == ()


def test_without_the_opentelemetry_api_tracing_says_how_to_install_it_and_nothing_is_captured(kit, monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # makes the import fail
    with pytest.raises(ConfigurationError, match="pip install 'outboxkit\\[metrics\\]'"):
        OutboxTracing(kit)
    assert current_trace_context() is None
    assert not kit.telemetry.enabled


def test_url_full_never_carries_the_urls_credentials_or_signed_query_values(kit, engine, receiver, spans):
    provider, exporter = spans
    secret_url = receiver.url.replace("http://", "http://alice:s3cret@") + "/events?sig=SECRETSIG&page=2&token=t1"
    with engine.begin() as connection:
        connection.execute(insert(SampleEvent), [{"target_url": secret_url, "payload": {"n": 1}}])
    OutboxTracing(kit, tracer_provider=provider, redacted_query_parameters=["sig", "token"])
    assert kit.drain(SampleEvent).delivered == 1

    [span] = named(exporter, "deliver sample-events")
    recorded = span.attributes["url.full"]
    assert recorded == receiver.url.replace("http://", "http://REDACTED:REDACTED@") + "/events?sig=REDACTED&page=2&token=REDACTED"
    assert "s3cret" not in str(dict(span.attributes)) and "SECRETSIG" not in str(dict(span.attributes))
    [request] = receiver.requests  # the receiver still got the real URL
    assert "sig=SECRETSIG" in request.path


def test_the_default_redaction_covers_the_conventions_presigned_parameters(kit, engine, receiver, spans):
    provider, exporter = spans
    url = receiver.url + "/events?X-Goog-Signature=abc&AWSAccessKeyId=AKIA&Signature=xyz&sig=s&keep=1"
    with engine.begin() as connection:
        connection.execute(insert(SampleEvent), [{"target_url": url, "payload": {"n": 1}}])
    OutboxTracing(kit, tracer_provider=provider)
    kit.drain(SampleEvent)
    [span] = named(exporter, "deliver sample-events")
    assert span.attributes["url.full"] == (
        receiver.url + "/events?X-Goog-Signature=REDACTED&AWSAccessKeyId=REDACTED&Signature=REDACTED&sig=REDACTED&keep=1"
    )


def test_redacted_query_parameters_given_as_one_string_is_refused(kit):
    with pytest.raises(ConfigurationError, match="list of parameter names"):
        OutboxTracing(kit, redacted_query_parameters="sig")


def test_each_attempt_span_carries_the_outcome_the_rules_decide(kit, engine, receiver, spans):
    provider, exporter = spans
    answers = {"/ok": 200, "/later": 503, "/rejected": 422}
    receiver.respond = lambda request: Reply(status=answers[request.path])
    with engine.begin() as connection:
        connection.execute(
            insert(SampleEvent), [{"target_url": receiver.url + path, "payload": {"path": path}} for path in answers]
        )
    OutboxTracing(kit, tracer_provider=provider)
    result = kit.drain(SampleEvent)
    assert (result.delivered, result.retried, result.stuck) == (1, 1, 1)

    outcomes = {
        span.attributes["url.full"].removeprefix(receiver.url): span.attributes["outboxkit.outcome"]
        for span in named(exporter, "deliver sample-events")
    }
    assert outcomes == {"/ok": "delivered", "/later": "retried", "/rejected": "stuck"}


def test_an_observer_whose_sent_takes_no_outcome_is_still_called(kit, engine, receiver):
    from outboxkit.telemetry.hooks import Observer

    class Counting(Observer):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def sent(self, job_name, row, state, attempt, seconds):  # the signature before outcome= existed
            self.seconds.append(seconds)

    counting = Counting()
    kit.telemetry.attach(counting)
    with engine.begin() as connection:
        connection.execute(insert(SampleEvent), [{"target_url": receiver.url + "/events", "payload": {"n": 1}}])
    assert kit.drain(SampleEvent).delivered == 1
    assert len(counting.seconds) == 1


def test_a_drain_runs_span_links_to_each_of_its_attempt_spans(kit, engine, receiver, spans):
    provider, exporter = spans
    with engine.begin() as connection:
        connection.execute(
            insert(SampleEvent), [{"target_url": receiver.url + "/events", "payload": {"n": n}} for n in range(3)]
        )
    OutboxTracing(kit, tracer_provider=provider)
    assert kit.drain(SampleEvent).delivered == 3

    attempts = {span.context.span_id for span in named(exporter, "deliver sample-events")}
    [drain] = named(exporter, "drain sample-events")
    assert len(attempts) == 3
    assert {link.context.span_id for link in drain.links} == attempts
