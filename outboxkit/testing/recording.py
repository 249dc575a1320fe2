"""The recording transport: records every send per outbox and answers as the test scripted (``reply``, ``timeout``...)."""

from __future__ import annotations

import dataclasses
import json as jsonlib
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from outboxkit.errors import (
    ConfigurationError,
    InvalidTypeError,
    InvalidValueError,
    UnexpectedSendError,
)
from outboxkit.kit import OutboxKit
from outboxkit.model import Outbox
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.transports.base import Delivery, Transport

__all__ = ["RecordedSend", "RecordingTransport", "UnexpectedSend", "attached_recorders", "connection_error", "reply", "timeout"]

# What a test scripts for one send: a status code, a ready AttemptResult, or a
# function of the send that returns either.
Answer = int | AttemptResult | Callable[["RecordedSend"], "int | AttemptResult"]


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


def attached_recorders(kit: OutboxKit, outboxes: Iterable[type[Outbox]]) -> list[RecordingTransport]:
    found: list[RecordingTransport] = []
    for outbox in outboxes:
        transport = kit.drainer(outbox).transport
        recorder = transport.recorder if isinstance(transport, _OutboxTransport) else transport
        if isinstance(recorder, RecordingTransport) and recorder not in found:
            found.append(recorder)
    return found
