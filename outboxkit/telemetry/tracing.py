"""OpenTelemetry tracing for one kit: a span per delivery attempt and per drain run.

::

    from outboxkit.telemetry.tracing import OutboxTracing, OutboxTracingMixin

    class CreditGrant(OutboxTracingMixin, Outbox, Base):   # optional: link deliveries to the enqueuing trace
        ...

    OutboxTracing(kit)          # the global TracerProvider, or tracer_provider=...

What it records:

* ``deliver <job_name>``, a CLIENT span per attempt, around the transport's
  send, with ``outboxkit.outbox``, ``outboxkit.row_id``,
  ``outboxkit.idempotency_key``, ``outboxkit.attempt``, the method and URL
  (``url.full`` redacted as the OpenTelemetry conventions ask: a user and
  password in the URL become ``REDACTED:REDACTED``, and the values of the
  query parameters named in ``redacted_query_parameters`` become
  ``REDACTED``), ``http.response.status_code`` (or ``error.type`` for an attempt without
  an answer) and ``outboxkit.outcome`` (``delivered``, ``retried`` or ``stuck``, as the
  outcome rules decide it).  A failed attempt has status ERROR.  Its trace context is
  injected into the request headers with the global propagator (W3C
  ``traceparent``, plus ``tracestate``/``baggage`` when present), unless the
  application's ``build_delivery`` set that header itself, and the span is
  current during the send, so an instrumented transport nests its own span
  under it.
* ``drain <job_name>``, an INTERNAL span per drain call or busy spell of a
  drain loop that did something (claimed, parked, failed), with its counts
  and a link to each of its attempts' spans (the first ``MAX_RUN_LINKS``,
  128).  It is recorded when the run ends (start and end times as they were).

Linking a delivery to the business transaction: an outbox that adds
``OutboxTracingMixin`` gets a nullable ``trace_context`` text column whose
insert default is the trace context active when the row is flushed (inside
the application's span, the one that wrote the business change).  Each
delivery attempt of that row is then a *child* of that span, so the
enqueuing request, every attempt and the receiver's own spans form one
trace.  Tables without the column are untouched; adding it is one
``ALTER TABLE ... ADD COLUMN trace_context text`` (nullable, no rewrite; see
docs/operations.md).

Needs the OpenTelemetry API (the ``metrics`` extra: ``pip install
'outboxkit[metrics]'``); this module is the only place outboxkit imports it,
and it does so on use, so the mixin works (and stores nothing) without it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from sqlalchemy import Text
from sqlalchemy.orm import Mapped, mapped_column

from outboxkit.errors import ConfigurationError
from outboxkit.telemetry.hooks import Observer
from outboxkit.transports.base import Delivery
from outboxkit.version import VERSION

if TYPE_CHECKING:
    from outboxkit.model import Outbox
    from outboxkit.policy import AttemptResult
    from outboxkit.results import DrainResult
    from outboxkit.telemetry.hooks import Telemetry

__all__ = ["OutboxTracing", "OutboxTracingMixin", "current_trace_context"]

INSTALL_HINT = "pip install 'outboxkit[metrics]'"
TRACER_NAME = "outboxkit"
REDACTED = "REDACTED"
# The query parameters that the OpenTelemetry HTTP conventions name as carrying credentials (pre-signed URLs).
DEFAULT_REDACTED_QUERY_PARAMETERS = ("AWSAccessKeyId", "Signature", "sig", "X-Goog-Signature")


def redact_url(url: str, query_parameters: frozenset[str]) -> str:
    """``url`` fit for a span: its user and password replaced, and the values of ``query_parameters`` (exact names).

    A URL that does not parse is replaced whole: a span must not carry what could not be checked.
    """
    try:
        parts = urlsplit(url)
        userinfo = parts.username is not None or parts.password is not None
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if userinfo:
        netloc = f"{REDACTED}:{REDACTED}@" + (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    query = parts.query
    if query and query_parameters:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(name in query_parameters for name, _ in pairs):
            query = urlencode([(name, REDACTED if name in query_parameters else value) for name, value in pairs])
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit(SplitResult(parts.scheme, netloc, parts.path, query, parts.fragment))


def _opentelemetry() -> Any:
    """The one place the OpenTelemetry API is imported: (context, propagate, trace), or None."""
    try:
        from opentelemetry import context, propagate, trace
    except ImportError:
        return None
    return context, propagate, trace


def _is_default_propagator(textmap: Any) -> bool:
    """Whether ``textmap`` is the API's default: W3C trace context, then W3C baggage."""
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parts = getattr(textmap, "_propagators", None) if type(textmap) is CompositePropagator else None
    return parts is not None and [type(part) for part in parts] == [TraceContextTextMapPropagator, W3CBaggagePropagator]


def current_trace_context() -> str | None:
    """The active span's trace context as JSON (what the propagator writes), or None without a valid span.

    The insert default of ``OutboxTracingMixin.trace_context``; call it
    yourself for a Core ``insert()`` that sets its columns explicitly.
    """
    api = _opentelemetry()
    if api is None:
        return None
    _, propagate, trace = api
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier, separators=(",", ":")) if carrier else None


class OutboxTracingMixin:
    """Adds ``trace_context``: the enqueuing span's trace context, so deliveries join its trace.

    Put it before ``Outbox`` in the bases.  The column is nullable text, set
    at insert from the span active when the row is flushed; rows inserted
    outside any span, and rows from before the column existed, keep NULL and
    get deliveries in traces of their own.
    """

    trace_context: Mapped[str | None] = mapped_column(Text, default=current_trace_context)


class OutboxTracing(Observer):
    """Records delivery and drain spans for the drains of ``target`` (a kit, or one ``Drainer``).

    ``tracer_provider`` defaults to the global one (whatever the
    application configured with the OpenTelemetry SDK).  ``redacted_query_parameters``
    names the query parameters whose values never reach a span (exact, case-sensitive
    names; the default is the OpenTelemetry conventions' list); the URL's user and
    password never do.  ``close()`` stops it.
    """

    def __init__(
        self,
        target: Any,
        *,
        tracer_provider: Any = None,
        redacted_query_parameters: Iterable[str] = DEFAULT_REDACTED_QUERY_PARAMETERS,
    ) -> None:
        if isinstance(redacted_query_parameters, str):
            raise ConfigurationError("redacted_query_parameters takes a list of parameter names, not one string")
        self._redacted = frozenset(redacted_query_parameters)
        api = _opentelemetry()
        if api is None:
            raise ConfigurationError(f"outboxkit.telemetry.tracing needs the OpenTelemetry API: {INSTALL_HINT}")
        self._context, self._propagate, self._trace = api
        self.tracer = self._trace.get_tracer(TRACER_NAME, VERSION, tracer_provider=tracer_provider)
        self._client = self._trace.SpanKind.CLIENT
        self._error = self._trace.StatusCode.ERROR
        self._textmap: Any = None  # the global propagator last seen, and whether it is the default
        self._default_textmap = False
        self._telemetry: Telemetry = target.telemetry
        self._telemetry.attach(self)

    def close(self) -> None:
        """Stop recording spans (sends already under way finish theirs)."""
        self._telemetry.detach(self)

    # -- hooks (outboxkit.telemetry.hooks.Observer) ----------------------------------

    def sending(self, job_name: str, row: Outbox, delivery: Delivery, key: str) -> tuple[Delivery, Any]:
        parent = self._parent(row)
        attributes = {
            "outboxkit.outbox": job_name,
            "outboxkit.row_id": row.id,
            "outboxkit.idempotency_key": key,
            "outboxkit.attempt": row.attempts,
            "http.request.method": delivery.method,
            "url.full": redact_url(delivery.url, self._redacted),
        }
        span = self.tracer.start_span(f"deliver {job_name}", context=parent, kind=self._client, attributes=attributes)
        active = self._trace.set_span_in_context(span, parent)
        carrier = self._carrier(span, active, inherited=parent is not None)
        if delivery.headers:  # the application's own trace headers win
            present = {name.lower() for name in delivery.headers}
            carrier = {name: value for name, value in carrier.items() if name.lower() not in present}
        if carrier:
            delivery = delivery.with_headers(carrier)
        return delivery, (span, self._context.attach(active))

    def sent(
        self, job_name: str, row: Outbox, state: Any, attempt: AttemptResult, seconds: float, *, outcome: str = ""
    ) -> None:
        span, token = state
        try:
            if outcome:
                span.set_attribute("outboxkit.outcome", outcome)
            if attempt.status_code is not None:
                span.set_attribute("http.response.status_code", attempt.status_code)
            if attempt.failure is not None:
                span.set_attribute("error.type", attempt.failure.value)
            if not attempt.succeeded:
                description = attempt.error or (f"HTTP {attempt.status_code}" if attempt.status_code else "failed")
                span.set_status(self._trace.Status(self._error, description[:200]))
        finally:
            self._context.detach(token)
            span.end()

    def link(self, state: Any) -> Any:
        span, _ = state
        return span.get_span_context()  # the drain run's span links to each of its attempts

    def drain_finished(self, job_name: str, result: DrainResult, *, kind: str, seconds: float) -> None:
        failed = bool(result.error or result.errors)
        if not (result.eventful or failed):
            return  # an empty safety-net drain every minute is not worth a span
        end = time.time_ns()
        attributes: dict[str, str | int] = {"outboxkit.outbox": job_name, "outboxkit.drain.kind": kind}
        attributes.update({f"outboxkit.drain.{name}": value for name, value in result.as_counts().items()})
        links = [self._trace.Link(context) for context in result.telemetry_links.get(id(self), ())]
        span = self.tracer.start_span(
            f"drain {job_name}", attributes=attributes, links=links, start_time=end - int(seconds * 1e9)
        )
        if failed:
            span.set_status(self._trace.Status(self._error, (result.error or result.errors[-1])[:200]))
        span.end(end_time=end)

    # -- helpers -----------------------------------------------------------------

    def _carrier(self, span: Any, active: Any, *, inherited: bool) -> dict[str, str]:
        """The headers the global propagator would write for ``active``.

        With the API's default propagator and a context that carries no
        baggage (no stored parent), that is exactly ``traceparent`` (and
        ``tracestate`` when set), written here directly: it saves a fifth of
        the span's cost on the send path.  Anything else goes through the
        propagator.
        """
        textmap = self._propagate.get_global_textmap()
        if textmap is not self._textmap:
            self._textmap, self._default_textmap = textmap, _is_default_propagator(textmap)
        if inherited or not self._default_textmap:
            carrier: dict[str, str] = {}
            self._propagate.inject(carrier, context=active)
            return carrier
        context = span.get_span_context()
        carrier = {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"}
        if context.trace_state:
            carrier["tracestate"] = context.trace_state.to_header()
        return carrier

    def _parent(self, row: Outbox) -> Any:
        stored = getattr(row, "trace_context", None)
        if not stored:
            return None
        try:
            carrier = json.loads(stored)
        except ValueError:
            return None  # not written by current_trace_context: deliver in a trace of its own
        if not isinstance(carrier, dict):
            return None
        return self._propagate.extract({str(name): str(value) for name, value in carrier.items()})
