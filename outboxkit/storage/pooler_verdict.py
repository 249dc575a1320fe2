"""What a kit's pooler checks decided: decided once per kit, and a refusal sticks.

The checks of ``outboxkit.drain.pooler_checks`` watch which server connection a
pooler hands out next, so two checks of one engine, a few milliseconds
apart, could disagree: the drain loops refused and the election, checking
on its own, let the same engine run the safety-net drain.  So a kit keeps
one ``PoolerVerdict``:

* the first check of the engine decides for the drain loops and the
  election alike (``engine_decided``), and so does the first check of the
  lock and LISTEN source (``session_source_accepted``);
* a refusal (``refuse``) by any check, at start or by the leader's re-check
  on its tick, is kept for the kit's life: every later start raises it
  again, and whatever already runs on the kit is told (``on_refusal``) so
  it stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from outboxkit.errors import ConfigurationError
from outboxkit.telemetry.log_events import log_fields

__all__ = ["PoolerVerdict", "stop_when_refused"]

logger = logging.getLogger(__name__)

RefusalListener = Callable[[ConfigurationError], None]


class PoolerVerdict:
    """One kit's decision about its pooler: thread-safe, decided once, a refusal never withdrawn."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refusal: ConfigurationError | None = None
        self._engine_decided = False
        self._session_source_accepted: bool | None = None
        self._listeners: list[RefusalListener] = []
        self._last_recheck: float | None = None

    @property
    def refusal(self) -> ConfigurationError | None:
        """The first refusal of this kit, or None."""
        with self._lock:
            return self._refusal

    @property
    def engine_decided(self) -> bool:
        """Whether the engine was checked already (its answer stands for every part of the kit)."""
        with self._lock:
            return self._engine_decided

    def engine_checked(self) -> None:
        with self._lock:
            self._engine_decided = True

    @property
    def session_source_accepted(self) -> bool | None:
        """The first check's answer about the lock and LISTEN source: None before it."""
        with self._lock:
            return self._session_source_accepted

    def session_source_checked(self, accepted: bool) -> None:
        with self._lock:
            if self._session_source_accepted is None:
                self._session_source_accepted = accepted

    def recheck_due(self, now: float, *, every_seconds: float) -> bool:
        """Whether a re-check is due at ``now`` (monotonic seconds): the first, then one per ``every_seconds``."""
        with self._lock:
            if self._last_recheck is not None and now - self._last_recheck < every_seconds:
                return False
            self._last_recheck = now
            return True

    def refuse(self, error: ConfigurationError) -> None:
        """Keep ``error`` as the kit's refusal (the first one wins) and tell every listener once."""
        with self._lock:
            if self._refusal is not None:
                return
            self._refusal = error
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(error)
            except Exception:
                logger.exception("stopping work after a pooler refusal failed",
                                 extra=log_fields("pooler.refusal_listener_failed"))

    def on_refusal(self, listener: RefusalListener) -> None:
        """Call ``listener(error)`` when this kit refuses (at once, in this thread, if it already has)."""
        with self._lock:
            refusal = self._refusal
            if refusal is None:
                self._listeners.append(listener)
        if refusal is not None:
            listener(refusal)


def stop_when_refused(
    verdict: PoolerVerdict, *, running: Callable[[], bool], stop: Callable[[], None], what: str, event: str
) -> None:
    """When the kit refuses, stop ``what`` (``stop()``) if it ``running()``, logging ``event`` once.

    The stop runs in a thread of its own: the refusal may come from the
    election's tick, which must not wait for sends or runs to finish.
    """

    def refused(error: ConfigurationError) -> None:
        if not running():
            return
        logger.error("the kit refused its engine (%s); stopping %s", error, what, extra=log_fields(event))
        threading.Thread(target=stop, name=f"outboxkit-refused-{event}", daemon=True).start()

    verdict.on_refusal(refused)
