"""Outbox-level actions: pause and resume an outbox's drains, and "drain now".

* **Pause** writes the outbox into ``outboxkit_outbox_pauses``
  (``outboxkit.storage.pauses``); every drainer in every process checks it before
  each claim and claims nothing while it is there.  Rows in flight finish;
  nothing is lost or changed; inserts keep waiting as ``pending``.
* **Resume** removes it and notifies the outbox's channel in the same
  transaction, so listening drainers claim the due rows as soon as it commits.
* **Drain now** notifies the channel, which wakes every listening drainer
  (and says how many rows were due, counted up to ``DUE_COUNT_CAP``),
  and, when this process runs no drain loop for the outbox, also drains
  here: in one background thread per outbox at most (so the request does not
  wait for deliveries, and clicks cannot pile up threads).  A click while
  that drain runs starts no thread: it asks the running one to drain once
  more when it finishes, so the rows the click made due are still claimed
  here.  A paused outbox is refused (``OutboxPaused``): pausing means no
  process claims its rows, so an operator resumes it first.

Each change is recorded in ``outboxkit_reset_audit`` (actions ``pause``,
``resume``, ``drain_now``) with its actor; a pause of a paused outbox or a
resume of a running one changes nothing and is not recorded.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import Connection, insert

from outboxkit.errors import OutboxPaused
from outboxkit.kit import OutboxKit
from outboxkit.operations.schemas import ControlResult
from outboxkit.storage.notify import notify_statement
from outboxkit.storage.operator_queries import admin_queries_for
from outboxkit.storage.pauses import is_paused, pause, resume
from outboxkit.storage.tables import reset_audit

__all__ = ["AUDIT_IDS_LIMIT", "DUE_COUNT_CAP", "OutboxControls", "OutboxPaused", "record_audit"]

# A filter reset may touch many rows; the audit keeps this many of their ids
# (and the exact count, and the filter that selected them).
AUDIT_IDS_LIMIT = 10_000
# "Drain now" in a process without drain loops: one drain, bounded in time.
DRAIN_NOW_SECONDS = 30.0
# "Drain now" says how many rows were due, counted up to this many ("10,000+" beyond): an
# exact count of a big backlog would read all of it on every click.
DUE_COUNT_CAP = 10_000


def record_audit(
    connection: Connection,
    *,
    actor: str,
    outbox_name: str,
    action: str,
    ids: list[int],
    row_filter: dict[str, Any],
    row_count: int | None = None,
) -> int:
    """One audit entry, in the caller's transaction; returns its id.

    ``row_count`` is how many rows the action changed when it does not name them (a resume releases a
    destination's rows without listing them); by default, the ids' count.
    """
    statement = (
        insert(reset_audit)
        .values(
            actor=actor[:300],
            outbox=outbox_name,
            action=action,
            row_count=len(ids) if row_count is None else row_count,
            row_ids=ids[:AUDIT_IDS_LIMIT],
            filter=row_filter,
        )
        .returning(reset_audit.c.id)
    )
    return int(connection.execute(statement).scalar_one())


class OutboxControls:
    """Pause, resume and drain now, over one kit."""

    def __init__(self, kit: OutboxKit) -> None:
        self.kit = kit
        self._lock = threading.Lock()
        self._background: dict[str, threading.Thread] = {}  # the one "drain now" thread per outbox, while it runs
        self._again: set[str] = set()  # outboxes clicked while their thread ran: it drains once more

    def pause(self, outbox_name: str, *, actor: str) -> ControlResult:
        outbox = self.kit.outbox(outbox_name)  # UnknownOutboxError for a bad name
        with self.kit.operator_database.begin() as connection:
            changed = pause(connection, outbox.__outbox__.job_name, actor=actor, now=self.kit.clock.now())
            audit_id = (
                record_audit(connection, actor=actor, outbox_name=outbox_name, action="pause", ids=[], row_filter={})
                if changed
                else None
            )
        self._forget_local(outbox_name)
        return ControlResult(action="pause", outbox=outbox_name, changed=changed, paused=True, due_rows=None, audit_id=audit_id)

    def resume(self, outbox_name: str, *, actor: str) -> ControlResult:
        outbox = self.kit.outbox(outbox_name)
        with self.kit.operator_database.begin() as connection:
            changed = resume(connection, outbox.__outbox__.job_name)
            audit_id = None
            if changed:
                audit_id = record_audit(connection, actor=actor, outbox_name=outbox_name, action="resume", ids=[], row_filter={})
                connection.execute(notify_statement(outbox))  # delivered on commit: the drains claim at once
        self._forget_local(outbox_name)
        return ControlResult(action="resume", outbox=outbox_name, changed=changed, paused=False, due_rows=None, audit_id=audit_id)

    def drain_now(self, outbox_name: str, *, actor: str) -> ControlResult:
        outbox = self.kit.outbox(outbox_name)
        queries = admin_queries_for(outbox)
        with self.kit.operator_database.begin() as connection:
            if is_paused(connection, outbox.__outbox__.job_name):
                raise OutboxPaused(outbox_name)
            due = queries.count_due(connection, now=self.kit.clock.now(), cap=DUE_COUNT_CAP)
            audit_id = record_audit(connection, actor=actor, outbox_name=outbox_name, action="drain_now", ids=[], row_filter={})
            connection.execute(notify_statement(outbox))
        if not self.kit.drainer(outbox).running:  # nobody here listens: drain in this process too
            self._drain_in_background(outbox_name)
        return ControlResult(
            action="drain_now",
            outbox=outbox_name,
            changed=True,
            paused=False,
            due_rows=min(due, DUE_COUNT_CAP),
            due_rows_at_least=due > DUE_COUNT_CAP,
            audit_id=audit_id,
        )

    def resume_and_drain_now(self, outbox_name: str, *, actor: str) -> ControlResult:
        """Resume (when paused), then drain now; each step audited.  The pages' "Drain now" on a paused outbox, once confirmed."""
        self.resume(outbox_name, actor=actor)
        return self.drain_now(outbox_name, actor=actor)

    def _drain_in_background(self, outbox_name: str) -> None:
        """Start this outbox's one background drain, or ask the running one to drain again when it finishes."""
        with self._lock:
            running = self._background.get(outbox_name)
            if running is not None and running.is_alive():
                self._again.add(outbox_name)
                return
            thread = threading.Thread(
                target=self._drain_until_asked_no_more,
                args=(outbox_name,),
                name=f"outboxkit-drain-now-{outbox_name}",
                daemon=True,
            )
            self._background[outbox_name] = thread
            thread.start()

    def _drain_until_asked_no_more(self, outbox_name: str) -> None:
        drainer = self.kit.drainer(outbox_name)
        while True:
            drainer.drain(max_seconds=DRAIN_NOW_SECONDS)  # never raises
            with self._lock:
                if outbox_name not in self._again:
                    del self._background[outbox_name]
                    return
                self._again.discard(outbox_name)

    def _forget_local(self, outbox_name: str) -> None:
        """This process's drainer sees the change at once (others within their cache time, or on the NOTIFY)."""
        self.kit.drainer(outbox_name).pause_check.forget()
