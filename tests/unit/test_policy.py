"""Known-answer vectors for the outcome rules (``RetryPolicy.decide``).

Every case uses a fixed ``NOW``; nothing here reads a clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from outboxkit.policy import (
    DEFAULT_BACKOFF,
    DEFAULT_MAX_ATTEMPTS,
    AttemptResult,
    FailureKind,
    RetryPolicy,
    parse_retry_after,
)

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
DEFAULT = RetryPolicy()


def answered(status_code: int, retry_after: str | None = None) -> AttemptResult:
    return AttemptResult(status_code=status_code, error=f"HTTP {status_code}", retry_after=retry_after)


def failed(kind: FailureKind, error: str) -> AttemptResult:
    return AttemptResult(failure=kind, error=error)


def test_default_table_and_limit_are_the_documented_ones():
    assert DEFAULT_BACKOFF == (5, 15, 60, 300, 900, 3600)
    assert DEFAULT_MAX_ATTEMPTS == 24
    assert DEFAULT.backoff == (5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)
    assert DEFAULT.max_attempts == 24


@pytest.mark.parametrize("status_code", [200, 201, 204])
def test_2xx_is_done(status_code):
    decision = DEFAULT.decide(AttemptResult(status_code=status_code), attempts=1, now=NOW)
    assert decision.status == "done"
    assert decision.next_attempt_at is None


def test_2xx_is_done_even_on_the_last_allowed_attempt():
    decision = DEFAULT.decide(AttemptResult(status_code=200), attempts=DEFAULT_MAX_ATTEMPTS, now=NOW)
    assert decision.status == "done"


@pytest.mark.parametrize("status_code", [400, 401, 403, 404, 409, 410, 422])
def test_client_errors_are_stuck_at_once(status_code):
    decision = DEFAULT.decide(answered(status_code), attempts=1, now=NOW)
    assert decision.status == "stuck"
    assert decision.next_attempt_at is None


@pytest.mark.parametrize("status_code", [301, 302, 304])
def test_redirects_are_stuck_at_once(status_code):
    assert DEFAULT.decide(answered(status_code), attempts=1, now=NOW).status == "stuck"


def test_a_client_error_is_stuck_even_when_it_sends_retry_after():
    decision = DEFAULT.decide(answered(400, retry_after="10"), attempts=1, now=NOW)
    assert decision.status == "stuck"


@pytest.mark.parametrize(
    "result",
    [
        pytest.param(answered(408), id="408"),
        pytest.param(answered(429), id="429"),
        pytest.param(answered(500), id="500"),
        pytest.param(answered(502), id="502"),
        pytest.param(answered(503), id="503"),
        pytest.param(answered(504), id="504"),
        pytest.param(answered(599), id="599"),
        pytest.param(failed(FailureKind.TIMEOUT, "timeout: ReadTimeout"), id="timeout"),
        pytest.param(failed(FailureKind.CONNECTION, "connection: ConnectError: refused"), id="connection-refused"),
        pytest.param(failed(FailureKind.CONNECTION, "connection: ReadError: reset by peer"), id="connection-reset"),
        pytest.param(failed(FailureKind.BUILD, "ValueError: bad payload"), id="build-failure"),
        pytest.param(failed(FailureKind.TRANSPORT, "RuntimeError: boom"), id="transport-error"),
    ],
)
def test_retryable_outcomes_wait_the_first_step(result):
    decision = DEFAULT.decide(result, attempts=1, now=NOW)
    assert decision.status == "pending"
    assert decision.next_attempt_at == NOW + timedelta(seconds=5)


@pytest.mark.parametrize(
    ("attempts", "expected_delay"),
    [(1, 5), (2, 15), (3, 60), (4, 300), (5, 900), (6, 3600), (7, 3600), (8, 3600)],
)
def test_backoff_progression_follows_the_default_table(attempts, expected_delay):
    decision = DEFAULT.decide(answered(503), attempts=attempts, now=NOW)
    assert decision.status == "pending"
    assert decision.next_attempt_at == NOW + timedelta(seconds=expected_delay)


def test_backoff_progression_exact_due_times():
    due_times = [DEFAULT.decide(answered(500), attempts=n, now=NOW).next_attempt_at for n in range(1, 9)]
    assert due_times == [
        datetime(2030, 1, 1, 12, 0, 5, tzinfo=timezone.utc),
        datetime(2030, 1, 1, 12, 0, 15, tzinfo=timezone.utc),
        datetime(2030, 1, 1, 12, 1, 0, tzinfo=timezone.utc),
        datetime(2030, 1, 1, 12, 5, 0, tzinfo=timezone.utc),
        datetime(2030, 1, 1, 12, 15, 0, tzinfo=timezone.utc),
        datetime(2030, 1, 1, 13, 0, 0, tzinfo=timezone.utc),
        datetime(2030, 1, 1, 13, 0, 0, tzinfo=timezone.utc),
        datetime(2030, 1, 1, 13, 0, 0, tzinfo=timezone.utc),
    ]


def test_a_custom_table_is_used_and_its_last_step_repeats():
    policy = RetryPolicy(backoff=(1, 2), max_attempts=10)
    delays = [policy.decide(answered(503), attempts=n, now=NOW).next_attempt_at - NOW for n in (1, 2, 3, 9)]
    assert delays == [timedelta(seconds=1), timedelta(seconds=2), timedelta(seconds=2), timedelta(seconds=2)]


def test_fractional_steps_are_kept():
    policy = RetryPolicy(backoff=(0.25,))
    assert policy.decide(answered(503), attempts=1, now=NOW).next_attempt_at == NOW + timedelta(milliseconds=250)


@pytest.mark.parametrize(
    ("attempts", "status"),
    [(23, "pending"), (24, "stuck"), (25, "stuck")],
)
def test_reaching_max_attempts_is_stuck(attempts, status):
    decision = DEFAULT.decide(answered(503), attempts=attempts, now=NOW)
    assert decision.status == status
    if status == "stuck":
        assert decision.next_attempt_at is None
        assert "max attempts (24)" in decision.reason


def test_max_attempts_one_means_a_single_try():
    policy = RetryPolicy(max_attempts=1)
    assert policy.decide(failed(FailureKind.TIMEOUT, "timeout"), attempts=1, now=NOW).status == "stuck"


# -- Retry-After -----------------------------------------------------------------


def test_retry_after_seconds_longer_than_the_table_is_honoured():
    decision = DEFAULT.decide(answered(429, retry_after="120"), attempts=1, now=NOW)
    assert decision.next_attempt_at == NOW + timedelta(seconds=120)


def test_retry_after_seconds_shorter_than_the_table_loses_to_the_table():
    decision = DEFAULT.decide(answered(503, retry_after="1"), attempts=3, now=NOW)
    assert decision.next_attempt_at == NOW + timedelta(seconds=60)


def test_retry_after_http_date_longer_than_the_table_is_honoured():
    decision = DEFAULT.decide(answered(503, retry_after="Tue, 01 Jan 2030 12:10:00 GMT"), attempts=1, now=NOW)
    assert decision.next_attempt_at == datetime(2030, 1, 1, 12, 10, tzinfo=timezone.utc)


def test_retry_after_http_date_shorter_than_the_table_loses_to_the_table():
    decision = DEFAULT.decide(answered(503, retry_after="Tue, 01 Jan 2030 12:00:02 GMT"), attempts=2, now=NOW)
    assert decision.next_attempt_at == NOW + timedelta(seconds=15)


def test_retry_after_http_date_in_the_past_loses_to_the_table():
    decision = DEFAULT.decide(answered(503, retry_after="Mon, 31 Dec 2029 12:00:00 GMT"), attempts=1, now=NOW)
    assert decision.next_attempt_at == NOW + timedelta(seconds=5)


@pytest.mark.parametrize(
    "garbage",
    ["soon", "", "   ", "-30", "1.5", "²", "Tue, 99 Jan 2030 12:10:00 GMT", "120 seconds"],
)
def test_garbage_retry_after_is_ignored(garbage):
    decision = DEFAULT.decide(answered(503, retry_after=garbage), attempts=1, now=NOW)
    assert decision.status == "pending"
    assert decision.next_attempt_at == NOW + timedelta(seconds=5)


def test_retry_after_is_capped_by_max_retry_after():
    policy = RetryPolicy(max_retry_after=600)
    decision = policy.decide(answered(429, retry_after="999999"), attempts=1, now=NOW)
    assert decision.next_attempt_at == NOW + timedelta(seconds=600)


def test_retry_after_http_date_is_capped_by_max_retry_after():
    policy = RetryPolicy(max_retry_after=600)
    decision = policy.decide(answered(503, retry_after="Fri, 01 Feb 2030 00:00:00 GMT"), attempts=1, now=NOW)
    assert decision.next_attempt_at == NOW + timedelta(seconds=600)


def test_default_cap_is_one_day():
    decision = DEFAULT.decide(answered(429, retry_after="9" * 400), attempts=1, now=NOW)
    assert decision.next_attempt_at == NOW + timedelta(days=1)


def test_the_cap_never_shortens_the_table():
    policy = RetryPolicy(max_retry_after=10)
    decision = policy.decide(answered(503, retry_after="7200"), attempts=6, now=NOW)
    assert decision.next_attempt_at == NOW + timedelta(seconds=3600)


def test_retry_after_does_not_rescue_a_row_at_max_attempts():
    decision = DEFAULT.decide(answered(429, retry_after="60"), attempts=24, now=NOW)
    assert decision.status == "stuck"


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("0", 0.0),
        (" 30 ", 30.0),
        ("Tue, 01 Jan 2030 12:01:00 GMT", 60.0),
        ("Tue, 01 Jan 2030 12:01:00 -0000", 60.0),
        ("Tue, 01 Jan 2030 11:00:00 GMT", 0.0),
        (None, None),
        ("later", None),
    ],
)
def test_parse_retry_after(header, seconds):
    assert parse_retry_after(header, NOW) == seconds


# -- bad arguments ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"backoff": ()}, "at least one step"),
        ({"backoff": (5, -1)}, "finite seconds >= 0"),
        ({"backoff": (5, float("nan"))}, "finite seconds >= 0"),
        ({"backoff": (5, float("inf"))}, "finite seconds >= 0"),
        ({"backoff": (5, "15")}, "finite seconds >= 0"),
        ({"backoff": (True,)}, "finite seconds >= 0"),
        ({"backoff": "5,15"}, "sequence of seconds"),
        ({"backoff": None}, "sequence of seconds"),
        ({"backoff": 5}, "sequence of seconds"),
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1"),
        ({"max_attempts": -3}, "max_attempts must be an integer >= 1"),
        ({"max_attempts": 2.5}, "max_attempts must be an integer >= 1"),
        ({"max_attempts": True}, "max_attempts must be an integer >= 1"),
        ({"max_attempts": "3"}, "max_attempts must be an integer >= 1"),
        ({"max_retry_after": -1}, "max_retry_after must be finite seconds >= 0"),
        ({"max_retry_after": float("inf")}, "max_retry_after must be finite seconds >= 0"),
    ],
)
def test_bad_policy_arguments_raise_clear_errors(arguments, message):
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**arguments)


def test_policy_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        RetryPolicy((5, 15))  # type: ignore[misc]


def test_a_list_backoff_is_stored_as_a_tuple_of_floats():
    assert RetryPolicy(backoff=[1, 2.5]).backoff == (1.0, 2.5)


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"status_code": 200, "failure": FailureKind.TIMEOUT},
        {"status_code": 200, "acknowledgement": "stream S seq 1"},
        {"failure": FailureKind.REJECTED, "acknowledgement": "stream S seq 1"},
    ],
)
def test_attempt_result_needs_exactly_one_of_status_failure_or_acknowledgement(arguments):
    with pytest.raises(ValueError, match="exactly one of a status_code, a failure or an acknowledgement"):
        AttemptResult(**arguments)


def test_an_answer_is_a_status_an_acknowledgement_or_a_brokers_refusal_of_the_message():
    """What the hung-send threshold learns from: how long a receiver or a broker takes to answer."""
    assert AttemptResult(status_code=503).answered
    assert AttemptResult(acknowledgement="stream ORDERS seq 42").answered
    assert AttemptResult(failure=FailureKind.REJECTED, error="no stream for the subject").answered
    assert not AttemptResult(failure=FailureKind.TIMEOUT, error="deadline").answered
    assert not AttemptResult(failure=FailureKind.CONNECTION, error="refused").answered
