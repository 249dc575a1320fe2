"""Outbox-level actions: pause and resume an outbox's drains, and "drain now".

* **Pause** writes the outbox into ``outboxkit_outbox_pauses``
  (``outboxkit.pauses``); every drainer in every process checks it before
  each claim and claims nothing while it is there.  Rows in flight finish;
  nothing is lost or changed; inserts keep waiting as ``pending``.
* **Resume** removes it and notifies the outbox's channel in the same
  transaction, so listening drainers claim the due rows as soon as it commits.
* **Drain now** notifies the channel, which wakes every listening drainer,
  and, when this process runs no drain loop for the outbox, also starts one
  bounded drain here (in a thread, so the request does not wait for
  deliveries).  A paused outbox is refused (``OutboxPaused``): resume it.

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
from outboxkit.notify import notify_statement
from outboxkit.operations.schemas import ControlResult
from outboxkit.operator_queries import admin_queries_for
from outboxkit.pauses import is_paused, pause, resume
from outboxkit.tables import reset_audit

__all__ = ["AUDIT_IDS_LIMIT", "OutboxControls", "OutboxPaused", "record_audit"]

# A filter reset may touch many rows; the audit keeps this many of their ids
# (and the exact count, and the filter that selected them).
AUDIT_IDS_LIMIT = 10_000
# "Drain now" in a process without drain loops: one drain, bounded in time.
DRAIN_NOW_SECONDS = 30.0


def record_audit(
    connection: Connection, *, actor: str, outbox_name: str, action: str, ids: list[int], row_filter: dict[str, Any]
) -> int:
    """One audit entry, in the caller's transaction; returns its id."""
    statement = (
        insert(reset_audit)
        .values(
            actor=actor[:300],
            outbox=outbox_name,
            action=action,
            row_count=len(ids),
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

    def pause(self, outbox_name: str, *, actor: str) -> ControlResult:
        outbox = self.kit.outbox(outbox_name)  # UnknownOutboxError for a bad name
        with self.kit.engine.begin() as connection:
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
        with self.kit.engine.begin() as connection:
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
        with self.kit.engine.begin() as connection:
            if is_paused(connection, outbox.__outbox__.job_name):
                raise OutboxPaused(outbox_name)
            due = queries.count_due(connection, now=self.kit.clock.now())
            audit_id = record_audit(connection, actor=actor, outbox_name=outbox_name, action="drain_now", ids=[], row_filter={})
            connection.execute(notify_statement(outbox))
        drainer = self.kit.drainer(outbox)
        if not drainer.running:  # nobody here listens: drain once in this process too
            threading.Thread(
                target=drainer.drain,
                kwargs={"max_seconds": DRAIN_NOW_SECONDS},
                name=f"outboxkit-drain-now-{outbox_name}",
                daemon=True,
            ).start()
        return ControlResult(action="drain_now", outbox=outbox_name, changed=True, paused=False, due_rows=due, audit_id=audit_id)

    def _forget_local(self, outbox_name: str) -> None:
        """This process's drainer sees the change at once (others within their cache time, or on the NOTIFY)."""
        self.kit.drainer(outbox_name).pause_check.forget()
