"""Testing an application that uses outboxkit: a recording transport, a drain that runs through backoff, row assertions.

::

    recorder = RecordingTransport()
    kit = OutboxKit(engine, outboxes=[OrderOutbox], clock=ManualClock(), transport=recorder)
    recorder.attach(kit)                       # sends are recorded per outbox

    place_order(engine, sku="tea", quantity=2) # writes the order and its outbox row
    assert_enqueued(engine, OrderOutbox, where={"sku": "tea"})
    recorder.queue(503, timeout(), 201)        # the receiver fails twice, then accepts
    report = drain_until_idle(kit)             # moves the clock through the backoff table
    assert report.delivered == 1 and len(recorder.sends_for(OrderOutbox)) == 3

The pytest fixtures that build a migrated database and such a kit per test
live in ``outboxkit.pytest_plugin``; docs/testing.md is the guide.

What fails loudly, and how:

* ``UnexpectedSendError``: a send the test did not plan for.  A strict
  ``RecordingTransport`` (``strict=True``) has no answer for it, or the
  transport it forwards to raised (respx raises ``AllMockedAssertionError``
  for a URL with no route).  The attempt itself fails like a refused
  connection, as it would in production, and ``drain_until_idle`` (or
  ``RecordingTransport.check()``) raises after the round, naming the sends.
* ``NotIdleError``: ``drain_until_idle`` could not reach idle within
  ``max_rounds``, or a drain failed (a database error, a missing table).
* ``OutboxAssertionError``: ``assert_enqueued`` found other rows than
  expected; the message lists what the table holds.

All three derive from ``OutboxKitError`` and from ``AssertionError``, so
pytest reports them as failures.
"""

from __future__ import annotations

import dataclasses
import json as jsonlib
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, func, inspect, select
from sqlalchemy.orm import Session

from outboxkit.clock import ManualClock
from outboxkit.errors import (
    ConfigurationError,
    InvalidTypeError,
    InvalidValueError,
    NotIdleError,
    OutboxAssertionError,
    UnexpectedSendError,
)
from outboxkit.kit import OutboxKit
from outboxkit.model import Outbox
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.results import DrainResult
from outboxkit.transport import Delivery, Transport

__all__ = [
    "IdleReport",
    "NotIdleError",
    "OutboxAssertionError",
    "RecordedSend",
    "RecordingTransport",
    "UnexpectedSend",
    "UnexpectedSendError",
    "assert_enqueued",
    "connection_error",
    "drain_until_idle",
    "outbox_rows",
    "reply",
    "timeout",
]

OutboxRow = TypeVar("OutboxRow", bound=Outbox)
# What a test scripts for one send: a status code, a ready AttemptResult, or a
# function of the send that returns either.
Answer = int | AttemptResult | Callable[["RecordedSend"], "int | AttemptResult"]
# How many rows a failure message lists before it summarises the rest.
_ROWS_SHOWN = 20


# -- scripted answers ----------------------------------------------------------


def reply(status_code: int, *, retry_after: str | int | None = None, body: str | None = None) -> AttemptResult:
    """An HTTP answer: ``reply(429, retry_after=120)``; ``body`` ends up in ``last_error`` as the receiver's text would."""
    if isinstance(status_code, bool) or not isinstance(status_code, int) or not 100 <= status_code <= 599:
        raise InvalidValueError(f"status_code must be an HTTP status from 100 to 599, got {status_code!r}")
    if 200 <= status_code < 300:
        return AttemptResult(status_code=status_code)
    return AttemptResult(
        status_code=status_code,
        error=f"HTTP {status_code}" + (f": {body}" if body else ""),
        retry_after=None if retry_after is None else str(retry_after),
    )


def timeout(message: str = "timeout: the receiver did not answer in time (scripted)") -> AttemptResult:
    """An attempt that timed out, as ``HttpTransport`` reports one; retried on the backoff table."""
    return AttemptResult(failure=FailureKind.TIMEOUT, error=message)


def connection_error(message: str = "connection: connection refused (scripted)") -> AttemptResult:
    """An attempt whose connection was refused or reset; retried on the backoff table."""
    return AttemptResult(failure=FailureKind.CONNECTION, error=message)


def _as_result(answer: int | AttemptResult) -> AttemptResult:
    if isinstance(answer, AttemptResult):
        return answer
    if isinstance(answer, int) and not isinstance(answer, bool):
        return reply(answer)
    raise InvalidTypeError(f"an answer is a status code or an AttemptResult, got {answer!r}")


def _check_answer(answer: object) -> None:
    if callable(answer) and not isinstance(answer, AttemptResult):
        return
    _as_result(answer)  # type: ignore[arg-type]


# -- the recording transport ---------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RecordedSend:
    """One attempt as the transport saw it.

    ``outbox`` is the job name of the outbox that sent it (``None`` when the
    recorder is not attached to a kit); ``headers`` are the delivery's headers
    plus ``Idempotency-Key``; ``json`` is the body decoded from the bytes that
    would go on the wire; ``result`` is what the attempt reported.
    """

    outbox: str | None
    method: str
    url: str
    headers: dict[str, str]
    json: Any
    body: bytes | None
    idempotency_key: str
    timeout: float
    delivery: Delivery
    result: AttemptResult | None = field(default=None, compare=False)


@dataclass(frozen=True)
class UnexpectedSend:
    """A send the test did not plan for, and why."""

    send: RecordedSend
    reason: str

    def __str__(self) -> str:
        return f"{self.send.method} {self.send.url} (outbox {self.send.outbox or '?'}): {self.reason}"


class _Forward:
    """Marker: hand the send to ``forward_to``."""


class _Unplanned:
    """Marker: a strict recorder has no answer for the send."""


class RecordingTransport:
    """A transport for tests: records every send and answers from a script.

    An answer is a status code, an ``AttemptResult`` (``reply``, ``timeout``,
    ``connection_error``) or a function ``(RecordedSend) -> int | AttemptResult``.
    For each send the first of these that applies answers it:

    1. the next answer queued for its URL (``queue(..., url=...)``);
    2. the next answer queued for any URL (``queue(...)``);
    3. the standing answer for its URL (``always(..., url=...)``);
    4. ``forward_to``, when given: the send goes to that transport (for
       example an ``HttpTransport`` under respx) and its result is recorded;
       an exception it raises is an unexpected send;
    5. with ``strict=True``, nothing: the send is an unexpected send;
    6. ``default`` (200).

    An unexpected send fails its attempt like a refused connection and is
    kept in ``unexpected``; ``check()`` and ``drain_until_idle`` raise
    ``UnexpectedSendError`` for it.  Sends of one batch run concurrently,
    so queued answers meet them in the order they are sent, which is not
    always the rows' order: when the answer depends on the row, use a
    function.  Thread-safe.
    """

    def __init__(self, *, default: Answer = 200, strict: bool = False, forward_to: Transport | None = None) -> None:
        _check_answer(default)
        self.default = default
        self.strict = strict
        self.forward_to = forward_to
        self._lock = threading.Lock()
        self._sends: list[RecordedSend] = []
        self._unexpected: list[UnexpectedSend] = []
        self._queued: deque[Answer] = deque()
        self._queued_for_url: dict[str, deque[Answer]] = {}
        self._standing: dict[str, Answer] = {}

    # -- scripting -----------------------------------------------------------

    def queue(self, *answers: Answer, url: str | None = None) -> None:
        """Answer the next sends (to ``url``, or to any URL) with ``answers``, one each, in order."""
        if not answers:
            raise InvalidValueError("queue() needs at least one answer, e.g. queue(503, 201)")
        for answer in answers:
            _check_answer(answer)
        with self._lock:
            target = self._queued if url is None else self._queued_for_url.setdefault(url, deque())
            target.extend(answers)

    def always(self, answer: Answer, *, url: str) -> None:
        """Answer every send to ``url`` with ``answer`` once its queued answers are used up."""
        _check_answer(answer)
        with self._lock:
            self._standing[url] = answer

    # -- what was sent -------------------------------------------------------

    @property
    def sends(self) -> list[RecordedSend]:
        """Every recorded send, in the order the attempts finished."""
        with self._lock:
            return list(self._sends)

    def sends_for(self, outbox: type[Outbox] | str) -> list[RecordedSend]:
        """The sends of one outbox (a class or its job name); needs ``attach(kit)``."""
        job_name = outbox if isinstance(outbox, str) else outbox.__outbox__.job_name
        sends = self.sends
        if any(send.outbox is None for send in sends):
            raise ConfigurationError(
                "this RecordingTransport does not know which outbox sent what: attach it to the kit first, "
                "recorder.attach(kit) (the outboxkit_kit fixture does)"
            )
        return [send for send in sends if send.outbox == job_name]

    @property
    def unexpected(self) -> list[UnexpectedSend]:
        """Sends the test did not plan for, not yet reported by ``check()``."""
        with self._lock:
            return list(self._unexpected)

    def check(self) -> None:
        """Raise ``UnexpectedSendError`` for the unexpected sends so far (each is reported once)."""
        with self._lock:
            unexpected, self._unexpected = self._unexpected, []
        if unexpected:
            lines = "\n".join(f"  {item}" for item in unexpected)
            raise UnexpectedSendError(f"{len(unexpected)} unexpected send(s):\n{lines}")

    def clear(self) -> None:
        """Forget the recorded sends, the unexpected ones and the script."""
        with self._lock:
            self._sends.clear()
            self._unexpected.clear()
            self._queued.clear()
            self._queued_for_url.clear()
            self._standing.clear()

    # -- wiring --------------------------------------------------------------

    def attach(self, kit: OutboxKit) -> RecordingTransport:
        """Route every outbox of ``kit`` through this recorder, so each send is recorded with its outbox.

        This replaces each drainer's transport, including one an outbox's
        options name.  Returns the recorder.
        """
        for outbox in kit.outboxes:
            drainer = kit.drainer(outbox)
            drainer.transport = _OutboxTransport(self, drainer.job_name)
        return self

    # -- the Transport interface ---------------------------------------------

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        return self._send(None, delivery, idempotency_key=idempotency_key, timeout=timeout)

    def close(self) -> None:
        """Close ``forward_to``, if any."""
        if self.forward_to is not None:
            self.forward_to.close()

    def _send(self, outbox: str | None, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        body = delivery.body()
        send = RecordedSend(
            outbox=outbox,
            method=delivery.method,
            url=delivery.url,
            headers={**delivery.headers, "Idempotency-Key": idempotency_key},
            json=None if body is None else jsonlib.loads(body),
            body=body,
            idempotency_key=idempotency_key,
            timeout=timeout,
            delivery=delivery,
        )
        with self._lock:
            answer = self._pick_answer(delivery.url)
        problem: str | None = None
        try:
            if isinstance(answer, _Forward):
                assert self.forward_to is not None
                result = self.forward_to.send(delivery, idempotency_key=idempotency_key, timeout=timeout)
            elif isinstance(answer, _Unplanned):
                problem = "no answer scripted for this URL (strict RecordingTransport)"
                result = None
            else:
                result = _as_result(answer(send) if callable(answer) and not isinstance(answer, AttemptResult) else answer)
        except Exception as exc:  # respx's "not mocked" arrives here, as does a broken answer function
            problem = f"{type(exc).__name__}: {exc}"
            result = None
        if result is None:
            result = AttemptResult(failure=FailureKind.CONNECTION, error=f"unexpected send: {problem}")
        recorded = dataclasses.replace(send, result=result)
        with self._lock:
            self._sends.append(recorded)
            if problem is not None:
                self._unexpected.append(UnexpectedSend(recorded, problem))
        return result

    def _pick_answer(self, url: str) -> Answer | _Forward | _Unplanned:
        for queued in (self._queued_for_url.get(url), self._queued):
            if queued:
                return queued.popleft()
        if url in self._standing:
            return self._standing[url]
        if self.forward_to is not None:
            return _Forward()
        if self.strict:
            return _Unplanned()
        return self.default

    def __repr__(self) -> str:
        return f"RecordingTransport(sends={len(self._sends)}, strict={self.strict}, forward_to={self.forward_to!r})"


class _OutboxTransport:
    """One outbox's door into a ``RecordingTransport``: it stamps each send with the outbox's job name."""

    def __init__(self, recorder: RecordingTransport, job_name: str) -> None:
        self.recorder = recorder
        self.job_name = job_name

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        return self.recorder._send(self.job_name, delivery, idempotency_key=idempotency_key, timeout=timeout)

    def close(self) -> None:
        return None


def _recorders(kit: OutboxKit, outboxes: Iterable[type[Outbox]]) -> list[RecordingTransport]:
    found: list[RecordingTransport] = []
    for outbox in outboxes:
        transport = kit.drainer(outbox).transport
        recorder = transport.recorder if isinstance(transport, _OutboxTransport) else transport
        if isinstance(recorder, RecordingTransport) and recorder not in found:
            found.append(recorder)
    return found


# -- draining until idle -------------------------------------------------------


@dataclass
class IdleReport:
    """What ``drain_until_idle`` did: totals per outbox (``results``, by job name) and where the clock ended."""

    rounds: int
    started_at: datetime
    finished_at: datetime
    results: dict[str, DrainResult]
    pending: int  # rows still pending at the end (in backoff or scheduled later; 0 when the clock was advanced)

    @property
    def delivered(self) -> int:
        return sum(result.delivered for result in self.results.values())

    @property
    def retried(self) -> int:
        return sum(result.retried for result in self.results.values())

    @property
    def stuck(self) -> int:
        return sum(result.stuck for result in self.results.values())

    @property
    def advanced(self) -> timedelta:
        """How far the clock moved."""
        return self.finished_at - self.started_at


def drain_until_idle(
    kit: OutboxKit,
    outbox: type[Outbox] | str | None = None,
    *,
    clock: ManualClock | None = None,
    advance_clock: bool = True,
    max_rounds: int = 100,
) -> IdleReport:
    """Drain every outbox of ``kit`` (or one) until no row is due; return what happened.

    Each round drains each outbox until nothing is due.  With
    ``advance_clock`` (the default) the kit's ``ManualClock`` is first brought
    up to the wall clock (rows your code just inserted are due by the
    database's ``now()``), and after each round it is moved to the earliest
    ``next_attempt_at`` of the pending rows, so retries run through the whole
    backoff table without waiting; it stops when no row is pending.  With
    ``advance_clock=False`` the clock is left alone and it stops when nothing
    is due now (rows in backoff stay pending; any clock works).

    ``clock``, if given, must be the kit's clock (it is there so a test can
    say which clock moves).  Raises ``ConfigurationError`` when time should
    move but the kit's clock is not a ``ManualClock``; ``NotIdleError`` when a
    drain fails or rows are still due after ``max_rounds`` rounds;
    ``UnexpectedSendError`` when an attached ``RecordingTransport`` saw an
    unexpected send (after the round that made it, so every outcome is
    recorded first).
    """
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise InvalidValueError(f"max_rounds must be an integer >= 1, got {max_rounds!r}")
    manual = _clock_to_move(kit, clock, advance_clock)
    outboxes = [kit.outbox(outbox)] if outbox is not None else kit.outboxes
    recorders = _recorders(kit, outboxes)
    if manual is not None:
        wall = datetime.now(timezone.utc)
        if manual.now() < wall:
            manual.set(wall)
    started_at = kit.clock.now()
    results = {each.__outbox__.job_name: DrainResult(job_name=each.__outbox__.job_name) for each in outboxes}
    for rounds in range(1, max_rounds + 1):
        for each in outboxes:
            result = kit.drain(each)
            results[each.__outbox__.job_name].add(result)
            if result.error is not None:
                raise NotIdleError(f"the drain of {result.job_name!r} failed in round {rounds}: {result.error}")
        for recorder in recorders:
            recorder.check()
        next_due = _next_due(kit.engine, outboxes)
        if next_due is None:
            return IdleReport(rounds, started_at, kit.clock.now(), results, pending=0)
        if next_due > kit.clock.now():
            if manual is None:
                return IdleReport(rounds, started_at, kit.clock.now(), results, pending=_pending(kit.engine, outboxes))
            manual.set(next_due)
    raise NotIdleError(
        f"still not idle after {max_rounds} rounds (clock at {kit.clock.now().isoformat()}): "
        f"{_pending(kit.engine, outboxes)} row(s) pending, the next due at {_next_due(kit.engine, outboxes)}; "
        "a row that is due but never claimed is usually locked by a transaction the test left open"
    )


def _clock_to_move(kit: OutboxKit, clock: ManualClock | None, advance_clock: bool) -> ManualClock | None:
    if clock is not None and clock is not kit.clock:
        raise ConfigurationError(
            f"drain_until_idle(clock=...) must be the kit's own clock ({kit.clock!r}); moving another clock "
            "would not make any row due. Build the kit with OutboxKit(..., clock=clock)"
        )
    if not advance_clock:
        return None
    if not isinstance(kit.clock, ManualClock):
        raise ConfigurationError(
            f"drain_until_idle can only move time on a ManualClock, and this kit's clock is {kit.clock!r}. "
            "Build the kit with OutboxKit(..., clock=ManualClock()), or pass advance_clock=False "
            "to drain only what is due now"
        )
    return kit.clock


def _next_due(engine: Engine, outboxes: Iterable[type[Outbox]]) -> datetime | None:
    with engine.connect() as connection:
        times = [
            connection.scalar(select(func.min(outbox.next_attempt_at)).where(outbox.status == "pending"))
            for outbox in outboxes
        ]
    due = [moment for moment in times if moment is not None]
    return min(due) if due else None


def _pending(engine: Engine, outboxes: Iterable[type[Outbox]]) -> int:
    with engine.connect() as connection:
        return sum(
            connection.scalar(select(func.count()).select_from(outbox).where(outbox.status == "pending")) or 0
            for outbox in outboxes
        )


# -- asserting what was enqueued -----------------------------------------------


def outbox_rows(
    bind: Session | Engine | Connection, outbox: type[OutboxRow], *, status: str | None = None
) -> list[OutboxRow]:
    """Every row of ``outbox`` (optionally of one ``status``), oldest first.

    With a ``Session`` the rows come from it (including what it has flushed
    but not committed); with an ``Engine`` or ``Connection`` they are read in
    a fresh session and returned detached, every column loaded.
    """
    statement = select(outbox).order_by(outbox.id)
    if status is not None:
        statement = statement.where(outbox.status == status)
    if isinstance(bind, Session):
        return list(bind.scalars(statement))
    with Session(bind, expire_on_commit=False) as session:
        rows = list(session.scalars(statement))
        session.expunge_all()
    return rows


def assert_enqueued(
    bind: Session | Engine | Connection,
    outbox: type[OutboxRow],
    *,
    count: int = 1,
    where: Mapping[str, Any] | Callable[[OutboxRow], bool] | None = None,
    status: str | None = None,
) -> list[OutboxRow]:
    """Assert that ``outbox`` holds exactly ``count`` rows matching ``where``; return them.

    ``where`` is a mapping of attribute to expected value
    (``{"order_id": order.id}``) or a function of the row; ``status``
    narrows to one status.  On a mismatch the ``OutboxAssertionError`` lists
    the rows the table holds, so the failure shows what the code wrote.
    """
    columns = _column_names(outbox)
    if isinstance(where, Mapping):
        unknown = sorted(set(where) - set(columns))
        if unknown:
            raise ConfigurationError(
                f"assert_enqueued(where=...) names {unknown}, not columns of {outbox.__name__}; "
                f"its columns: {', '.join(columns)}"
            )
    rows = outbox_rows(bind, outbox, status=status)
    matching = [row for row in rows if _matches(row, where)]
    if len(matching) == count:
        return matching
    wanted = f"{count} row(s) in {outbox.__tablename__}"  # type: ignore[attr-defined]
    if where is not None:
        wanted += f" matching {dict(where) if isinstance(where, Mapping) else _describe_function(where)}"
    if status is not None:
        wanted += f" with status {status!r}"
    found = f"found {len(matching)}" + (f" (ids {[row.id for row in matching]})" if matching else "")
    raise OutboxAssertionError(f"expected {wanted}, {found}; {_describe_rows(outbox, columns, rows)}")


def _matches(row: Outbox, where: Mapping[str, Any] | Callable[[Any], bool] | None) -> bool:
    if where is None:
        return True
    if isinstance(where, Mapping):
        return all(getattr(row, name) == value for name, value in where.items())
    return bool(where(row))


def _describe_function(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", repr(function))


# The kit's bookkeeping columns that help read a failure; the application's own columns are all shown.
_SHOWN_KIT_COLUMNS = ("id", "status", "attempts", "next_attempt_at", "last_status_code", "last_error")


def _column_names(outbox: type[Outbox]) -> list[str]:
    return [attribute.key for attribute in inspect(outbox).column_attrs]


def _describe_rows(outbox: type[Outbox], columns: list[str], rows: Sequence[Outbox]) -> str:
    table = outbox.__tablename__  # type: ignore[attr-defined]
    if not rows:
        return f"{table} is empty"
    kit_owned = set(Outbox.__annotations__)
    shown = [name for name in _SHOWN_KIT_COLUMNS if name in columns] + [name for name in columns if name not in kit_owned]
    lines = [
        "  " + " ".join(f"{name}={getattr(row, name)!r}" for name in shown) for row in rows[:_ROWS_SHOWN]
    ]
    if len(rows) > _ROWS_SHOWN:
        lines.append(f"  ... and {len(rows) - _ROWS_SHOWN} more")
    return f"{table} holds {len(rows)} row(s):\n" + "\n".join(lines)
