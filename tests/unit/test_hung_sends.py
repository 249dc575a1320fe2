"""Hung sends: the threshold (``after``, or four times the destination's slowest recent answer; for a destination
not yet answered, a multiple of the outbox's answers within ``after``), the bound, the counts."""

from __future__ import annotations

from outboxkit.drain.hung_sends import (
    ANSWER_MULTIPLE,
    ANSWERS_FORGOTTEN_AFTER_SECONDS,
    ANSWERS_KEPT,
    FIRST_ANSWER_FLOOR_SECONDS,
    HungSends,
)


def test_a_send_is_hung_after_its_threshold_and_not_before():
    changes: list[int] = []
    hung = HungSends(after=1.0, limit=4, on_change=changes.append)
    owner = object()
    hung.started("a", owner=owner, destination="dead", now=100.0)
    assert hung.mark_overdue(owner, now=100.9) == 0
    assert abs(hung.next_check(owner, now=100.9) - 0.1) < 1e-9  # type: ignore[operator]
    assert hung.mark_overdue(owner, now=101.0) == 1
    assert hung.count == 1 and hung.by_destination() == {"dead": 1} and changes == [1]
    assert hung.mark_overdue(owner, now=105.0) == 0  # marked once
    assert hung.finished("a", answered_in=None) is True
    assert hung.count == 0 and hung.by_destination() == {} and changes == [1, 0]


def test_a_destination_that_answers_slowly_gets_a_multiple_of_its_slowest_recent_answer():
    hung = HungSends(after=1.0, limit=4)
    owner = object()
    assert hung.threshold("slow") == 1.0  # no answer yet
    for n in range(3):
        hung.started(n, owner=owner, destination="slow", now=0.0)
        hung.finished(n, answered_in=[2.0, 0.5, 1.0][n])
    assert hung.threshold("slow") == ANSWER_MULTIPLE * 2.0
    hung.started("fast", owner=owner, destination="fast", now=0.0)
    hung.finished("fast", answered_in=0.01)
    assert hung.threshold("fast") == 1.0  # never below after
    for n in range(ANSWERS_KEPT):  # the slow answer leaves the window
        hung.started(("again", n), owner=owner, destination="slow", now=0.0)
        hung.finished(("again", n), answered_in=0.5)
    assert hung.threshold("slow") == ANSWER_MULTIPLE * 0.5
    hung.started("no answer", owner=owner, destination="slow", now=0.0)
    hung.finished("no answer", answered_in=None)  # a timeout says nothing about how fast it answers
    assert hung.threshold("slow") == ANSWER_MULTIPLE * 0.5


def test_no_more_than_limit_sends_are_hung_at_once_and_each_owner_marks_only_its_own():
    hung = HungSends(after=1.0, limit=2)
    mine, theirs = object(), object()
    for n in range(3):
        hung.started(n, owner=mine, destination="dead", now=0.0)
    hung.started("other", owner=theirs, destination="dead", now=0.0)
    assert hung.mark_overdue(mine, now=5.0) == 2
    assert hung.mark_overdue(theirs, now=5.0) == 0  # the bound is reached
    assert hung.next_check(mine, now=5.0) == 1.0  # looked at again within `after`
    assert hung.finished(0, answered_in=None) is True
    assert hung.mark_overdue(theirs, now=5.0) == 1
    assert hung.finished(2, answered_in=None) is False  # it never counted as hung


def test_turned_off_nothing_is_ever_hung():
    hung = HungSends(after=None, limit=2)
    owner = object()
    hung.started("a", owner=owner, destination="dead", now=0.0)
    assert hung.mark_overdue(owner, now=1e9) == 0 and hung.next_check(owner) is None
    assert hung.finished("a", answered_in=None) is False and not hung.enabled


def test_a_destination_not_yet_answered_is_hung_at_a_multiple_of_the_outboxs_answers_within_after():
    hung = HungSends(after=1.0, limit=4)
    owner = object()
    assert hung.threshold("dead") == 1.0  # nobody has answered: after
    hung.started("ok", owner=owner, destination="healthy", now=0.0)
    hung.finished("ok", answered_in=0.005)
    assert hung.threshold("dead") == FIRST_ANSWER_FLOOR_SECONDS  # 4 x 5 ms is below the floor
    hung.started("slower", owner=owner, destination="healthy", now=0.0)
    hung.finished("slower", answered_in=0.05)
    assert hung.threshold("dead") == ANSWER_MULTIPLE * 0.05
    assert hung.threshold("healthy") == 1.0  # one that has answered: never below after
    hung.started("slow", owner=owner, destination="other", now=0.0)
    hung.finished("slow", answered_in=2.0)
    assert hung.threshold("dead") == 1.0  # never above after
    hung.started("d", owner=owner, destination="dead", now=10.0)
    assert hung.mark_overdue(owner, now=10.99) == 0 and hung.mark_overdue(owner, now=11.0) == 1


def test_a_threshold_is_that_of_the_moment_not_of_the_sends_start():
    """A blackholed destination's first sends start before anyone has answered: once the others answer, they are
    hung at the shorter threshold, not at the one they started with."""
    hung = HungSends(after=1.0, limit=4)
    owner = object()
    hung.started("dead", owner=owner, destination="dead", now=0.0)  # nobody has answered: 1 s
    assert hung.next_check(owner, now=0.0) == 1.0
    hung.started("ok", owner=owner, destination="healthy", now=0.0)
    hung.finished("ok", answered_in=0.01)
    assert hung.next_check(owner, now=0.05) == FIRST_ANSWER_FLOOR_SECONDS - 0.05
    assert hung.mark_overdue(owner, now=0.1) == 1 and hung.by_destination() == {"dead": 1}


def test_answers_of_destinations_idle_past_the_bound_are_forgotten_and_the_first_answer_rule_applies_again():
    """Many destinations answered once and then idle: their answers are forgotten once the bound has passed, so a
    drainer that sends to tens of thousands of receivers keeps only those that answered lately; a forgotten one is
    treated as one not yet answered (the documented rule, from the outbox's latest answers)."""
    hung = HungSends(after=1.0, limit=4)
    owner = object()
    for n in range(2_000):  # enough that the table is compacted once they go
        hung.started(n, owner=owner, destination=f"tenant-{n}", now=0.0)
        hung.finished(n, answered_in=2.0, now=0.0)  # slow receivers: 8 s thresholds
    assert len(hung.answered()) == 2_000
    assert hung.threshold("tenant-7") == ANSWER_MULTIPLE * 2.0
    hung.started("late", owner=owner, destination="tenant-late", now=ANSWERS_FORGOTTEN_AFTER_SECONDS - 1)
    hung.finished("late", answered_in=0.05, now=ANSWERS_FORGOTTEN_AFTER_SECONDS - 1)
    assert len(hung.answered()) == 2_001  # nothing is old yet
    hung.started("now", owner=owner, destination="tenant-now", now=ANSWERS_FORGOTTEN_AFTER_SECONDS)
    hung.finished("now", answered_in=0.05, now=ANSWERS_FORGOTTEN_AFTER_SECONDS)
    assert hung.answered() == {"tenant-late", "tenant-now"}
    assert hung.threshold("tenant-7") == hung.threshold("never-answered")  # the rule for one not yet answered
    assert hung.threshold("tenant-late") == 1.0  # its own answers: never below after


def test_a_destination_with_a_send_out_keeps_its_answers_however_old():
    """The answers of a destination with a send out set that send's threshold: they are kept past the bound."""
    hung = HungSends(after=1.0, limit=4)
    owner = object()
    hung.started("first", owner=owner, destination="slow", now=0.0)
    hung.finished("first", answered_in=2.0, now=0.0)
    hung.started("out", owner=owner, destination="slow", now=1.0)  # out for longer than the bound
    hung.started("other", owner=owner, destination="other", now=ANSWERS_FORGOTTEN_AFTER_SECONDS + 1)
    hung.finished("other", answered_in=0.05, now=ANSWERS_FORGOTTEN_AFTER_SECONDS + 1)
    assert hung.answered() == {"slow", "other"}
    assert hung.threshold("slow") == ANSWER_MULTIPLE * 2.0
    hung.finished("out", answered_in=None, now=ANSWERS_FORGOTTEN_AFTER_SECONDS + 2)  # a timeout: no new answer
    hung.started("again", owner=owner, destination="other", now=3 * ANSWERS_FORGOTTEN_AFTER_SECONDS)
    hung.finished("again", answered_in=0.05, now=3 * ANSWERS_FORGOTTEN_AFTER_SECONDS)
    assert hung.answered() == {"other"}  # nothing out any more, and old: forgotten
