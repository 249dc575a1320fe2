"""The drainer process of the drain benchmark.

It builds an ``OutboxKit`` over the example ``WebhookOutbox``, opens its
connections, prints ``ready`` and waits for a ``go`` line on stdin, so the
benchmark can snapshot this process's CPU time (and the PostgreSQL backends
serving it) with start-up already paid.  Then it runs ``OutboxKit.drain`` in a
loop until ``--expected`` rows are delivered (or ``--deadline`` seconds pass)
and prints one JSON line: elapsed seconds from the first claim to the last
recorded ``done``, the drain counts and its peak RSS (``peak_rss_mb``).  ``--telemetry``
attaches ``OutboxMetrics`` and ``OutboxTracing`` (an SDK tracer provider with
a batch processor, its spans counted and dropped; ``--trace-ratio`` samples
that share of the traces, as ``ParentBased(TraceIdRatioBased)``) to measure
what they cost; ``--telemetry-parts metrics`` or ``tracing`` attaches one of
them alone, to tell their costs apart.  It then waits for a
``exit`` line, so its CPU times can be read before it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from exampleapp.models import WebhookOutbox
from sqlalchemy import create_engine, text

from outboxkit import DrainResult, OutboxKit, OutboxKitSettings

if TYPE_CHECKING:  # imported in telemetry_on only, so a run without --telemetry does not load OpenTelemetry
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider


class CountedSpans(Protocol):
    """What telemetry_on returns: the spans exported so far, and the provider to flush before reading them."""

    exported: int
    provider: TracerProvider


def telemetry_on(
    kit: OutboxKit, *, trace_ratio: float, parts: frozenset[str] = frozenset({"metrics", "tracing"})
) -> CountedSpans:
    """Attach metrics and tracing (``parts``) as an application would; returns the exporter that counts the spans."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    from outboxkit.metrics.prometheus import OutboxMetrics
    from outboxkit.telemetry.tracing import OutboxTracing

    class CountingExporter(SpanExporter):
        """Counts the spans and drops them: the process's own cost, without a collector's network."""

        def __init__(self, provider: TracerProvider) -> None:
            self.exported = 0
            self.provider = provider

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            self.exported += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ALWAYS_ON if trace_ratio >= 1 else ParentBased(TraceIdRatioBased(trace_ratio)))
    exporter = CountingExporter(provider)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    if "metrics" in parts:
        OutboxMetrics(kit)  # its default refresh interval: the row gauges are read every 15 s
    if "tracing" in parts:
        OutboxTracing(kit, tracer_provider=provider)
    return exporter


def peak_rss_mb() -> float:
    """This process's own peak RSS, in MB: ``VmHWM`` from ``/proc/self/status``.

    Not ``ru_maxrss``: on Linux it keeps the high-water mark of the memory
    the process had before its ``exec``, which for a child of ``subprocess``
    is its parent's (the benchmark process, about 85 MB), so it reported the
    benchmark's RSS whenever that was the larger.  ``ru_maxrss`` is the
    fallback where there is no ``/proc`` (in kB on Linux, bytes on macOS).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="drain the benchmark outbox until every row is delivered")
    parser.add_argument("--database-url", required=True, help="SQLAlchemy URL (postgresql+psycopg://...)")
    parser.add_argument("--expected", type=int, required=True, help="stop once this many rows are delivered")
    parser.add_argument("--concurrency", type=int, default=None, help="override the outbox's send concurrency")
    parser.add_argument("--deadline", type=float, default=300.0, help="give up after this many seconds")
    parser.add_argument("--telemetry", action="store_true", help="with Prometheus metrics and OpenTelemetry spans on")
    parser.add_argument("--trace-ratio", type=float, default=1.0, help="with --telemetry: the share of traces sampled")
    parser.add_argument("--telemetry-parts", default="metrics,tracing",
                        help="with --telemetry: what to attach, a comma-separated subset of metrics,tracing")
    arguments = parser.parse_args(argv)
    parts = frozenset(part.strip() for part in arguments.telemetry_parts.split(",") if part.strip())
    if not parts or not parts <= {"metrics", "tracing"}:
        parser.error(f"--telemetry-parts must be a subset of metrics,tracing, got {arguments.telemetry_parts!r}")
    if not 0.0 <= arguments.trace_ratio <= 1.0:
        parser.error(f"--trace-ratio must be between 0 and 1, got {arguments.trace_ratio}")

    # OUTBOXKIT_BENCH_NO_AUTO_PREPARE=1: the engine docs/operations.md asks for behind a transaction-mode
    # pooler (psycopg prepares nothing); OUTBOXKIT_PREPARED_STATEMENTS is read by the settings as usual.
    no_auto_prepare = os.environ.get("OUTBOXKIT_BENCH_NO_AUTO_PREPARE") == "1"
    connect_args = {"prepare_threshold": None} if no_auto_prepare else {}
    engine = create_engine(arguments.database_url, pool_size=5, max_overflow=5, connect_args=connect_args)
    overrides = {"concurrency": arguments.concurrency} if arguments.concurrency else {}
    settings = OutboxKitSettings(outboxes={"webhooks": overrides} if overrides else {})
    kit = OutboxKit(engine, [WebhookOutbox], settings=settings)
    with engine.connect() as connection:  # open the first pooled connection before the clock starts
        connection.execute(text("SELECT 1"))
    kit.drainer(WebhookOutbox)
    spans = telemetry_on(kit, trace_ratio=arguments.trace_ratio, parts=parts) if arguments.telemetry else None
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1

    total = DrainResult(job_name=kit.options(WebhookOutbox).job_name)
    started = time.monotonic()
    while total.delivered < arguments.expected and time.monotonic() - started < arguments.deadline:
        result = kit.drain(WebhookOutbox)
        total.add(result)
        if not result.claimed:  # rows left are in backoff or held by a lease: do not spin on the database
            time.sleep(0.05)
    elapsed = time.monotonic() - started
    report = {
        "elapsed_s": elapsed,
        "counts": total.as_counts(),
        "batches": total.batches,
        "errors": total.errors[:5],
        "error": total.error,
        "peak_rss_mb": peak_rss_mb(),
    }
    if spans is not None:
        spans.provider.force_flush()
        report["spans"] = spans.exported
    print(json.dumps(report), flush=True)
    sys.stdin.readline()  # "exit": the benchmark has read our CPU times and our backends' (still connected)
    kit.close()
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
