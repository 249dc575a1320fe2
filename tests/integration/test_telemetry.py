"""The telemetry hooks and the kit's structured log lines, around a real drain.

The hooks without a drain (outcome names, refused observers, documented event names) are in tests/unit/test_telemetry.py.
"""

from __future__ import annotations

import logging

from outboxkit.telemetry.hooks import Observer
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


def test_every_record_of_a_drain_an_election_and_a_listener_reconnect_names_its_event(
    engine, database_url, insert_events, receiver, caplog
):
    from outboxkit import OutboxKit, OutboxKitSettings
    from tests.support.leadership import terminate_backend, wait_until
    from tests.support.models import SampleEvent

    settings = OutboxKitSettings(leader_tick_seconds=0.2, standby_probe_seconds=0.2, environment="test")
    with caplog.at_level(logging.INFO, logger="outboxkit"), OutboxKit(engine, outboxes=[SampleEvent], settings=settings) as kit:
        kit.scheduler.elect()
        kit.worker.start()
        wait_until(lambda: kit.scheduler.election is not None and kit.scheduler.election.state.value == "leader",
                   timeout=30, message="leadership")
        listener = kit.worker.listener
        assert listener is not None
        wait_until(lambda: listener.backend_pid is not None, timeout=30, message="the listener connected")
        terminate_backend(database_url, listener.backend_pid)  # lost, then reconnected
        wait_until(lambda: listener.generation >= 2, timeout=30, message="the listener reconnected")
        insert_events([{"n": 1}])
        wait_until(lambda: len(receiver.requests) == 1, timeout=30, message="the delivery")
        kit.worker.stop()
        kit.scheduler.resign()

    records = [record for record in caplog.records if record.levelno >= logging.INFO and record.name.startswith("outboxkit")]
    names = {getattr(record, "event_name", None) for record in records}
    assert {"election.acquired", "scheduler.started", "worker.started", "notify.connection_lost", "notify.reconnected"} <= names
    assert [record.getMessage() for record in records if not getattr(record, "event_name", None)] == []
