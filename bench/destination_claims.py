"""The destination-aware claim's figures, for bench/destinations.py (one scratch database, real receivers on 127.0.0.1).

* ``healthy_ratio_100_dead_of_1000``: rows spread over 1,000 destinations, 100 of them blackholed, against the same
  rows all healthy: healthy rows/s with over without (the drain loop, default options).
* ``held_rows_claimed``: two processes claim in turns from a destination whose breaker is open (its cool-down just
  over); the rows claimed beyond its ``BreakerOptions.probes`` probes (0: only the probes).
* ``flaky_30pct_time_ratio``: rows to a receiver answering 503 to 30% of requests at random, the time until all are
  delivered with the breaker on over the time with it off (short backoff on both sides).
* ``fair_p95_ms``: one row of destination B committed while destination A has a backlog, until B's row is recorded
  delivered (p95 of several rows, each committed once the previous one is delivered).
* ``ordered_earliest_due_ms_100k_keys``: the ordered earliest-due read with 100,000 keys (median).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import statistics
import threading
import time
import uuid
from datetime import datetime, timezone

from sqlalchemy import Engine, create_engine, func, insert, select, text

from bench.ordered_delivery import FlakyReceiver, OrderedBenchOutbox, OrderingBase, UnorderedBenchOutbox, seconds_to_drain
from outboxkit import Drainer, HttpTransport
from outboxkit.breaker import BreakerOptions
from outboxkit.storage.drain_queries import queries_for
from outboxkit.storage.tables import destinations as destination_table

BENCH = UnorderedBenchOutbox
TABLE = BENCH.__tablename__


def _reset(engine: Engine) -> None:
    OrderingBase.metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {TABLE}, {OrderedBenchOutbox.__tablename__}"))
        connection.execute(destination_table.delete())


def _insert(engine: Engine, rows: list[dict[str, object]]) -> list[int]:
    ids: list[int] = []
    with engine.begin() as connection:
        for start in range(0, len(rows), 5_000):
            ids += connection.scalars(insert(BENCH).returning(BENCH.id), rows[start : start + 5_000]).all()
    return ids


def _pending(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(BENCH).where(BENCH.status != "done")).scalar_one())


def dead_of_destinations(engine: Engine, healthy_url: str, dead_url: str, *, rows: int = 1000) -> dict[str, float]:
    """``healthy_ratio_100_dead_of_1000``: 1,000 destinations (named on the row), every tenth one blackholed."""

    def rate(with_dead: bool) -> float:
        _reset(engine)
        values: list[dict[str, object]] = []
        for n in range(rows):
            place = n % 1000
            dead = with_dead and place % 10 == 9
            values.append({"target_url": f"{dead_url if dead else healthy_url}/hook", "stream": None,
                           "payload": {"stream": "", "n": n}})
        ids = _insert(engine, values)
        with engine.begin() as connection:  # one destination per place (as ``Outbox.destination_for`` would name them)
            connection.execute(text(f"UPDATE {TABLE} SET destination = 'bench-' || (id - :first) % 1000"), {"first": ids[0]})
        options = dataclasses.replace(BENCH.__outbox__, breaker=BreakerOptions())
        healthy = sum(1 for value in values if str(value["target_url"]).startswith(healthy_url))
        return healthy / seconds_to_drain(engine, BENCH, options=options, url_prefix=healthy_url)

    without, with_dead = rate(False), rate(True)
    return {"healthy_rows_per_s_1000_destinations": round(without, 1),
            "healthy_ratio_100_dead_of_1000": round(with_dead / without, 3)}


def _claim_open(url: str, barrier: object, results: object, tries: int) -> None:
    engine = create_engine(url)
    queries = queries_for(BENCH)
    claimed = 0
    barrier.wait(timeout=60)  # type: ignore[attr-defined]
    for _ in range(tries):
        with engine.begin() as connection:  # now=None: the server's time
            rows, _ = queries.claim_due_rows(connection, now=None, lease_seconds=60, limit=50,
                                             token=uuid.uuid4(), probes=BreakerOptions().probes)
        claimed += len(rows)
    engine.dispose()
    results.put(claimed)  # type: ignore[attr-defined]


def held_rows_claimed(engine: Engine, sqlalchemy_url: str, dead_url: str, *, tries: int = 50) -> dict[str, int]:
    """Two processes claim ``tries`` times each while the destination is open (its probe due once)."""
    _reset(engine)
    _insert(engine, [{"target_url": f"{dead_url}/hook", "stream": None, "payload": {"stream": "", "n": n}}
                     for n in range(200)])
    with engine.begin() as connection:
        destination = connection.execute(select(BENCH.destination).limit(1)).scalar_one()
        connection.execute(text(
            "INSERT INTO outboxkit_destinations (outbox, destination, status, consecutive_failures, opened_at, "
            "next_probe_at, updated_at) VALUES (:outbox, :destination, 'open', 5, now(), now(), now())"
        ), {"outbox": BENCH.__outbox__.job_name, "destination": destination})
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_claim_open, args=(sqlalchemy_url, barrier, results, tries)) for _ in range(2)]
    for worker in workers:
        worker.start()
    claimed = sum(results.get(timeout=300) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
    probes = BreakerOptions().probes
    return {"held_rows_claimed": max(0, claimed - probes), "held_claims_made": 2 * tries, "probes_claimed": min(claimed, probes)}


def flaky_time_ratio(engine: Engine, *, rows: int) -> dict[str, float]:
    """Breaker on over breaker off, to a receiver answering 503 to 30% of requests (backoff 0.2 s, 50 attempts)."""
    receiver = FlakyReceiver(failure_rate=0.3)
    try:
        times = {}
        for breaker in (True, False):
            _reset(engine)
            _insert(engine, [{"target_url": f"{receiver.url}/flaky", "stream": None, "payload": {"stream": "", "n": n}}
                             for n in range(rows)])
            options = dataclasses.replace(BENCH.__outbox__, breaker=BreakerOptions() if breaker else None,
                                          backoff=(0.2,), max_attempts=50)
            times[breaker] = seconds_to_drain(engine, BENCH, options=options)
    finally:
        receiver.stop()
    return {"flaky_30pct_s_breaker_on": round(times[True], 2), "flaky_30pct_s_breaker_off": round(times[False], 2),
            "flaky_30pct_time_ratio": round(times[True] / times[False], 3)}


def fair_p95(engine: Engine, a_url: str, b_url: str, *, backlog: int, samples: int) -> dict[str, float]:
    """ms from the commit of B's row until it is recorded delivered, while A's backlog drains."""
    _reset(engine)
    _insert(engine, [{"target_url": f"{a_url}/hook", "stream": None, "payload": {"stream": "", "n": n}}
                     for n in range(backlog)])
    with engine.begin() as connection:
        connection.execute(text(f"ANALYZE {TABLE}"))
    waits = []
    with HttpTransport() as transport:
        drainer = Drainer(engine, BENCH, transport=transport)
        drainer.start(poll_seconds=1)
        try:
            for n in range(samples):
                [row_id] = _insert(engine, [{"target_url": f"{b_url}/hook", "stream": None,
                                             "payload": {"stream": "", "n": n}}])
                committed = datetime.now(timezone.utc)
                while True:
                    with engine.connect() as connection:
                        delivered = connection.execute(
                            select(BENCH.delivered_at).where(BENCH.id == row_id, BENCH.status == "done")
                        ).scalar_one_or_none()
                    if delivered is not None:
                        waits.append((delivered - committed).total_seconds() * 1000)
                        break
                    threading.Event().wait(0.005)
            left = _pending(engine)
        finally:
            drainer.close()
    waits.sort()
    return {"fair_p95_ms": round(waits[max(0, round(0.95 * len(waits)) - 1)], 1),
            "fair_median_ms": round(statistics.median(waits), 1), "fair_backlog_rows": backlog,
            "fair_backlog_left_at_end": left}


def ordered_earliest_due(engine: Engine, *, keys: int = 100_000, rounds: int = 20) -> dict[str, float]:
    """The ordered earliest-due read's median (ms) with ``keys`` keys of one pending row each (none due yet)."""
    _reset(engine)
    table = OrderedBenchOutbox.__tablename__
    with engine.begin() as connection:
        connection.execute(text(
            f"INSERT INTO {table} (target_url, stream, payload, next_attempt_at, destination) "
            "SELECT 'http://127.0.0.1:9/ordered', 'k' || n, '{}'::jsonb, now() + interval '1 hour', 'http://127.0.0.1:9' "
            "FROM generate_series(1, :keys) AS n"
        ), {"keys": keys})
        connection.execute(text(f"ANALYZE {table}"))
    queries = queries_for(OrderedBenchOutbox)
    times = []
    with queries.outcome_connection(engine) as connection:
        for _ in range(rounds):
            started = time.perf_counter()
            queries.earliest_due(connection, now=datetime.now(timezone.utc))
            times.append((time.perf_counter() - started) * 1000)
    _reset(engine)
    return {"ordered_earliest_due_ms_100k_keys": round(statistics.median(times), 2), "ordered_keys": keys}
