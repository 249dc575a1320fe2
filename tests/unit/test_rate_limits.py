"""The rate limit's options (outboxkit.rate_limits); the bucket itself is the claim's SQL, tested in
tests/integration/test_destination_rates.py."""

from __future__ import annotations

import pytest

from outboxkit import OutboxOptions
from outboxkit.errors import ConfigurationError
from outboxkit.rate_limits import RateLimit


def test_the_options_refuse_what_limits_nothing_or_is_not_a_rate():
    assert RateLimit(per_second=5).per_second_of("http://a:80") == 5
    limit = RateLimit(destinations={"http://slow:80": 0.5})
    assert limit.per_second_of("http://slow:80") == 0.5 and limit.per_second_of("http://other:80") is None
    assert limit.burst_of(0.5) == 1 and RateLimit(per_second=40, burst_seconds=0.25).burst_of(40) == 10
    for bad in (
        {},
        {"per_second": 0},
        {"per_second": float("inf")},
        {"per_second": True},
        {"destinations": {"http://a:80": -1}},
        {"destinations": {"": 1}},
        {"per_second": 1, "burst_seconds": 0},
    ):
        with pytest.raises(ConfigurationError):
            RateLimit(**bad)
    with pytest.raises(ConfigurationError, match="rate_limit must be RateLimit"):
        OutboxOptions(job_name="hooks", rate_limit=5)  # type: ignore[arg-type]
