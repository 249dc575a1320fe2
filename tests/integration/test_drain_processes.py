"""The drain's invariants across worker processes (tests/support/drain_worker.py).

Two processes claim disjoint rows; a worker killed with SIGKILL mid-batch
loses nothing; a row that kills its worker every time still ends ``stuck``
because each attempt is committed before the send.  Workers run on a frozen
clock passed with ``--now``, so the test decides when leases run out.
"""

from __future__ import annotations

import re
from datetime import timedelta

from tests.support.database import sqlalchemy_url
from tests.support.drain_worker import WorkerProcess, worker_environment
from tests.support.models import SampleEvent
from tests.support.receiver import Reply

LEASE = timedelta(seconds=SampleEvent.__outbox__.lease_seconds)
POISON_MAX_ATTEMPTS = 3


def claimed_count(line: str) -> int:
    """The ``claimed=`` count of a worker's ``batch`` line (0 for other lines)."""
    match = re.match(r"batch claimed=(\d+) ", line)
    return int(match.group(1)) if match else 0


def test_two_drain_processes_deliver_every_row_exactly_once(database_url, insert_events, read_events, receiver, clock):
    insert_events([{"n": n} for n in range(2000)])
    arguments = ("--now", clock.now().isoformat(), "--until-idle", "--wait-for-go")
    # Small batches mean many claims, so the two workers' claims often run at the same moment.
    environment = worker_environment(batch_size=10)
    with WorkerProcess(sqlalchemy_url(database_url), *arguments, environment=environment) as first, WorkerProcess(
        sqlalchemy_url(database_url), *arguments, environment=environment
    ) as second:
        workers = (first, second)
        for worker in workers:
            worker.wait_for_line(lambda line: line.startswith("ready"))
        for worker in workers:
            worker.go()
        assert [worker.wait(timeout=120) for worker in workers] == [0, 0], [worker.stderr for worker in workers]
        claimed = [sum(claimed_count(line) for line in worker.lines) for worker in workers]

    assert all(count > 0 for count in claimed), f"both workers must have taken part: {claimed}"
    assert sum(claimed) == 2000
    counts = receiver.count_by_key()
    rows = read_events()
    assert set(counts) == {str(row.idempotency_key) for row in rows.values()}
    assert set(counts.values()) == {1}, "a row was delivered twice"
    assert {(row.status, row.attempts) for row in rows.values()} == {("done", 1)}


def test_a_worker_killed_mid_batch_loses_no_row_and_redelivers_with_the_same_key(
    database_url, insert_events, read_events, make_drainer, receiver, clock
):
    ids = insert_events([{"n": n} for n in range(20)])
    receiver.respond = lambda request: Reply(hang=True)
    started_at = clock.now()
    with WorkerProcess(sqlalchemy_url(database_url), "--now", started_at.isoformat()) as worker:
        receiver.wait_for(lambda r: len(r.requests) == min(SampleEvent.__outbox__.concurrency, len(ids)))
        worker.kill()
        assert worker.process.returncode == -9
    receiver.respond = lambda request: Reply()
    receiver.release()
    first_keys = receiver.keys()

    rows = read_events()
    assert sorted(rows) == ids, "no row may be lost"
    for row in rows.values():
        # Every row of the batch was claimed (attempt counted) before any send, sent or not.
        assert (row.status, row.attempts) == ("pending", 1)
        assert row.claim_token is not None
        assert row.claimed_until == row.next_attempt_at == started_at + LEASE

    drainer = make_drainer()
    clock.set(started_at + LEASE - timedelta(microseconds=1))
    assert drainer.drain_once().claimed == 0, "a held row is not taken before its lease ends"
    clock.set(started_at + LEASE)
    assert drainer.drain().delivered == 20

    rows = read_events()
    assert {(row.status, row.attempts) for row in rows.values()} == {("done", 2)}
    counts = receiver.count_by_key()
    assert set(counts) == {str(row.idempotency_key) for row in rows.values()}
    for key in first_keys:
        assert counts[key] == 2, "a redelivery carries the key of the first attempt"


def test_a_row_that_kills_its_worker_every_time_ends_stuck_and_its_batch_mates_are_delivered(
    database_url, insert_events, read_events, make_drainer, receiver, clock
):
    # Fewer attempts than the class's 5 (set through the settings, as an operator
    # would) keep the test short.  The poison row sits in the middle of one batch.
    max_attempts = POISON_MAX_ATTEMPTS
    ids = insert_events([{"n": n} for n in range(10)] + [{"poison": True}] + [{"n": n} for n in range(11, 21)])
    poison_id = ids[10]
    environment = worker_environment(max_attempts=max_attempts)

    exit_codes = []
    for _ in range(max_attempts):
        arguments = ("--now", clock.now().isoformat(), "--poison-kills", "--until-idle")
        with WorkerProcess(sqlalchemy_url(database_url), *arguments, environment=environment) as worker:
            exit_codes.append(worker.wait(timeout=60))
        clock.advance(LEASE)
    # The attempts were all spent by the kills: the next claim parks the row instead of sending it.
    parking = make_drainer(max_attempts=max_attempts).drain()

    assert exit_codes == [-9] * max_attempts, "every attempt killed its worker"
    assert (parking.claimed, parking.stuck) == (0, 1)
    rows = read_events()
    poison = rows[poison_id]
    assert poison.status == "stuck" and poison.attempts == max_attempts
    assert f"max attempts ({max_attempts}) reached" in poison.last_error
    assert "recorded no outcome" in poison.last_error
    assert str(poison.idempotency_key) not in receiver.keys()
    neighbours = [rows[row_id] for row_id in ids if row_id != poison_id]
    assert {row.status for row in neighbours} == {"done"}
    # The first kill may take the whole batch down; after that the poison row is claimed alone.
    assert max(row.attempts for row in neighbours) <= 2
