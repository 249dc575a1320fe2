"""The destination rules as known answers: names, what an attempt says, and the breaker's state machine.

Pure functions: no database, no network, time given.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from outboxkit import AttemptResult, ConfigurationError, FailureKind
from outboxkit.breaker import (
    BreakerOptions,
    DestinationState,
    Reading,
    Signal,
    after_outcome,
    check_destination_name,
    destination_of,
    disabled,
    resumed,
    signal_of,
)

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
OPTIONS = BreakerOptions(failures=3, cool_down=10, max_cool_down=35, window=60)
FAILED = Reading(Signal.FAILURE)
SUCCEEDED = Reading(Signal.SUCCESS)


def apply(state: DestinationState, reading: Reading, *, at: datetime = NOW, row_id: int = 1) -> DestinationState:
    return after_outcome(state, reading, now=at, row_id=row_id, error="boom", status_code=None, options=OPTIONS)


def fresh() -> DestinationState:
    return DestinationState(outbox="events", destination="http://127.0.0.1:8000")


# -- names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "destination"),
    [
        ("https://Billing.Internal/grants?x=1", "https://billing.internal:443"),
        ("https://billing.internal:443/other", "https://billing.internal:443"),
        ("http://127.0.0.1:8000/a", "http://127.0.0.1:8000"),
        ("http://example.test/", "http://example.test:80"),
        ("http://user:secret@example.test:81/", "http://example.test:81"),
        ("http://[::1]:9000/hook", "http://[::1]:9000"),
    ],
)
def test_the_default_destination_is_scheme_host_and_port(url, destination):
    assert destination_of(url) == destination


@pytest.mark.parametrize("name", ["", None, 42, "x" * 301])
def test_a_destination_name_must_be_a_short_non_empty_string(name):
    with pytest.raises(ConfigurationError, match="non-empty string of at most 300"):
        check_destination_name(name)


# -- what an attempt says ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "reading"),
    [
        (AttemptResult(status_code=200), Reading(Signal.SUCCESS)),
        (AttemptResult(status_code=400), Reading(Signal.SUCCESS)),  # an answer: the receiver is there
        (AttemptResult(status_code=404), Reading(Signal.SUCCESS)),
        (AttemptResult(status_code=410), Reading(Signal.GONE)),
        (AttemptResult(status_code=408), Reading(Signal.FAILURE)),
        (AttemptResult(status_code=500), Reading(Signal.FAILURE)),
        (AttemptResult(status_code=503), Reading(Signal.FAILURE)),
        (AttemptResult(status_code=503, retry_after="120"), Reading(Signal.FAILURE, 120.0)),
        (AttemptResult(status_code=429), Reading(Signal.THROTTLED)),
        (AttemptResult(status_code=429, retry_after="30"), Reading(Signal.THROTTLED, 30.0)),
        (AttemptResult(status_code=429, retry_after="soon"), Reading(Signal.THROTTLED)),  # a malformed hint is ignored
        (AttemptResult(status_code=429, retry_after="Tue, 01 Jan 2030 12:01:00 GMT"), Reading(Signal.THROTTLED, 60.0)),
        (AttemptResult(failure=FailureKind.TIMEOUT), Reading(Signal.FAILURE)),
        (AttemptResult(failure=FailureKind.CONNECTION), Reading(Signal.FAILURE)),
        (AttemptResult(failure=FailureKind.TRANSPORT), Reading(Signal.FAILURE)),
        (AttemptResult(failure=FailureKind.BUILD), None),  # the application's fault, not the destination's
    ],
)
def test_what_an_attempt_says_about_its_destination(attempt, reading):
    assert signal_of(attempt, now=NOW) == reading


# -- the breaker -----------------------------------------------------------------------


def test_a_run_of_failures_opens_the_breaker_and_blocks_its_rows_until_the_probe():
    state = fresh()
    for _ in range(2):
        state = apply(state, FAILED)
    assert state.status == "healthy" and state.consecutive_failures == 2 and not state.blocked(NOW)
    state = apply(state, FAILED)
    assert state.status == "open"
    assert state.opened_at == NOW and state.cool_down == 10
    assert state.next_probe_at == NOW + timedelta(seconds=10)
    assert state.blocked(NOW) and state.blocked(NOW + timedelta(seconds=10))  # only the claim's probe goes
    assert state.last_error == "boom" and state.changed_by == "3 consecutive failures"


def test_a_flaky_destination_is_not_opened_by_bad_luck_but_a_dead_one_is():
    """A run of failures opens the breaker only once no success has come for ``failure_span`` seconds: a receiver
    failing a third of its requests at random has runs of failures between recent successes and stays healthy."""
    state = apply(fresh(), SUCCEEDED)
    for second in range(1, 6):  # five failures in a row, within the span of the last success
        state = apply(state, FAILED, at=NOW + timedelta(seconds=second))
    assert state.status == "healthy" and state.consecutive_failures == 5
    state = apply(state, FAILED, at=NOW + timedelta(seconds=OPTIONS.failure_span))  # still failing, the span over
    assert state.status == "open" and state.changed_by == "6 consecutive failures"


def test_any_answer_ends_a_failure_run():
    state = apply(apply(fresh(), FAILED), FAILED)
    state = apply(state, SUCCEEDED)
    assert state.consecutive_failures == 0
    assert apply(apply(state, FAILED), FAILED).status == "healthy"


def reopenings(count: int) -> list[tuple[float, float]]:
    """(cool-down, seconds from the failed probe to the next) of ``count`` failed probes in a row."""
    state = apply(apply(apply(fresh(), FAILED), FAILED), FAILED)
    seen = []
    for _ in range(count):
        at = state.next_probe_at
        assert at is not None
        state = apply(_probing(state, row_id=7, at=at), FAILED, at=at, row_id=7)
        assert state.cool_down is not None and state.next_probe_at is not None
        seen.append((state.cool_down, (state.next_probe_at - at).total_seconds()))
    return seen


def test_probes_after_failed_probes_do_not_fall_into_step_with_a_receiver_failing_on_a_cycle():
    """Each re-opening probes up to a quarter of its cool-down sooner, by a fraction that changes from one re-opening
    to the next (a known function of the destination and its failure count): probes at a fixed interval would keep
    landing in the down half of a receiver that is up and down on that same period."""
    seen = reopenings(8)
    assert all(0.75 * cool_down <= gap <= cool_down for cool_down, gap in seen)
    assert len({round(gap / cool_down, 3) for cool_down, gap in seen}) >= 4  # not one fixed phase
    assert reopenings(8) == seen  # the same history, the same probe times: no hidden randomness


def test_a_failed_probe_reopens_with_the_cool_down_doubled_up_to_its_cap():
    state = apply(apply(apply(fresh(), FAILED), FAILED), FAILED)
    cool_downs = []
    at = NOW
    for _ in range(4):
        at = state.next_probe_at
        assert at is not None
        state = _probing(state, row_id=7, at=at)
        state = apply(state, FAILED, at=at, row_id=7)
        assert state.status == "open" and state.opened_at == NOW  # open since the first opening
        cool_downs.append(state.cool_down)
    assert cool_downs == [20, 35, 35, 35]


def test_a_failure_of_another_row_while_half_open_does_not_reopen():
    state = _probing(apply(apply(apply(fresh(), FAILED), FAILED), FAILED), row_id=7, at=NOW + timedelta(seconds=10))
    after = apply(state, FAILED, at=NOW + timedelta(seconds=11), row_id=8)  # sent before the breaker opened
    assert after.status == "half_open" and after.probe_row_id == 7


def test_any_of_the_probes_failing_reopens_but_a_row_sent_before_the_opening_does_not():
    probing = _probing(apply(apply(apply(fresh(), FAILED), FAILED), FAILED), row_id=7, at=NOW + timedelta(seconds=10))
    at = NOW + timedelta(seconds=11)
    before_opening = after_outcome(probing, FAILED, now=at, row_id=3, error="boom", status_code=None, options=OPTIONS,
                                   claimed_until=probing.probe_until - timedelta(seconds=9))
    assert before_opening.status == "half_open"
    another_probe = after_outcome(probing, FAILED, now=at, row_id=8, error="boom", status_code=None, options=OPTIONS,
                                  claimed_until=probing.probe_until)  # claimed with the first probe, row 7
    assert another_probe.status == "open" and another_probe.cool_down == 2 * OPTIONS.cool_down


def test_breaker_options_refuse_a_number_of_probes_out_of_range():
    with pytest.raises(ConfigurationError, match="probes"):
        BreakerOptions(probes=0)
    assert BreakerOptions().probes == 3


def test_a_success_closes_the_breaker_and_unblocks_its_rows():
    state = _probing(apply(apply(apply(fresh(), FAILED), FAILED), FAILED), row_id=7, at=NOW + timedelta(seconds=10))
    state = apply(state, SUCCEEDED, at=NOW + timedelta(seconds=11), row_id=7)
    assert state.status == "healthy" and state.opened_at is None
    assert not state.blocked(NOW + timedelta(seconds=11))


def test_gone_disables_until_a_person_resumes_and_a_late_success_does_not_close_it():
    state = apply(fresh(), Reading(Signal.GONE))
    assert state.status == "disabled" and state.blocked(NOW + timedelta(days=3650)) and state.next_probe_at is None
    assert state.changed_by == "receiver: HTTP 410 Gone"
    state = apply(state, SUCCEEDED)  # a row that was in flight
    assert state.status == "disabled"
    state = resumed(state, actor="alice")
    assert state.status == "healthy" and not state.blocked(NOW) and state.changed_by == "resumed by alice"


def test_a_person_can_disable_a_healthy_destination():
    state = disabled(fresh(), now=NOW, actor="bob")
    assert state.status == "disabled" and state.blocked(NOW) and state.changed_by == "disabled by bob"


def test_retry_after_slows_the_whole_destination_capped_and_never_shortened():
    options = BreakerOptions(max_slow_down=100)
    state = after_outcome(fresh(), Reading(Signal.THROTTLED, 30), now=NOW, row_id=1, error=None, status_code=429, options=options)
    assert state.status == "healthy" and state.consecutive_failures == 0
    assert state.blocked(NOW) and state.slowed_until == NOW + timedelta(seconds=30)
    state = after_outcome(state, Reading(Signal.THROTTLED, 5), now=NOW, row_id=2, error=None, status_code=429, options=options)
    assert state.slowed_until == NOW + timedelta(seconds=30)
    state = after_outcome(state, Reading(Signal.FAILURE, 10_000), now=NOW, row_id=3, error=None, status_code=503, options=options)
    assert state.slowed_until == NOW + timedelta(seconds=100) and state.consecutive_failures == 1
    assert not state.blocked(NOW + timedelta(seconds=100))


def test_a_slow_down_that_has_passed_is_cleared_by_the_next_outcome():
    options = BreakerOptions()
    state = after_outcome(fresh(), Reading(Signal.THROTTLED, 30), now=NOW, row_id=1, error=None, status_code=429, options=options)
    later = NOW + timedelta(seconds=31)
    state = after_outcome(state, Reading(Signal.SUCCESS), now=later, row_id=2, error=None, status_code=200, options=options)
    assert state.slowed_until is None  # quiet again: the claim no longer finds it slowed


def test_recent_outcomes_are_counted_in_a_window():
    state = apply(apply(apply(fresh(), SUCCEEDED), FAILED), SUCCEEDED)
    assert (state.window_successes, state.window_failures) == (2, 1)
    assert state.failure_rate == pytest.approx(1 / 3)
    later = apply(state, FAILED, at=NOW + timedelta(seconds=60))
    assert (later.window_started_at, later.window_successes, later.window_failures) == (NOW + timedelta(seconds=60), 0, 1)
    assert fresh().failure_rate is None


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"failures": 0}, "failures must be an integer from 1"),
        ({"failures": True}, "failures must be an integer"),
        ({"cool_down": 0}, "cool_down must be a positive number"),
        ({"window": float("inf")}, "window must be a positive number"),
        ({"cool_down": 60, "max_cool_down": 30}, "max_cool_down .* must be at least cool_down"),
    ],
)
def test_bad_breaker_options_are_refused_with_the_fix(values, complaint):
    with pytest.raises(ConfigurationError, match=complaint):
        BreakerOptions(**values)


def _probing(state: DestinationState, *, row_id: int, at: datetime) -> DestinationState:
    """What the claim writes when row ``row_id`` becomes the probe at ``at`` (outboxkit.storage.destination_claim)."""
    assert state.status == "open" and state.next_probe_at is not None and state.next_probe_at <= at
    until = at + timedelta(seconds=5)
    return dataclasses.replace(state, status="half_open", probe_row_id=row_id, probe_until=until)
