"""The drain loop's wait between claims: backing off while due rows stay locked, sleeping until the next due time.

The drain loops against the real database are in tests/integration/test_worker.py.
"""

from __future__ import annotations


def test_the_loop_backs_off_while_due_rows_stay_locked_and_sleeps_until_the_next_due_time():
    from datetime import datetime, timedelta, timezone

    from outboxkit.drain.drainer import DrainResult
    from outboxkit.drain.loop import RETRY_CLAIM_MAX_SECONDS, RETRY_CLAIM_SECONDS, Background, PumpState

    background = Background(DrainResult(job_name="sample-events"), poll_seconds=60.0)
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    # Due rows that the last claim could not take (another transaction holds their locks): back off, doubling.
    state = PumpState(more_due=False, next_due=now - timedelta(seconds=1))
    waits = [background.wait_seconds(state, blocked=False, now=now) for _ in range(12)]
    assert waits[:3] == [RETRY_CLAIM_SECONDS, RETRY_CLAIM_SECONDS * 2, RETRY_CLAIM_SECONDS * 4]
    assert waits[-1] == RETRY_CLAIM_MAX_SECONDS and waits == sorted(waits)
    # A row due in 5 s: sleep exactly until then; nothing known: the safety-net poll.
    state.next_due = now + timedelta(seconds=5)
    assert background.wait_seconds(state, blocked=False, now=now) == 5.0
    assert background.wait_seconds(PumpState(more_due=False), blocked=False, now=now) == 60.0
    # Far in the future: never longer than the poll.  Waiting for outcomes: no timer at all.
    state.next_due = now + timedelta(hours=2)
    assert background.wait_seconds(state, blocked=False, now=now) == 60.0
    assert background.wait_seconds(PumpState(more_due=True, in_flight=3), blocked=False, now=now) is None


def test_a_claims_earliest_due_read_waits_for_an_outcome_at_most_its_short_delay():
    from datetime import datetime, timedelta, timezone

    from outboxkit.drain.drainer import DrainResult
    from outboxkit.drain.loop import DUE_READ_DELAY_SECONDS, Background, PumpState

    background = Background(DrainResult(job_name="sample-events"), poll_seconds=60.0)
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    # A short claim's sends are out: the loop waits for their outcome, or the delay, whichever comes first.
    state = PumpState(more_due=False, in_flight=1, due_read="short")
    assert background.wait_seconds(state, blocked=False, now=now) == DUE_READ_DELAY_SECONDS
    # A sooner timer still wins; once read, the loop waits as before.
    state.next_due = now + timedelta(seconds=DUE_READ_DELAY_SECONDS / 2)
    assert background.wait_seconds(state, blocked=False, now=now) == DUE_READ_DELAY_SECONDS / 2
    state.due_read, state.next_due = None, None
    assert background.wait_seconds(state, blocked=False, now=now) == 60.0


def test_the_loop_looks_for_hung_sends_only_while_a_send_out_can_still_become_hung():
    from outboxkit.drain.hung_sends import HungSends
    from outboxkit.drain.loop import PumpState

    on, off = HungSends(after=1.0, limit=4), HungSends(after=None, limit=4)
    state = PumpState(in_flight=2, hung=1, hung_check_at=100.0)
    # A send out is not hung yet: the seconds until the next look, 0 once it is due (the pump looks now).
    assert state.hung_check_in(on, now=99.5) == 0.5
    assert state.hung_check_in(on, now=100.0) == 0.0
    assert state.hung_check_in(on, now=101.0) == 0.0
    # Hung sends off, nothing in flight, or every send out hung already: nothing to look for, no timer.
    assert state.hung_check_in(off, now=101.0) is None
    assert PumpState(hung_check_at=100.0).hung_check_in(on, now=101.0) is None
    assert PumpState(in_flight=2, hung=2, hung_check_at=100.0).hung_check_in(on, now=101.0) is None
