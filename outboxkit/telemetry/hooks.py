"""Telemetry hooks: where the drain, the election and the job runner say what they did.

The kit owns one ``Telemetry`` (``kit.telemetry``) and hands it to its
drainers, its leader election and its job runner, which call its hooks at a
handful of points: a send starts and ends, an outcome is written, rows are
parked, a drain run or a busy spell of a drain loop ends, the election
changes state, a scheduled job run ends, the NOTIFY listener connects or
loses its connection, attempt-history records are dropped.

Until something is attached the hooks do nothing: each is one method call
that finds no observer and returns, so telemetry off costs nothing
measurable on the drain's hot path.  ``OutboxMetrics`` (``outboxkit.metrics``,
Prometheus) and ``OutboxTracing`` (``outboxkit.telemetry.tracing``, OpenTelemetry) are
``Observer`` subclasses that attach themselves to a kit; this module imports
neither library, so the drain does not depend on the ``metrics`` extra.

Hooks run on the drain's own threads (a send hook on the send thread, the
others on the recording thread), so an observer must be quick and
thread-safe, and it must not raise: an exception from an observer is logged
once per observer and hook, and the delivery goes on untouched.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from outboxkit.errors import ConfigurationError
from outboxkit.policy import FailureKind
from outboxkit.results import MAX_RUN_LINKS
from outboxkit.telemetry.log_events import log_fields

if TYPE_CHECKING:
    from outboxkit.model import Outbox
    from outboxkit.policy import AttemptResult
    from outboxkit.results import DrainResult, RunRecord
    from outboxkit.transports.base import Delivery

__all__ = ["Observer", "SendProbe", "Telemetry", "log_fields", "outcome_name", "status_class"]

logger = logging.getLogger(__name__)

# Decision.status -> the outcome an operator counts.
_OUTCOMES = {"done": "delivered", "pending": "retried", "stuck": "stuck"}


def outcome_name(status: str) -> str:
    """``delivered``, ``retried``, ``stuck`` (from a written status) or ``lost_claim`` as it is."""
    return _OUTCOMES.get(status, status)


def status_class(status_code: int | None) -> str:
    """``2xx``, ``4xx``, ``5xx`` (any ``Nxx``) for an HTTP status, ``none`` when the attempt got no answer."""
    if status_code is None:
        return "none"
    return f"{status_code // 100}xx"


def attempt_class(attempt: AttemptResult) -> str:
    """``status_class`` of an HTTP answer; ``ack`` for a broker's acknowledgement, ``rejected`` for its refusal."""
    if attempt.acknowledgement is not None:
        return "ack"
    if attempt.failure is FailureKind.REJECTED:
        return "rejected"
    return status_class(attempt.status_code)


class Observer:
    """What telemetry can watch.  Every method is a no-op here; subclasses override what they need.

    ``sending`` may return a different ``Delivery`` (tracing adds the
    ``traceparent`` header) and a value handed back to ``sent`` for the same
    send (a span, a start time).
    """

    def sending(self, job_name: str, row: Outbox, delivery: Delivery, key: str) -> tuple[Delivery, Any]:
        return delivery, None

    def sent(
        self, job_name: str, row: Outbox, state: Any, attempt: AttemptResult, seconds: float, *, outcome: str = ""
    ) -> None:
        """A send returned (``seconds`` of wall time).

        ``outcome`` is what the outcome rules make of it (``delivered``,
        ``retried``, ``stuck``) before it is written: a row reset meanwhile
        is recorded as ``lost_claim`` instead (see ``recorded``).  An
        override that does not take ``outcome`` is called without it.
        """

    def link(self, state: Any) -> Any:
        """What the drain run that made this send keeps of it (``state`` from ``sending``), or None.

        The run's ``DrainResult.telemetry_links[id(observer)]`` holds them
        (up to ``MAX_RUN_LINKS``) when ``drain_finished`` is called: tracing
        keeps each attempt span's context and links the run's span to them.
        """
        return None

    def recorded(self, job_name: str, row: Outbox, attempt: AttemptResult, outcome: str, now: datetime) -> None:
        """An outcome was decided: ``delivered``, ``retried``, ``stuck`` or ``lost_claim`` (not written)."""

    def parked(self, job_name: str, rows: Sequence[Outbox]) -> None:
        """Rows whose last attempt recorded no outcome and that had no attempts left were parked as stuck."""

    def drain_finished(self, job_name: str, result: DrainResult, *, kind: str, seconds: float) -> None:
        """A drain call ended (``kind="call"``) or a busy spell of a drain loop did (``kind="loop"``)."""

    def leadership(self, identity: str, state: str) -> None:
        """The election entered ``state`` (``standby``, ``promoting``, ``leader``, ``unelected``, ``stopped``)."""

    def job_finished(self, job_id: str, job_name: str, record: RunRecord, seconds: float) -> None:
        """A scheduled job run ended: ``record.outcome`` is ``ok``, ``error`` or ``skipped``."""

    def listener_changed(self, *, connected: bool, reconnected: bool) -> None:
        """The NOTIFY listener connected (``reconnected``: not for the first time) or lost its connection."""

    def attempts_dropped(self, job_name: str, records: int) -> None:
        """``records`` attempt-history records could not be written and were dropped (delivery went on)."""


class SendProbe:
    """One send in progress: ``delivery`` is what to send; call ``sent(attempt)`` when it returns."""

    __slots__ = ("_job_name", "_row", "_states", "_started", "_telemetry", "delivery")

    def __init__(self, telemetry: Telemetry, job_name: str, row: Outbox, delivery: Delivery) -> None:
        self._telemetry = telemetry
        self._job_name = job_name
        self._row = row
        self.delivery = delivery
        self._states: list[tuple[Observer, Any]] = []
        self._started = time.perf_counter()

    def sent(
        self, attempt: AttemptResult, *, outcome: str = "", run_links: dict[int, list[Any]] | None = None
    ) -> None:
        """The send returned; ``run_links`` (the drain run's ``telemetry_links``) gathers each observer's ``link``."""
        seconds = time.perf_counter() - self._started
        for observer, state in reversed(self._states):  # the reverse of sending: a span opened last closes first
            try:
                if self._telemetry._takes_outcome(observer):
                    observer.sent(self._job_name, self._row, state, attempt, seconds, outcome=outcome)
                else:  # an observer written before sent() took the outcome
                    observer.sent(self._job_name, self._row, state, attempt, seconds)
                link = observer.link(state) if run_links is not None else None
            except Exception:
                self._telemetry._failed(observer, "sent")
                continue
            if link is not None and run_links is not None:
                kept = run_links.setdefault(id(observer), [])  # send threads append at once: both atomic
                if len(kept) < MAX_RUN_LINKS:
                    kept.append(link)


class _NoProbe:
    """The probe of a send nobody watches."""

    __slots__ = ("delivery",)

    def __init__(self, delivery: Delivery) -> None:
        self.delivery = delivery

    def sent(
        self, attempt: AttemptResult, *, outcome: str = "", run_links: dict[int, list[Any]] | None = None
    ) -> None:
        return None


class Telemetry:
    """The hooks one kit's components call; no-ops until an ``Observer`` is attached.  Thread-safe."""

    def __init__(self) -> None:
        self._observers: tuple[Observer, ...] = ()
        self._with_outcome: frozenset[int] = frozenset()  # ids of observers whose sent() takes outcome=
        self._lock = threading.Lock()
        self._reported: set[tuple[int, str]] = set()

    @property
    def observers(self) -> tuple[Observer, ...]:
        return self._observers

    @property
    def enabled(self) -> bool:
        return bool(self._observers)

    def attach(self, observer: Observer) -> None:
        """Start calling ``observer`` (idempotent)."""
        if not isinstance(observer, Observer):
            raise ConfigurationError(f"{observer!r} is not an outboxkit.telemetry.hooks.Observer; subclass it")
        with self._lock:
            if observer not in self._observers:
                self._observers = (*self._observers, observer)
                if _takes_outcome(observer):
                    self._with_outcome = self._with_outcome | {id(observer)}

    def detach(self, observer: Observer) -> None:
        """Stop calling ``observer`` (a no-op if it is not attached)."""
        with self._lock:
            self._observers = tuple(attached for attached in self._observers if attached is not observer)

    # -- hooks ---------------------------------------------------------------

    def sending(self, job_name: str, row: Outbox, delivery: Delivery, key: str) -> SendProbe | _NoProbe:
        """Called on the send thread just before ``transport.send``; send ``probe.delivery``."""
        observers = self._observers
        if not observers:
            return _NoProbe(delivery)
        probe = SendProbe(self, job_name, row, delivery)
        for observer in observers:
            try:
                probe.delivery, state = observer.sending(job_name, row, probe.delivery, key)
            except Exception:
                self._failed(observer, "sending")
                continue
            probe._states.append((observer, state))
        return probe

    def recorded(self, job_name: str, row: Outbox, attempt: AttemptResult, status: str, now: datetime) -> None:
        """``status`` is the written ``Decision.status`` (``done``, ``pending``, ``stuck``) or ``lost_claim``."""
        if not self._observers:
            return
        outcome = outcome_name(status)
        for observer in self._observers:  # once per row: a plain loop, not _each
            try:
                observer.recorded(job_name, row, attempt, outcome, now)
            except Exception:
                self._failed(observer, "recorded")

    def parked(self, job_name: str, rows: Sequence[Outbox]) -> None:
        if self._observers:
            self._each("parked", job_name, rows)

    def drain_finished(self, job_name: str, result: DrainResult, *, loop: bool) -> None:
        if self._observers:
            seconds = max(0.0, time.monotonic() - result.started)
            self._each("drain_finished", job_name, result, kind="loop" if loop else "call", seconds=seconds)

    def leadership(self, identity: str, state: str) -> None:
        if self._observers:
            self._each("leadership", identity, state)

    def job_finished(self, job_id: str, job_name: str, record: RunRecord, seconds: float) -> None:
        if self._observers:
            self._each("job_finished", job_id, job_name, record, seconds)

    def listener_changed(self, *, connected: bool, reconnected: bool = False) -> None:
        if self._observers:
            self._each("listener_changed", connected=connected, reconnected=reconnected)

    def attempts_dropped(self, job_name: str, records: int) -> None:
        if self._observers and records:
            self._each("attempts_dropped", job_name, records)

    # -- helpers -------------------------------------------------------------

    def _takes_outcome(self, observer: Observer) -> bool:
        return id(observer) in self._with_outcome

    def _each(self, hook: str, *args: Any, **kwargs: Any) -> None:
        for observer in self._observers:
            try:
                getattr(observer, hook)(*args, **kwargs)
            except Exception:
                self._failed(observer, hook)

    def _failed(self, observer: Observer, hook: str) -> None:
        key = (id(observer), hook)
        if key in self._reported:
            return
        self._reported.add(key)  # once: a broken observer must not flood the log from the hot path
        logger.exception("telemetry observer %s failed in %s; the delivery is not affected", type(observer).__name__, hook,
                         extra=log_fields("telemetry.observer_failed", observer=type(observer).__name__, hook=hook))


def _takes_outcome(observer: Observer) -> bool:
    """Whether ``observer.sent`` accepts ``outcome=`` (one written before it existed does not)."""
    try:
        return "outcome" in inspect.signature(observer.sent).parameters
    except Exception:  # an observer whose attributes fail: its hooks fail too, and are reported when called
        return False
