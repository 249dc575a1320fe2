"""Broker faults: the broker restarted mid-batch, and the sending worker SIGKILLed between publish and outcome.

Each test starts a broker of its own (tests/faults/broker_targets.py) and checks, by reading back every message the
broker stored, that no row is lost and how many it stored twice.  A duplicate needs a send whose acknowledgement
never reached the outcome: a send that timed out or was cut while the broker was frozen and stopped (at most one per
failed attempt), or a row a killed worker held a claim on (the send it held, and the rest of its claims).
JetStream drops the second copy of an id within its duplicate window, so for NATS the count is 0 and the broker's
own "duplicate" answers show the window at work; Redis and RabbitMQ do not de-duplicate, and their count is
measured and bounded (docs/transports.md).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, func, select

from outboxkit import Drainer
from tests.faults.broker_targets import FAULT_OPTIONS, TRANSPORTS, BrokerTarget, make_transport, start_target
from tests.faults.broker_worker import kill_mid_batch
from tests.faults.figures import ScenarioFigures
from tests.faults.scenario import LONG_VARIANT, SEED_VARIABLE, fault_seed
from tests.support.brokers import insert_rows
from tests.support.database import sqlalchemy_url
from tests.support.models import SampleEvent

SETTLE_SECONDS = 180.0


# Rows and SIGKILLs: a short default variant, a long one for pytest -m slow.
SIZES = pytest.mark.parametrize(
    ("rows", "kills"), [pytest.param(600, 2, id="ci"), pytest.param(10_000, 5, id="long", marks=LONG_VARIANT)]
)


def publish(request: pytest.FixtureRequest, scenario: str, title: str, faults: str, fault_count: int, rows: int,
            duplicates: int, started: float, **details: object) -> None:
    """The scenario's figures, printed and written for bench/faults_report.py (tests/faults/figures.py)."""
    ScenarioFigures(
        scenario=scenario, title=title, variant=request.node.callspec.id.split("-")[-1], faults=faults,
        fault_count=fault_count, rows=rows, lost=0, duplicates=duplicates, seed=fault_seed(),
        seconds=round(time.monotonic() - started, 1),
        command=f"{SEED_VARIABLE}={fault_seed()} .venv/bin/python -m pytest '{request.node.nodeid}' -m 'slow or not slow'",
        details=dict(details),
    ).publish()


@pytest.fixture(params=TRANSPORTS)
def target(request: pytest.FixtureRequest) -> Iterator[BrokerTarget]:
    started = start_target(request.param)
    try:
        yield started
    finally:
        started.close()


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        statement = select(SampleEvent.status, func.count()).group_by(SampleEvent.status)
        return {status: count for status, count in connection.execute(statement)}


def keys_and_attempts(engine: Engine) -> tuple[set[str], int]:
    with engine.connect() as connection:
        rows = connection.execute(select(SampleEvent.idempotency_key, SampleEvent.attempts)).all()
    return {str(key) for key, _ in rows}, sum(attempts for _, attempts in rows)


def last_errors(engine: Engine) -> list[str | None]:
    """What the last attempts of a few rows not done said, for a failure's message."""
    with engine.connect() as connection:
        statement = select(SampleEvent.last_error).where(SampleEvent.status != "done").order_by(SampleEvent.id).limit(3)
        return list(connection.scalars(statement))


def failed_attempts(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(select(func.count()).where(SampleEvent.last_error.is_not(None))) or 0)


def claimed(engine: Engine) -> int:
    """Rows under a live claim now (the database's clock)."""
    with engine.connect() as connection:
        live = (SampleEvent.status == "pending") & (SampleEvent.claimed_until > func.now())
        return int(connection.scalar(select(func.count()).where(live)) or 0)


def wait_for(engine: Engine, condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s; rows not done say {last_errors(engine)}")
        time.sleep(0.05)


@SIZES
def test_a_broker_restarted_mid_batch_loses_no_row_and_its_duplicates_are_bounded(
    request: pytest.FixtureRequest, target: BrokerTarget, engine: Engine, rows: int, kills: int
) -> None:
    started = time.monotonic()
    insert_rows(engine, target.url, [{"n": n} for n in range(rows)])
    transport = make_transport(target.name)
    drainer = Drainer(engine, SampleEvent, transport=transport, options=FAULT_OPTIONS)
    drainer.start(poll_seconds=0.5)
    try:
        wait_for(engine, lambda: counts(engine).get("done", 0) >= rows // 4, timeout=SETTLE_SECONDS, what="a quarter done")
        # Frozen first, so the stop lands on sends in flight: some time out and are sent again into the frozen broker,
        # whose answers to the rest may or may not leave before it stops.
        target.server.pause()
        wait_for(engine, lambda: failed_attempts(engine) > 0, timeout=SETTLE_SECONDS, what="a send timed out")
        target.restart()
        at_restart = counts(engine).get("done", 0)
        wait_for(engine, lambda: counts(engine).get("done", 0) == rows, timeout=SETTLE_SECONDS, what="every row done")
    finally:
        drainer.close()
        transport.close()

    keys, attempts = keys_and_attempts(engine)
    stored = target.stored()
    assert at_restart < rows, "the restart came after the last row: it tested nothing"
    assert attempts > rows, "no send failed while the broker was away: the restart tested nothing"
    assert not stored.missing(keys), f"{len(stored.missing(keys))} rows done but not in {target.name}"
    assert set(stored.copies) == keys
    publish(
        request, f"broker-restart-{target.name}", f"broker restarted mid-batch ({target.name})",
        f"{target.name} frozen, then stopped by pid and started again on its port and data", 1, rows, stored.duplicates,
        started, done_at_restart=at_restart, failed_attempts=attempts - rows,
    )
    if target.name == "nats":
        assert stored.duplicates == 0, "JetStream's duplicate window should drop every resent Nats-Msg-Id"
    else:
        # A second copy comes only from a send whose answer never came back (it timed out while the broker was frozen,
        # or the stop cut it): at most one per failed attempt.
        assert stored.duplicates <= attempts - rows


@SIZES
def test_a_worker_killed_between_publish_and_outcome_loses_no_row(
    request: pytest.FixtureRequest, target: BrokerTarget, engine: Engine, database_url: str, rows: int, kills: int
) -> None:
    started = time.monotonic()
    insert_rows(engine, target.url, [{"n": n} for n in range(rows)])

    report = kill_mid_batch(
        sqlalchemy_url(database_url), target.name, kills=kills, rng=random.Random(f"{fault_seed()}/{target.name}"),
        settled=lambda: counts(engine).get("done", 0) == rows, claimed=lambda: claimed(engine), timeout=SETTLE_SECONDS,
    )

    keys, _ = keys_and_attempts(engine)
    stored = target.stored()
    assert report.kills == kills
    assert not stored.missing(keys), f"{len(stored.missing(keys))} rows done but not in {target.name}"
    assert set(stored.copies) == keys
    publish(
        request, f"broker-kill-{target.name}", f"drainer SIGKILLed between publish and outcome ({target.name})",
        f"{kills} x SIGKILL of the worker holding an acknowledged send", kills, rows, stored.duplicates, started,
        **{f"duplicates_after_kill_{target.name}": stored.duplicates, "rows_under_claim_at_kills": report.held_at_kills,
           "acknowledged_as_duplicates": report.acknowledged_as_duplicates},
    )
    if target.name == "nats":
        assert stored.duplicates == 0
        # Each kill left at least its held row accepted and unrecorded; its resend met the window.
        assert report.acknowledged_as_duplicates >= kills
    else:
        # Each killed worker's held row at least; at most the rows it held claims on when it died.
        assert kills <= stored.duplicates <= report.held_at_kills
