"""The schedule loop's sleep: a wake ends it, a re-arm shortens it, and neither is lost between two sleeps."""

from __future__ import annotations

import threading

from outboxkit.schedules.alarm import LoopAlarm

LONG = 3600.0  # a sleep no test waits out: each one must end early


def test_a_wake_before_the_sleep_ends_it_at_once_and_only_once():
    alarm = LoopAlarm()
    alarm.wake()
    assert alarm.woken
    alarm.sleep(LONG)
    assert not alarm.woken
    alarm.sleep(0)  # the wake was spent: a sleep of nothing returns, not a pending wake


def test_a_rearm_during_a_turn_shortens_the_next_sleep():
    alarm = LoopAlarm()
    alarm.rearm(0)  # a run ended while the loop was busy with its turn
    alarm.rearm(LONG)  # a later deadline does not push the earlier one back
    alarm.sleep(LONG)


def test_a_rearm_or_a_wake_from_another_thread_ends_the_sleep_in_progress():
    for signal in (lambda alarm: alarm.rearm(0), LoopAlarm.wake):
        alarm = LoopAlarm()
        slept = threading.Event()
        sleeper = threading.Thread(target=lambda alarm=alarm, slept=slept: (alarm.sleep(LONG), slept.set()))
        sleeper.start()
        signal(alarm)
        assert slept.wait(30), "the sleep went on"
        sleeper.join()
