"""The telemetry hooks (outboxkit.telemetry) and the structured fields of the kit's log lines."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from outboxkit.errors import ConfigurationError
from outboxkit.telemetry import Observer, Telemetry, outcome_name, status_class
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


def test_hooks_without_observers_do_nothing_and_hand_the_delivery_back_unchanged():
    telemetry = Telemetry()
    delivery = object()
    probe = telemetry.sending("sample-events", object(), delivery, "key")  # type: ignore[arg-type]
    assert probe.delivery is delivery
    probe.sent(object())  # type: ignore[arg-type]
    assert not telemetry.enabled


def test_outcome_names_and_status_classes():
    assert [outcome_name(status) for status in ("done", "pending", "stuck", "lost_claim")] == [
        "delivered", "retried", "stuck", "lost_claim"
    ]
    assert [status_class(code) for code in (200, 204, 302, 422, 503, None)] == ["2xx", "2xx", "3xx", "4xx", "5xx", "none"]


def test_every_event_name_the_kit_logs_is_documented_in_operations_md():
    package = Path(__file__).resolve().parent.parent / "outboxkit"
    source = "\n".join(path.read_text() for path in package.rglob("*.py"))
    # Event names are string literals of the known families (drain, election, job, worker, metrics, admin), at
    # log_fields() or _announce(); a file name such as the "job.html" template is not one.
    literals = re.findall(r'"((?:drain|election|job|worker|metrics|admin)\.[a-z_]+)"', source)
    logged = {name for name in literals if not name.endswith((".html", ".css", ".js"))}
    operations = (package.parent / "docs" / "operations.md").read_text()
    section = operations.split("### Structured logs", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", section, re.M))
    assert logged and logged == documented


def test_attaching_something_that_is_not_an_observer_is_refused():
    telemetry = Telemetry()
    with pytest.raises(ConfigurationError, match="is not an outboxkit.telemetry.Observer"):
        telemetry.attach(object())  # type: ignore[arg-type]
    assert not telemetry.enabled
