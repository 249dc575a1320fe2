"""The telemetry hooks and the kit's structured log lines, around a real drain.

The hooks without a drain (outcome names, refused observers, documented event names) are in tests/unit/test_telemetry.py.
"""

from __future__ import annotations

import logging

from outboxkit.telemetry import Observer
from tests.support.receiver import Reply


class Broken(Observer):
    """An observer that fails in every hook."""

    def __getattribute__(self, name: str):
        if name in {"sending", "sent", "recorded", "parked", "drain_finished"}:
            raise RuntimeError(f"broken {name}")
        return object.__getattribute__(self, name)


def test_a_broken_observer_is_logged_once_per_hook_and_every_row_is_still_delivered(make_drainer, insert_events, caplog):
    drainer = make_drainer()
    drainer.telemetry.attach(Broken())
    insert_events([{"n": n} for n in range(3)])
    with caplog.at_level(logging.ERROR, logger="outboxkit.telemetry"):
        result = drainer.drain()
    assert result.delivered == 3
    failures = sorted(record.getMessage().split(" in ")[1].split(";")[0] for record in caplog.records)
    assert failures == ["drain_finished", "recorded", "sending"]  # sent is never reached: sending failed


def test_stuck_rows_and_drain_summaries_log_an_event_name_with_their_fields(make_drainer, insert_events, receiver, caplog):
    receiver.respond = lambda request: Reply(status=422)
    [row_id] = insert_events([{"n": 1}])
    with caplog.at_level(logging.INFO, logger="outboxkit.drain"):
        make_drainer().drain()
    [stuck] = [record for record in caplog.records if getattr(record, "event_name", None) == "drain.row_stuck"]
    assert stuck.getMessage().startswith(f"sample-events: row {row_id} is stuck: ")  # the message people read is unchanged
    assert (stuck.outbox, stuck.row, stuck.attempt, stuck.status, stuck.status_code) == ("sample-events", row_id, 1, "stuck", 422)
    [summary] = [record for record in caplog.records if getattr(record, "event_name", None) == "drain.summary"]
    assert (summary.outbox, summary.claimed, summary.stuck, summary.delivered) == ("sample-events", 1, 1, 0)
