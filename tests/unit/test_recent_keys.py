"""RecentKeys: which keys a per-destination table forgets, and when it compacts (pure, explicit clock values)."""

from __future__ import annotations

import pytest

from outboxkit.destinations.recent_keys import RecentKeys


def never_busy(key: str) -> bool:
    return False


def test_keys_idle_for_the_bound_are_returned_once_and_removed():
    recent: RecentKeys[str] = RecentKeys(10.0)
    assert recent.use("a", 0.0, busy=never_busy) == []
    assert recent.use("b", 5.0, busy=never_busy) == []
    assert recent.use("c", 9.9, busy=never_busy) == []  # a is 9.9 s idle: kept
    assert recent.use("c", 10.0, busy=never_busy) == ["a"]
    assert recent.keys() == {"b", "c"}
    assert recent.use("c", 15.0, busy=never_busy) == ["b"]
    assert "b" not in recent and len(recent) == 1


def test_a_use_makes_a_key_recent_again():
    recent: RecentKeys[str] = RecentKeys(10.0)
    recent.use("a", 0.0, busy=never_busy)
    recent.use("b", 1.0, busy=never_busy)
    recent.use("a", 8.0, busy=never_busy)
    assert recent.use("c", 12.0, busy=never_busy) == ["b"]  # a was used at 8: 4 s idle
    assert recent.keys() == {"a", "c"}


def test_a_busy_key_is_kept_and_looked_at_again_one_bound_later():
    recent: RecentKeys[str] = RecentKeys(10.0)
    looked_at: list[str] = []

    def busy(key: str) -> bool:
        looked_at.append(key)
        return key == "hung"

    recent.use("hung", 0.0, busy=busy)
    recent.use("idle", 0.0, busy=busy)
    assert recent.use("new", 10.0, busy=busy) == ["idle"]
    assert looked_at == ["hung", "idle"]
    looked_at.clear()
    assert recent.use("new", 19.0, busy=busy) == []  # hung was noted as used at 10: not looked at before 20
    assert looked_at == []
    assert recent.use("new", 20.0, busy=busy) == []
    assert looked_at == ["hung"]
    assert recent.keys() == {"hung", "new"}


def test_a_use_while_every_key_is_recent_looks_at_no_other_key():
    recent: RecentKeys[int] = RecentKeys(60.0)
    for key in range(1_000):
        recent.use(key, float(key) / 100, busy=never_busy)
    looked_at: list[int] = []
    assert recent.use(5, 11.0, busy=lambda key: looked_at.append(key) is not None) == []
    assert looked_at == []


def test_compaction_is_due_once_the_keys_kept_fall_under_an_eighth_of_their_peak():
    recent: RecentKeys[int] = RecentKeys(10.0, compact_from=100)
    for key in range(200):
        recent.use(key, 0.0, busy=never_busy)
    assert not recent.compact_due()
    gone = recent.use(-1, 10.0, busy=never_busy)  # every key of time 0 goes at once
    assert sorted(gone) == list(range(200))
    assert recent.compact_due()
    assert not recent.compact_due()  # said once
    assert recent.keys() == {-1}


def test_a_small_table_is_never_compacted():
    recent: RecentKeys[int] = RecentKeys(10.0, compact_from=100)
    for key in range(50):
        recent.use(key, 0.0, busy=never_busy)
    recent.use(-1, 10.0, busy=never_busy)
    assert len(recent) == 1
    assert not recent.compact_due()


@pytest.mark.parametrize("after", [0.0, -1.0])
def test_the_bound_must_be_positive(after):
    with pytest.raises(ValueError, match="after must be positive seconds"):
        RecentKeys(after)
