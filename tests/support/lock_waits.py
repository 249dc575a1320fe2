"""Awaiting, from a test, a session of the test's database that waits for a lock."""

from __future__ import annotations

import time

from sqlalchemy import Engine, text


def wait_for_a_lock_wait(engine: Engine, *, statement: str, timeout: float = 60.0) -> None:
    """Return once a session of this database waits for a lock in a statement containing ``statement``."""
    deadline = time.monotonic() + timeout
    with engine.connect() as observer:
        while time.monotonic() < deadline:
            waiting = observer.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query LIKE :pattern"
                ),
                {"pattern": f"%{statement}%"},
            ).scalar()
            observer.rollback()
            if waiting:
                return
            time.sleep(0.02)  # polling the server for a condition: there is no notification to await
    raise AssertionError(f"no session waited for a lock in {statement!r} within {timeout} s")
