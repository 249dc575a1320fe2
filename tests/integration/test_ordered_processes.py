"""Ordered delivery across two drain processes (tests/support/ordered_worker.py), concurrency 32 each.

Both processes claim from the same ordered outbox at once; the receiver answers 503 to some first attempts,
so keys wait out a backoff while the others go on.  Per key, the requests arrive in id order, never two at
once, and every row ends ``done``.  Which process sends how many rows is left to the claims: on a loaded host
one process may take every batch before the other's first claim, and the checks hold either way.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

from sqlalchemy import insert, text

from tests.support.database import sqlalchemy_url
from tests.support.models import OrderedEvent
from tests.support.receiver import Reply

ROOT = Path(__file__).resolve().parents[2]
STREAMS = 40
ROWS_PER_STREAM = 15


def test_two_processes_keep_each_keys_order_and_send_one_row_of_a_key_at_a_time(engine, database_url, receiver):
    values = [
        {"target_url": receiver.url + "/ordered", "stream": f"s{stream}", "payload": {"stream": f"s{stream}", "n": n}}
        for n in range(ROWS_PER_STREAM) for stream in range(STREAMS)
    ]
    with engine.begin() as connection:
        connection.execute(insert(OrderedEvent), values)
    lock = threading.Lock()
    in_flight: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []
    failed_once: set[tuple[str, int]] = set()

    def respond(request):
        stream, n = request.body["stream"], request.body["n"]
        with lock:
            in_flight[stream] += 1
            if in_flight[stream] > 1:
                overlaps.append(stream)
            fail = n % 7 == 3 and (stream, n) not in failed_once  # about one row in seven: a 503, then a success
            failed_once.add((stream, n))
        threading.Event().wait(0.005)  # keeps the request open: a second send of its key would overlap it
        with lock:
            in_flight[stream] -= 1
        return Reply(status=503) if fail else Reply()

    receiver.respond = respond
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.ordered_worker", sqlalchemy_url(database_url), "--concurrency", "32"],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(2)
    ]
    try:
        for worker in workers:
            assert worker.stdout.readline().strip() == "ready", worker.stderr.read()
        for worker in workers:
            worker.stdin.write("go\n")
            worker.stdin.flush()
        for worker in workers:
            assert worker.wait(timeout=240) == 0, worker.stderr.read()
            assert worker.stdout.read().strip() == "finished"
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    arrivals: dict[str, list[int]] = defaultdict(list)
    for request in sorted(receiver.requests, key=lambda request: request.received_at):
        arrivals[request.body["stream"]].append(request.body["n"])
    expected = [n for n in range(ROWS_PER_STREAM) for _ in range(2 if n % 7 == 3 else 1)]  # each 503 once, then again
    assert {stream: numbers for stream, numbers in arrivals.items()} == {f"s{stream}": expected for stream in range(STREAMS)}
    assert overlaps == []
    with engine.connect() as connection:
        assert connection.execute(text("SELECT DISTINCT status FROM ordered_event_outbox")).scalars().all() == ["done"]
