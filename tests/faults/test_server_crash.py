"""PostgreSQL killed with SIGKILL mid-drain: with synchronous commit (the default) nothing committed is forgotten.

The test runs its own PostgreSQL cluster (``tests/faults/private_server.py``;
the shared server is never touched), fills a ``FaultEvent`` outbox aimed at
a real receiver on 127.0.0.1, and drains it from a thread with the kit's
default commit durability.  Once the receiver has seen a share of the rows, the
test reads every row's committed state, then kills the postmaster and each
of its processes with SIGKILL (the WAL buffers in shared memory are lost, as
in a power cut), starts the server again (crash recovery) and lets the drain
finish against it.

The checks, per row and its idempotency key:

* nothing committed is forgotten: ``attempts`` never went below what was
  committed before the kill, and a row ``done`` then is ``done`` after;
* ``attempts`` counts every send: each delivery carries the attempt number
  the claim committed, and the receiver never sees one number twice for a
  key (a forgotten claim would send its number again) nor a number above
  the row's ``attempts``.  A claim whose commit reached the disk while the
  kill cut off its answer is counted and never sent; those rows (at most the
  one batch being claimed at the kill) have one attempt more than sends;
* every row ends ``done``.
"""

from __future__ import annotations

import collections
import threading
import time

import psycopg
import pytest
from sqlalchemy import create_engine, insert

from outboxkit import Drainer, HttpTransport
from outboxkit.storage.tables import kit_metadata
from tests.faults.models import FAULT_OPTIONS, FaultEvent, install_fault_schema
from tests.faults.private_server import PrivateServer, postgres_binaries
from tests.support.database import sqlalchemy_url
from tests.support.receiver import Receiver, Reply

ROWS = 600
KILL_AFTER_SENDS = 150
FINISH_TIMEOUT = 180.0

binaries = postgres_binaries()
pytestmark = [
    pytest.mark.skipif(binaries is None, reason="needs PostgreSQL's initdb and pg_ctl (/usr/lib/postgresql/*/bin)"),
    pytest.mark.timeout(600),
]


def committed_state(database_url: str) -> dict[int, tuple[int, str]]:
    with psycopg.connect(database_url) as connection:
        rows = connection.execute("SELECT id, attempts, status FROM fault_event_outbox").fetchall()
    return {row_id: (attempts, status) for row_id, attempts, status in rows}


def keys_by_row(database_url: str) -> dict[int, str]:
    with psycopg.connect(database_url) as connection:
        return {row_id: str(key) for row_id, key in connection.execute("SELECT id, idempotency_key FROM fault_event_outbox")}


def wait_until(condition, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def all_done(database_url: str) -> bool:
    try:
        return set(committed_state(database_url).values()) <= {(attempts, "done") for attempts in range(1, 100)}
    except psycopg.OperationalError:
        return False  # the server is still recovering


def test_a_server_crash_forgets_no_committed_claim_or_outcome(private_server: PrivateServer):
    database_url = private_server.database_url("crash")
    engine = create_engine(sqlalchemy_url(database_url), pool_size=4, max_overflow=4, pool_pre_ping=True)
    stop = threading.Event()
    with Receiver() as receiver, HttpTransport() as transport:
        receiver.respond = lambda request: Reply(delay=0.005)  # busy drains: sends and outcomes in flight at the kill
        install_fault_schema(engine)
        kit_metadata.create_all(engine)  # the attempt history, written in the outcome transactions
        with engine.begin() as connection:
            connection.execute(insert(FaultEvent), [{"target_url": f"{receiver.url}/events"}] * ROWS)
        keys = keys_by_row(database_url)
        drainer = Drainer(engine, FaultEvent, transport=transport, options=FAULT_OPTIONS)  # default durability
        assert drainer.queries.synchronous_commit is True

        def drain_until_stopped() -> None:
            while not stop.is_set():
                result = drainer.drain(stop=stop)
                if result.error or not result.claimed:
                    stop.wait(0.05)  # the server is down, or nothing is due yet (a lease to run out)

        draining = threading.Thread(target=drain_until_stopped, name="crash-drain")
        draining.start()
        try:
            receiver.wait_for(lambda seen: len(seen.requests) >= KILL_AFTER_SENDS, timeout=120)
            before = committed_state(database_url)
            private_server.crash()
            private_server.start()
            wait_until(lambda: all_done(database_url), timeout=FINISH_TIMEOUT, what="every row to be delivered")
        finally:
            stop.set()
            draining.join(timeout=60)
            drainer.close()
            engine.dispose()
        after = committed_state(database_url)
        sent = [(request.key, request.body["attempt"]) for request in receiver.requests]

    assert 0 < sum(status == "done" for _, status in before.values()) < ROWS  # the kill came mid-drain
    forgotten = {
        row_id: (was, after[row_id]) for row_id, was in before.items()
        if after[row_id][0] < was[0] or (was[1] == "done" and after[row_id][1] != "done")
    }  # fmt: skip
    assert forgotten == {}

    numbers_by_key = collections.defaultdict(list)
    for key, attempt in sent:
        numbers_by_key[key].append(attempt)
    assert set(numbers_by_key) == set(keys.values())  # every row was sent
    repeated = {key: numbers for key, numbers in numbers_by_key.items() if len(numbers) != len(set(numbers))}
    assert repeated == {}  # no attempt number sent twice: no counted attempt was forgotten
    uncounted = {
        row_id: (numbers_by_key[key], after[row_id][0]) for row_id, key in keys.items()
        if max(numbers_by_key[key]) > after[row_id][0]
    }  # fmt: skip
    assert uncounted == {}  # no send beyond the row's attempts
    counted_not_sent = {row_id for row_id, key in keys.items() if after[row_id][0] != len(numbers_by_key[key])}
    assert len(counted_not_sent) <= FAULT_OPTIONS.batch_size
    assert all(after[row_id][0] - len(numbers_by_key[keys[row_id]]) == 1 for row_id in counted_not_sent)
