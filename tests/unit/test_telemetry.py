"""The telemetry hooks (outboxkit.telemetry) without a drain: outcome names, refused observers, documented event names.

The hooks around a real drain are in tests/integration/test_telemetry.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from outboxkit.errors import ConfigurationError
from outboxkit.telemetry.hooks import Telemetry, outcome_name, status_class


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
    # Event names are string literals of the known families, at log_fields() or _announce(); a file name
    # such as the "job.html" template is not one.
    families = (
        "drain|election|job|worker|metrics|admin|attempts|integration|notify|pause|retention|scheduler|telemetry"
        "|destination|pooler|schedule|inbox"
    )
    literals = re.findall(rf'"((?:{families})\.[a-z_]+)"', source)
    logged = {name for name in literals if not name.endswith((".html", ".css", ".js", ".py"))}
    operations = (package.parent / "docs" / "operations.md").read_text()
    section = operations.split("### Structured logs", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", section, re.M))
    assert logged and logged == documented


def test_attaching_something_that_is_not_an_observer_is_refused():
    telemetry = Telemetry()
    with pytest.raises(ConfigurationError, match="is not an outboxkit.telemetry.hooks.Observer"):
        telemetry.attach(object())  # type: ignore[arg-type]
    assert not telemetry.enabled


# Levels an operator sees; debug lines are for developers and need no event name.
LOGGING_METHODS = {"info", "warning", "error", "exception", "critical", "log"}


def _logging_calls_without_an_event_name(tree: ast.Module) -> list[int]:
    """Lines of ``logger.<level>(...)`` calls (debug excepted) whose ``extra=`` is not ``log_fields(...)``."""
    assigned = {  # fields = log_fields(...), then extra=fields
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == "log_fields"
        for target in node.targets if isinstance(target, ast.Name)
    }
    missing = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in LOGGING_METHODS or getattr(node.func.value, "id", None) != "logger":
            continue
        extra = next((keyword.value for keyword in node.keywords if keyword.arg == "extra"), None)
        named = (isinstance(extra, ast.Call) and getattr(extra.func, "id", None) == "log_fields") or (
            isinstance(extra, ast.Name) and extra.id in assigned
        )
        if not named:
            missing.append(node.lineno)
    return missing


def test_every_non_debug_log_call_of_the_kit_names_its_event():
    package = Path(__file__).resolve().parents[2] / "outboxkit"
    missing = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        missing += [f"{path.relative_to(package.parent)}:{line}" for line in _logging_calls_without_an_event_name(tree)]
    assert missing == []


def test_the_event_name_scan_finds_a_call_without_one():
    tree = ast.parse(
        "logger.warning('x')\n"
        "logger.info('y', extra=log_fields('a.b'))\n"
        "fields = log_fields('c.d')\n"
        "logger.error('z', extra=fields)\n"
        "logger.debug('quiet')\n"
        "logger.log(level, 'w', extra={'event_name': 'e.f'})\n"
    )
    assert _logging_calls_without_an_event_name(tree) == [1, 6]


def test_the_class_of_a_broker_answer_is_ack_or_rejected():
    from outboxkit.policy import AttemptResult, FailureKind
    from outboxkit.telemetry.hooks import attempt_class

    assert attempt_class(AttemptResult(acknowledgement="stream S seq 1")) == "ack"
    assert attempt_class(AttemptResult(failure=FailureKind.REJECTED, error="too large")) == "rejected"
    assert attempt_class(AttemptResult(failure=FailureKind.TIMEOUT, error="t")) == "none"
    assert attempt_class(AttemptResult(status_code=503)) == "5xx"
