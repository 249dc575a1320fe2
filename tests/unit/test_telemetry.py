"""The telemetry hooks (outboxkit.telemetry) without a drain: outcome names, refused observers, documented event names.

The hooks around a real drain are in tests/integration/test_telemetry.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from outboxkit.errors import ConfigurationError
from outboxkit.telemetry import Telemetry, outcome_name, status_class


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
    package = Path(__file__).resolve().parents[2] / "outboxkit"
    source = "\n".join(path.read_text() for path in package.rglob("*.py"))
    # Event names are string literals of the known families (drain, election, job, worker, metrics), at
    # log_fields() or _announce(); a file name such as the "job.html" template is not one.
    literals = re.findall(r'"((?:drain|election|job|worker|metrics)\.[a-z_]+)"', source)
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
