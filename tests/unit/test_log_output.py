"""The kit's log lines carry their time and level where nothing configured logging (an app under uvicorn)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from outboxkit.integration import LOG_FORMAT, kit_log_output


@pytest.fixture
def unconfigured() -> Iterator[logging.Logger]:
    """The kit's logger as a fresh process has it (no handler, no level), restored after."""
    kit = logging.getLogger("outboxkit")
    handlers, level = list(kit.handlers), kit.level
    kit.handlers[:], kit.level = [], logging.NOTSET
    yield kit
    kit.handlers[:], kit.level = handlers, level


def test_without_logging_configured_the_kit_logs_time_level_and_name(unconfigured, monkeypatch, capsys):
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # uvicorn configures only its own loggers
    kit_log_output()
    kit_log_output()  # once only
    logging.getLogger("outboxkit.destinations.gate").info("webhooks: destination https://x:443 is healthy (was open)")

    line = capsys.readouterr().err.strip()
    assert len(unconfigured.handlers) == 1 and "%(asctime)s %(levelname)s" in LOG_FORMAT
    assert line.endswith("INFO outboxkit.destinations.gate: webhooks: destination https://x:443 is healthy (was open)")
    assert line[:4].isdigit()  # the time first


def test_logging_the_application_configured_is_left_alone(unconfigured, monkeypatch):
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])
    kit_log_output()
    assert unconfigured.handlers == []
