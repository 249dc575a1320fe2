"""The rate limit's rules (outboxkit.rate_limits): options, and the token bucket as known-answer vectors."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from outboxkit import OutboxOptions
from outboxkit.errors import ConfigurationError
from outboxkit.rate_limits import STEP_SECONDS, Bucket, RateLimit, take

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def seconds(value: float) -> datetime:
    return NOW + timedelta(seconds=value)


def test_a_new_bucket_grants_its_burst_and_spreads_the_rest_one_token_apart():
    result = take(None, 8, now=NOW, per_second=2, burst=2)
    assert result.granted == 2
    assert result.later == [seconds(0.5 * n) for n in range(1, 7)]
    assert result.bucket == Bucket(tokens=0, refilled_at=NOW, deferred_until=seconds(3.5))


def test_tokens_refill_at_the_rate_up_to_the_burst():
    empty = Bucket(tokens=0, refilled_at=NOW)
    assert take(empty, 5, now=seconds(1.5), per_second=2, burst=10).granted == 3
    assert take(empty, 50, now=seconds(60), per_second=2, burst=10).granted == 10  # never more than the burst


def test_rows_given_back_later_queue_behind_those_given_back_before():
    first = take(None, 5, now=NOW, per_second=1, burst=1)
    assert first.later[-1] == seconds(4) and first.bucket.deferred_until == seconds(5)
    second = take(first.bucket, 2, now=seconds(0.1), per_second=1, burst=1)
    assert second.granted == 0 and second.later == [seconds(5), seconds(6)]


def test_a_high_limit_comes_back_in_steps_not_row_by_row():
    result = take(Bucket(tokens=0, refilled_at=NOW), 25, now=NOW, per_second=100, burst=100)
    assert result.granted == 0
    assert len(set(result.later)) == 3  # 10 rows per 0.1 s step
    assert result.later[0] == seconds(0.01) and result.later[10] == seconds(0.01 + STEP_SECONDS)


def test_a_clock_behind_the_buckets_adds_no_tokens():
    bucket = Bucket(tokens=0, refilled_at=seconds(10))
    result = take(bucket, 1, now=seconds(5), per_second=100, burst=100)
    assert result.granted == 0 and result.bucket.refilled_at == seconds(10)


def test_grants_over_any_window_stay_within_burst_plus_rate_times_window():
    bucket, granted, now = None, 0, NOW
    for step in range(200):  # every 50 ms, ask for more than the limit allows
        now = seconds(step * 0.05)
        result = take(bucket, 7, now=now, per_second=20, burst=20)
        bucket, granted = result.bucket, granted + result.granted
    assert granted <= 20 + 20 * (now - NOW).total_seconds()


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
