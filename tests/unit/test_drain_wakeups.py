"""What the pending wake-up (outboxkit.storage.wakeups) asks of the drain loop, decided without a database."""

from __future__ import annotations

from datetime import datetime, timezone

from outboxkit.drain.loop import Background, PumpState
from outboxkit.drain.pump import SendPump
from outboxkit.results import DrainResult
from outboxkit.storage.wakeups import RECHECK_MAX_SECONDS, RECHECK_SECONDS, lock_key, trigger_body

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)


def test_a_loop_that_caught_up_without_clearing_claims_once_more_clearing_first():
    state = PumpState(more_due=False, clear_first=False)
    assert SendPump._follow_wakeup(state, None, caught_up=True) is False  # its due read waits for that claim
    assert state.more_due and state.clear_first and not state.wakeup_held


def test_a_busy_loop_does_not_clear_and_a_caught_up_one_clears_before_its_next_claim():
    state = PumpState(more_due=True)
    assert SendPump._follow_wakeup(state, True, caught_up=False) is True
    assert not state.clear_first  # a full claim: inserts meanwhile rely on the loop claiming again anyway
    state.more_due = False
    assert SendPump._follow_wakeup(state, True, caught_up=True) is True
    assert state.clear_first and not state.more_due and not state.wakeup_held  # it may wait: the clear held


def test_while_an_insert_keeps_the_clear_from_its_lock_the_loop_claims_again_soon_backing_off_to_a_bound():
    state = PumpState(more_due=False)
    assert SendPump._follow_wakeup(state, False, caught_up=True) is True
    assert state.wakeup_held and state.clear_first
    background: Background[DrainResult] = Background(DrainResult(job_name="x"), poll_seconds=3600)
    waits = [background.wait_seconds(state, blocked=False, now=NOW) for _ in range(8)]
    assert waits[0] == RECHECK_SECONDS
    assert waits == sorted(waits) and max(w for w in waits if w is not None) == RECHECK_MAX_SECONDS
    SendPump._follow_wakeup(state, True, caught_up=True)  # cleared at last: waits as before, from the start again
    assert not state.wakeup_held and state.recheck_wait == RECHECK_SECONDS
    assert background.wait_seconds(state, blocked=False, now=NOW) == 3600


def test_the_trigger_notifies_only_without_a_pending_wake_up_and_takes_its_channels_lock():
    body = trigger_body("outboxkit_it's")
    assert "pg_advisory_xact_lock_shared" in body and str(lock_key("outboxkit_it's")) in body
    assert "channel = 'outboxkit_it''s'" in body  # quoted
    assert body.count("pg_notify") == 2  # without the table (before the migration), and without a pending one
    assert -(2**31) <= lock_key("outboxkit_orders") < 2**31 and lock_key("a") != lock_key("b")
