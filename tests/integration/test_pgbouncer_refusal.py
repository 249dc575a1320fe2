"""An engine that prepares statements through a transaction pool is refused for good, by every part of the kit.

PgBouncer 1.18 (Debian's) in transaction mode loses prepared statements, so
psycopg's default engine (a statement is prepared on its 5th run) fails at
random through it, and a claim or an outcome that fails sends a row again.
In production the kit refuses such an engine.  The check behind the refusal
watches which server connection the pooler hands out next, which another
process starting at the same moment can disturb: the tests start two
processes together, round after round, and every round each of them must
refuse everything that runs through the engine, the drain loops and the
election alike, and neither may lead.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine

from outboxkit import ConfigurationError, OutboxKit, OutboxKitSettings
from outboxkit.drain import pooler_checks
from outboxkit.leader.election import ElectionState
from tests.support.database import sqlalchemy_url
from tests.support.leadership import holder_count, wait_until
from tests.support.models import SampleEvent
from tests.support.pgbouncer import PgBouncer, transaction_and_session_pools

ROUNDS = 4
LONG_ROUNDS = 20
ENGINE_POOL = {"pool_size": 3, "max_overflow": 2}
ROUND_SECONDS = 60


@pytest.fixture(scope="module")
def bouncers(database_factory) -> Iterator[dict[str, PgBouncer]]:
    with transaction_and_session_pools(database_factory.server, transaction_size=5, session_size=20) as pools:
        yield pools


def _start_rounds(engine_url: str, lock_url: str, rounds: int, barrier, results) -> None:
    """In a child process: ``rounds`` times, start a fresh kit as the lifespan does, at the same moment as the other."""

    async def one_round(kit: OutboxKit) -> tuple[bool, bool]:
        async with kit.lifespan(None):
            return kit.worker.running, kit.scheduler.election is not None

    for number in range(rounds):
        engine = create_engine(engine_url, **ENGINE_POOL)  # psycopg's default: prepares on a statement's 5th run
        settings = OutboxKitSettings(
            environment="production",
            lock_database_url=lock_url,
            leader_tick_seconds=0.1,
            standby_probe_seconds=0.2,
            drain_interval_seconds=3600,
            schedules_enabled=False,
        )
        kit = OutboxKit(engine, [SampleEvent], settings=settings)
        try:
            barrier.wait(ROUND_SECONDS)
            drains, campaigns = asyncio.run(one_round(kit))
            results.put((number, drains, campaigns))
        finally:
            kit.close()
            engine.dispose()


def _run_together(bouncers: dict[str, PgBouncer], database_url: str, rounds: int) -> list[tuple[int, bool, bool]]:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    engine_url = sqlalchemy_url(bouncers["transaction"].url_for(database_url))
    lock_url = bouncers["session"].url_for(database_url)
    processes = [
        context.Process(target=_start_rounds, args=(engine_url, lock_url, rounds, barrier, results)) for _ in range(2)
    ]
    for process in processes:
        process.start()
    found: list[tuple[int, bool, bool]] = []
    try:
        while len(found) < 2 * rounds:
            try:
                found.append(results.get(timeout=ROUND_SECONDS))
            except queue.Empty:
                pytest.fail(f"the processes reported {len(found)} of {2 * rounds} starts")
    finally:
        for process in processes:
            process.join(ROUND_SECONDS)
            if process.is_alive():
                process.kill()
                process.join()
    return found


def _assert_refused_every_time(found: list[tuple[int, bool, bool]]) -> None:
    started = [(number, drains, campaigns) for number, drains, campaigns in found if drains or campaigns]
    assert started == [], f"(round, drain loops started, election started) in a process that should refuse both: {started}"


def test_two_processes_starting_together_both_refuse_the_engine_everywhere(database_url, bouncers):
    _assert_refused_every_time(_run_together(bouncers, database_url, ROUNDS))


@pytest.mark.slow
def test_two_processes_starting_together_both_refuse_the_engine_everywhere_twenty_times(database_url, bouncers):
    _assert_refused_every_time(_run_together(bouncers, database_url, LONG_ROUNDS))


def test_an_engine_the_start_up_check_let_through_is_refused_on_the_leaders_tick(
    engine, database_url, bouncers, monkeypatch
):
    real_check = pooler_checks.automatic_prepares_through_a_pool
    checks: list[int | None] = []

    def fooled_once(engine, *, application_name: str) -> int | None:
        """The first check passes, as one fooled by another process does; every later one looks for real."""
        answer = None if not checks else real_check(engine, application_name=application_name)
        checks.append(answer)
        return answer

    monkeypatch.setattr(pooler_checks, "automatic_prepares_through_a_pool", fooled_once)
    pooled = create_engine(sqlalchemy_url(bouncers["transaction"].url_for(database_url)), **ENGINE_POOL)
    settings = OutboxKitSettings(
        environment="production",
        lock_database_url=bouncers["session"].url_for(database_url),
        leader_tick_seconds=0.1,
        standby_probe_seconds=0.2,
        drain_interval_seconds=3600,
    )
    kit = OutboxKit(pooled, [SampleEvent], settings=settings)
    try:
        kit.schedules.start()
        kit.worker.start()
        election = kit.scheduler.elect()  # decided once: the first check stands, no second look at start
        assert kit.worker.running and kit.schedules.running and checks == [None]
        assert election.wait_for(ElectionState.STOPPED, timeout=30), "the leader's re-check refuses and stops it"
        assert not kit.scheduler.running
        wait_until(lambda: not kit.worker.running, timeout=30, message="the drain loops stopped by the refusal")
        wait_until(lambda: not kit.schedules.running, timeout=30, message="the schedule loop stopped by the refusal")
        assert checks[-1] == 5
        with pytest.raises(ConfigurationError, match="refused its connections already"):
            kit.worker.start()  # the refusal sticks
        assert holder_count(engine) == 0
    finally:
        kit.schedules.stop()
        kit.close()
        pooled.dispose()


def test_the_schedule_loop_on_a_refused_engine_is_refused_too(database_url, bouncers):
    pooled = create_engine(sqlalchemy_url(bouncers["transaction"].url_for(database_url)), **ENGINE_POOL)
    settings = OutboxKitSettings(
        environment="production", lock_database_url=bouncers["session"].url_for(database_url), drain_interval_seconds=3600
    )
    kit = OutboxKit(pooled, [SampleEvent], settings=settings)
    try:
        with pytest.raises(ConfigurationError, match="prepare_threshold=5"):
            kit.schedules.start()  # the loop claims and fires through the engine as well
        assert not kit.schedules.running
        with pytest.raises(ConfigurationError, match="refused its connections already"):
            kit.worker.start()
        kit.schedules.start_in_background()  # as the lifespan starts it: one error line, no retries
        wait_until(lambda: "did not start" in (kit.schedules.readiness() or ""), timeout=30, message="the refusal")
        assert "refused its connections already" in kit.schedules.readiness() and not kit.schedules.running
    finally:
        kit.schedules.stop()
        kit.close()
        pooled.dispose()
