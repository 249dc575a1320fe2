"""Retention's settings: bad limits and overrides are refused at start-up.

The deletion itself is in tests/integration/test_retention.py.
"""

from __future__ import annotations

import pytest

from outboxkit import ConfigurationError, OutboxKitSettings
from outboxkit.leader.retention import RetentionLimits


def test_an_override_that_is_not_a_number_is_refused_at_start_up(monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RETAIN_DONE_FOR", "a week")
    with pytest.raises(ConfigurationError, match=r"OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RETAIN_DONE_FOR"):
        OutboxKitSettings.from_environment()


@pytest.mark.parametrize(
    "limits", [{"batch_size": 0}, {"max_rows": -1}, {"max_seconds": 0}, {"batch_size": 1.5}, {"max_seconds": True}]
)
def test_bad_limits_are_refused(limits):
    with pytest.raises(ConfigurationError, match="retention .* must be a positive"):
        RetentionLimits(**limits)
