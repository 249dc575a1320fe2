"""Claimed rows given back unsent on a thread of their own, so the pump goes on sending the others meanwhile.

The destination gate gives back the rows of a claim it does not send now
(those over a destination's cap that cannot wait, the rows that waited over
it and whose lease ran short): each ``(row id, claim token, due time)``, in
one statement (``DestinationStore.release_claims``: each row under its own
claim token, its attempt taken back).  ``release`` hands that statement to a
single background thread, started on first use; ``settle`` waits until every
statement handed over is written (the pump calls it before a claim, so the
claim can take those rows), and ``close`` writes what is left and stops the
thread.

A statement that fails is logged, not raised: its rows keep their claim and
come due again when their lease ends, with the attempt counted, never lost.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime

from sqlalchemy import Connection

from outboxkit.destinations.store import DestinationStore
from outboxkit.telemetry.log_events import log_fields

__all__ = ["ClaimRelease"]

logger = logging.getLogger(__name__)


class ClaimRelease:
    """One outbox's background give-back of claimed rows (see the module); thread-safe."""

    def __init__(self, store: DestinationStore, connect: Callable[[], Connection], *, job_name: str) -> None:
        self.store = store
        self._connect = connect  # a connection for one statement (the gate's, in AUTOCOMMIT)
        self.job_name = job_name
        self._lock = threading.Lock()
        self._thread: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def release(self, rows: list[tuple[int, uuid.UUID, datetime]], *, now: datetime) -> None:
        """Give ``rows`` back, ``(row id, claim token, due time)`` each, in one statement on the background thread."""
        if not rows:
            return
        with self._lock:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"outboxkit-release-{self.job_name}")
            self._pending.append(self._thread.submit(self._write, rows, now))

    def _write(self, rows: list[tuple[int, uuid.UUID, datetime]], now: datetime) -> None:
        try:
            with self._connect() as connection:
                self.store.release_claims(connection, rows, now=now)
        except Exception as exc:  # the rows come back when their lease ends, one attempt spent
            logger.warning(
                "%s: could not give back %d row(s) over their destination's cap (%s: %s); they come back when their "
                "lease ends", self.job_name, len(rows), type(exc).__name__, exc,
                extra=log_fields("destination.release_failed", self.job_name, rows=len(rows)),
            )

    def settle(self) -> None:
        """Wait until every give-back handed over so far is written."""
        with self._lock:
            pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def close(self) -> None:
        """Write what is still being given back, then stop the background thread."""
        self.settle()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=True)
