"""``OutboxOptions.lease_margin``: the fault outbox's short lease, and bad margins refused."""

from __future__ import annotations

import math

import pytest

from outboxkit import ConfigurationError, OutboxOptions
from outboxkit.model import LEASE_MARGIN_SECONDS
from tests.faults.models import FAULT_OPTIONS


def test_fault_outbox_lease_is_one_round_of_sends_plus_its_margin() -> None:
    rounds = math.ceil(FAULT_OPTIONS.batch_size / FAULT_OPTIONS.concurrency)
    assert FAULT_OPTIONS.lease_seconds == rounds * FAULT_OPTIONS.timeout + FAULT_OPTIONS.lease_margin == 2.0


def test_lease_margin_defaults_to_thirty_seconds() -> None:
    options = OutboxOptions(job_name="grants", batch_size=50, concurrency=16, timeout=10)
    assert options.lease_margin == LEASE_MARGIN_SECONDS == 30.0
    assert options.minimum_lease == 4 * 10 + 30


@pytest.mark.parametrize("margin", [0, -1, float("nan"), float("inf"), True, "5"])
def test_lease_margin_must_be_a_positive_number(margin: object) -> None:
    with pytest.raises(ConfigurationError, match="lease_margin must be a positive number"):
        OutboxOptions(job_name="grants", lease_margin=margin)  # type: ignore[arg-type]


def test_a_lease_below_the_margin_is_refused_with_the_margin_named() -> None:
    with pytest.raises(ConfigurationError, match="lease_margin 5s"):
        OutboxOptions(job_name="grants", timeout=1, batch_size=2, concurrency=2, lease_margin=5, lease=5.5)
