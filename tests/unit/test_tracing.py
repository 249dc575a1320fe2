"""The trace context is captured only inside a valid span (an SDK provider of the test's own).

Spans and headers around a real drain are in tests/integration/test_tracing.py.
"""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outboxkit.telemetry.tracing import current_trace_context


@pytest.fixture
def spans():
    """(provider, exporter): every span the provider ends lands in the exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def test_the_trace_context_is_captured_only_inside_a_valid_span(spans):
    provider, _ = spans
    assert current_trace_context() is None
    with provider.get_tracer("the-application").start_as_current_span("work"):
        captured = json.loads(current_trace_context())
    assert set(captured) >= {"traceparent"}
