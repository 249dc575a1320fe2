"""A kit's pooler verdict: a refusal is kept and told once, and the leader's re-check is paced."""

from __future__ import annotations

from outboxkit.errors import ConfigurationError
from outboxkit.storage.pooler_verdict import PoolerVerdict


def test_the_first_refusal_is_kept_and_told_once_to_every_listener_even_a_late_one():
    verdict = PoolerVerdict()
    told: list[str] = []
    verdict.on_refusal(lambda error: told.append(f"early: {error}"))
    first, second = ConfigurationError("first"), ConfigurationError("second")
    verdict.refuse(first)
    verdict.refuse(second)
    assert verdict.refusal is first and told == ["early: first"]
    verdict.on_refusal(lambda error: told.append(f"late: {error}"))
    assert told == ["early: first", "late: first"]


def test_a_listener_that_raises_does_not_keep_the_others_from_hearing():
    verdict = PoolerVerdict()
    told: list[str] = []

    def broken(error: ConfigurationError) -> None:
        raise RuntimeError("boom")

    verdict.on_refusal(broken)
    verdict.on_refusal(lambda error: told.append(str(error)))
    verdict.refuse(ConfigurationError("refused"))
    assert told == ["refused"]


def test_the_recheck_is_due_at_once_then_once_per_interval():
    verdict = PoolerVerdict()
    assert [verdict.recheck_due(now, every_seconds=60) for now in (100.0, 130.0, 159.9, 160.0, 200.0, 220.0)] == [
        True, False, False, True, False, True,
    ]


def test_the_first_answer_about_the_session_source_stands():
    verdict = PoolerVerdict()
    assert verdict.session_source_accepted is None and not verdict.engine_decided
    verdict.session_source_checked(False)
    verdict.session_source_checked(True)
    verdict.engine_checked()
    assert verdict.session_source_accepted is False and verdict.engine_decided
