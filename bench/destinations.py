"""Destinations under a failing receiver: isolation, probes across processes, recovery, signing cost.

Against a real PostgreSQL (a scratch database it creates and drops), the
example ``WebhookOutbox`` and two receivers on 127.0.0.1: ``bench/receiver.py``
(healthy, answers 200 at once) and a dead one that accepts TCP connections and
never answers (a blackholed partner) until told to answer.

1. **Isolation**, default options (concurrency 32, timeout 10 s), with the
   breaker on (``breaker=BreakerOptions()``, the default) and off (``breaker=None``; the
   ``_breaker_off`` keys), ``--breaker`` choosing:
   1,000 rows to the healthy receiver (``healthy_rows_per_s_without``); then
   1,000 rows of which every tenth goes to the dead receiver, until the 900
   healthy rows are delivered (``healthy_rows_per_s_with_dead_10pct``), each
   with a fresh drainer; ``--repeat`` interleaved pairs, medians reported
   (``healthy_ratio`` is the median with over the median without,
   ``healthy_ratio_median_of_pairs`` the median of each pair's ratio), and
   the load average beside each pair.  **Issue 17's target** is
   ``healthy_ratio`` of the drain loop with the breaker on (default
   options), >= 0.9: the line ``TARGET`` before the JSON names it,
   and the JSON starts with it (``target_healthy_ratio``,
   ``target_healthy_ratio_goal``, ``target_healthy_ratio_met``).  Once with the drain loop
   (``Drainer.start``, as the kit runs it), once with ``Drainer.drain``
   called in a loop (the ``_drain_calls`` keys; ``--no-drain-calls`` skips it).
2. **Probes across processes**: 100 rows to the dead receiver, two drainer
   processes (background loops) with a 5 s cool-down; from the end of the
   first cool-down, the requests reaching the dead receiver during
   ``--window`` seconds (``dead_destination_sends_per_min``, and the shortest
   gap between two of them); the sends of rows already handed to a send
   thread when the breaker opened are counted apart.
3. **Recovery**: the dead receiver starts answering (its hanging connections
   are closed, as a restart does); ``recovery_s`` is the time until every
   row the breaker held at that moment is delivered, against a target of
   cool-down + 1 s (``recovery_all_rows_s`` also waits for the rows that were
   in their own backoff after a failed attempt, such as the last probe).
4. ``signing_cpu_us_per_row`` from bench/signing.py.
6. **The claim's cost against the states stored** (``claim_cost``): one claim of 50 of 1,000 due rows of
   one destination, rolled back, median of 30, with no destination state stored (``claim_ms_no_states``)
   and with 100,000 quiet ones (``claim_ms_100k_states``); the claim reads the state of the destinations
   it walks by key, so ``claim_ms_ratio_100k_states`` (target <= 1.2) stays near 1.
5. **Ordered delivery** (``ordered_vs_unordered``, bench/ordered_delivery.py): 20,000 rows over 1,000
   keys, 10% random 503s, ordered and unordered outboxes otherwise alike: ``ordered_rows_per_s``,
   ``unordered_rows_per_s``, ``ordered_ratio`` (target >= 0.7), ``order_violations`` (must be 0).
   ``--ordered-only`` runs this part alone; ``--no-ordered`` leaves it out.

7. **The destination-aware claim** (bench/destination_claims.py): ``healthy_ratio_worker`` (the isolation ratio of
   the drain loop, ``Drainer.start``, the loop ``kit.worker`` runs in every process) and ``healthy_ratio_drain_calls``
   (part 1), ``healthy_ratio_100_dead_of_1000``, ``held_rows_claimed``, ``flaky_30pct_time_ratio``, ``fair_p95_ms``,
   ``ordered_earliest_due_ms_100k_keys``, with ``load_average``.  ``--quick`` runs every part small (300 rows, one
   pair, no probe window, no ordered throughput; a 20,000-row backlog for ``fair_p95_ms``): under three minutes.

Run::

    .venv/bin/python bench/destinations.py               # about two minutes
    .venv/bin/python bench/destinations.py --quick       # every key, small
    .venv/bin/python bench/destinations.py --window 30   # quicker

The last line is one JSON object with those keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from sqlalchemy import Engine, create_engine, func, insert, select, text  # noqa: E402

from bench import destination_claims  # noqa: E402
from bench.ceilings import scratch_database  # noqa: E402
from bench.drain_throughput import ReceiverProcess  # noqa: E402
from bench.ordered_delivery import ordered_vs_unordered, run_ordered_only  # noqa: E402
from bench.signing import SECRETS, delivery_of, microseconds_per_row  # noqa: E402
from outboxkit import Drainer, HttpTransport  # noqa: E402
from outboxkit.breaker import BreakerOptions  # noqa: E402
from outboxkit.storage.tables import destinations as destination_table  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402

PROBE_COOL_DOWN = 5.0
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n"


class DeadReceiver:
    """Accepts connections and never answers, until ``answer()``: then it answers 200 to every request."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._held: list[socket.socket] = []
        self.arrivals: list[float] = []  # time.monotonic() of each request that reached it
        self.answering = False
        threading.Thread(target=self._accept, daemon=True).start()

    def answer(self) -> None:
        with self._lock:
            self.answering = True
            held, self._held = self._held, []
        for connection in held:  # as a restart does: the hanging connections drop
            connection.close()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        buffer = b""
        with connection:
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        chunk = connection.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
                    0,
                )
                while len(buffer) < length:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                buffer = buffer[length:]
                with self._lock:
                    self.arrivals.append(time.monotonic())
                    if not self.answering:
                        self._held.append(connection)
                        hold = True
                    else:
                        hold = False
                if hold:
                    threading.Event().wait(3600)  # until answer() closes the connection under us
                    return
                connection.sendall(RESPONSE)

    def close(self) -> None:
        self._listener.close()
        self.answer()


def insert_rows(engine: Engine, urls: list[str]) -> None:
    with engine.begin() as connection:
        connection.execute(insert(WebhookOutbox), [{"event": "bench", "target_url": url, "payload": {"n": n}} for n, url in
                                                  enumerate(urls)])


def delivered_to(engine: Engine, url: str) -> int:
    with engine.connect() as connection:
        return int(connection.execute(
            select(func.count()).where(WebhookOutbox.status == "done", WebhookOutbox.target_url == url)
        ).scalar_one())


def clear(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {WebhookOutbox.__tablename__}"))
        connection.execute(destination_table.delete())


def healthy_rate(
    engine: Engine, healthy_url: str, dead_url: str | None, rows: int, *, calls: bool, breaker: bool = True
) -> float:
    """Rows/s of the healthy receiver's rows, default options (the breaker on or off): the drain loop, or
    ``Drainer.drain`` called in a loop."""
    clear(engine)
    urls = [dead_url if dead_url is not None and n % 10 == 9 else healthy_url for n in range(rows)]
    urls = [f"{url}/hook" for url in urls]
    insert_rows(engine, urls)
    healthy = sum(1 for url in urls if url.startswith(healthy_url))
    stop = threading.Event()
    with HttpTransport() as transport:
        options = dataclasses.replace(WebhookOutbox.__outbox__, breaker=BreakerOptions() if breaker else None)
        drainer = Drainer(engine, WebhookOutbox, transport=transport, options=options)

        def drain_in_a_loop() -> None:
            while not stop.is_set():
                if not drainer.drain(stop=stop).claimed:
                    stop.wait(0.05)  # the rows left are held, or wait for a place under their destination's cap

        loop = threading.Thread(target=drain_in_a_loop)
        started = time.monotonic()
        if calls:
            loop.start()
        else:
            drainer.start(poll_seconds=1)  # as the kit runs it (kit.lifespan, outboxkit worker)
        while delivered_to(engine, f"{healthy_url}/hook") < healthy:
            threading.Event().wait(0.02)
        elapsed = time.monotonic() - started
        stop.set()
        if calls:
            loop.join()  # the last sends to the dead receiver end by their deadline; not counted
        drainer.close()
    return healthy / elapsed


def run_worker(sqlalchemy_url: str, stop: multiprocessing.synchronize.Event) -> None:
    engine = create_engine(sqlalchemy_url, pool_size=5)
    options = dataclasses.replace(
        WebhookOutbox.__outbox__, breaker=BreakerOptions(cool_down=PROBE_COOL_DOWN, max_cool_down=PROBE_COOL_DOWN)
    )
    with HttpTransport() as transport:
        drainer = Drainer(engine, WebhookOutbox, transport=transport, options=options)
        drainer.start(poll_seconds=1)
        stop.wait()
        drainer.close()
    engine.dispose()


def held_rows(engine: Engine) -> list[int]:
    """The rows the breaker keeps from the claim now: pending and unclaimed, of the destination it opened.

    Unclaimed: a probe out at that moment is not a held row; when the switch cuts it off it fails and waits out
    its own backoff, like the rows ``recovery_all_rows_s`` also waits for.
    """
    with engine.connect() as connection:
        destination = connection.execute(select(destination_table.c.destination)).scalar_one()
        return list(connection.scalars(
            select(WebhookOutbox.id).where(
                WebhookOutbox.status == "pending",
                WebhookOutbox.destination == destination,
                WebhookOutbox.claimed_until.is_(None),
            )
        ))


def all_done(engine: Engine, ids: list[int]) -> bool:
    with engine.connect() as connection:
        return not connection.execute(
            select(func.count()).where(WebhookOutbox.id.in_(ids), WebhookOutbox.status != "done")
        ).scalar_one()


def breaker_status(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return connection.execute(select(destination_table.c.status)).scalar_one_or_none()


def probes_and_recovery(engine: Engine, sqlalchemy_url: str, dead: DeadReceiver, *, window: float) -> dict[str, float]:
    clear(engine)
    insert_rows(engine, [f"{dead.url}/hook"] * 100)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    workers = [context.Process(target=run_worker, args=(sqlalchemy_url, stop)) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + 120
        while breaker_status(engine) not in ("open", "half_open"):
            if time.monotonic() > deadline:
                raise RuntimeError("the dead destination's breaker did not open within 120 s")
            threading.Event().wait(0.1)
        opened = time.monotonic()
        # Rows already handed to a send thread when the breaker opened may still go out in its first
        # moments; they are counted apart.  Probes are counted from the end of the first cool-down.
        threading.Event().wait(PROBE_COOL_DOWN + window)
        first_probe_from = opened + PROBE_COOL_DOWN
        at_opening = [moment for moment in dead.arrivals if opened <= moment < first_probe_from]
        probes = [moment for moment in dead.arrivals if first_probe_from <= moment < first_probe_from + window]
        gaps = [later - earlier for earlier, later in zip(probes, probes[1:], strict=False)]
        waiting = held_rows(engine)
        switched = time.monotonic()
        dead.answer()
        recovery = None
        while delivered_to(engine, f"{dead.url}/hook") < 100:
            if recovery is None and all_done(engine, waiting):
                recovery = time.monotonic() - switched
            if time.monotonic() - switched > 120:
                raise RuntimeError("the rows did not flow within 120 s of the receiver answering")
            threading.Event().wait(0.05)
        recovery_all = time.monotonic() - switched
        recovery = recovery if recovery is not None else recovery_all
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
    return {
        "dead_destination_sends_per_min": len(probes) * 60 / window,
        "dead_destination_sends_in_window": len(probes),
        "sends_already_handed_out_when_it_opened": len(at_opening),
        "shortest_gap_between_probes_s": min(gaps) if gaps else float("nan"),
        "recovery_s": recovery,
        "recovery_all_rows_s": recovery_all,
        "rows_held_at_switch": len(waiting),
    }


BREAKER_MODES = {"on": (True,), "off": (False,), "both": (True, False)}


def isolation_figures(
    engine: Engine, healthy_url: str, dead_url: str, options: argparse.Namespace, *, calls: bool, breaker: bool
) -> dict[str, object]:
    """``--repeat`` interleaved pairs (without, with the dead destination); medians and each pair's ratio.

    Keys carry ``_drain_calls`` for ``Drainer.drain`` called in a loop and ``_breaker_off`` without the breaker.
    """
    mode = ("drain calls in a loop" if calls else "the drain loop") + (", breaker on" if breaker else ", breaker off")
    withouts, withs = [], []
    for _ in range(options.repeat):  # interleaved, so a busy moment of the host weighs on both
        withouts.append(healthy_rate(engine, healthy_url, None, options.rows, calls=calls, breaker=breaker))
        withs.append(healthy_rate(engine, healthy_url, dead_url, options.rows, calls=calls, breaker=breaker))
        print(f"{mode}: healthy rows/s without a dead destination: {withouts[-1]:.1f}; with 10% of rows to a "
              f"blackholed one: {withs[-1]:.1f} ({withs[-1] / withouts[-1]:.2f}); load {load_average()}", flush=True)
    without, with_dead = statistics.median(withouts), statistics.median(withs)
    suffix = ("_drain_calls" if calls else "") + ("" if breaker else "_breaker_off")
    ratios = [one / other for one, other in zip(withs, withouts, strict=True)]
    return {
        f"healthy_rows_per_s_with_dead_10pct{suffix}": round(with_dead, 1),
        f"healthy_rows_per_s_without{suffix}": round(without, 1),
        f"healthy_ratio{suffix}": round(with_dead / without, 3),
        f"healthy_ratio_median_of_pairs{suffix}": round(statistics.median(ratios), 3),
        f"healthy_ratio_per_pair{suffix}": [round(ratio, 3) for ratio in ratios],
    }


ISOLATION_TARGET = 0.9


def isolation_target(isolation: dict[str, object]) -> dict[str, object]:
    """The figure the isolation target is about, from the drain loop's runs with the breaker on (the
    default options); empty if those runs were left out (``--breaker off``)."""
    if "healthy_ratio" not in isolation:
        return {}
    value = isolation["healthy_ratio"]
    assert isinstance(value, float)
    return {
        "figure": "healthy_ratio",
        "value": value,
        "target": ISOLATION_TARGET,
        "met": value >= ISOLATION_TARGET,
        "definition": "healthy_rows_per_s_with_dead_10pct / healthy_rows_per_s_without (medians of the interleaved "
        "runs), the drain loop, default options (breaker on)",
        "per_pair": isolation["healthy_ratio_per_pair"],
    }


def target_keys(target: dict[str, object]) -> dict[str, object]:
    """The target's figure first in the JSON line, under names that say so."""
    if not target:
        return {}
    return {"target_healthy_ratio": target["value"], "target_healthy_ratio_goal": target["target"],
            "target_healthy_ratio_met": target["met"]}


def claim_cost(engine: Engine, *, rounds: int = 30) -> dict[str, float]:
    """The claim's median time (ms) with no state stored and with 100,000 quiet ones (see the module, part 6)."""
    import uuid
    from datetime import datetime, timedelta, timezone

    from outboxkit.storage.drain_queries import queries_for

    clear(engine)
    insert_rows(engine, ["http://127.0.0.1:9/hook"] * 1000)
    queries = queries_for(WebhookOutbox)

    def median_ms() -> float:
        times = []
        for _ in range(rounds):
            now = datetime.now(timezone.utc) + timedelta(seconds=1)
            with engine.connect() as connection:
                started = time.perf_counter()
                queries.claim_due_rows(connection, now=now, lease_seconds=60, limit=50,
                                       token=uuid.uuid4())
                times.append((time.perf_counter() - started) * 1000)
                connection.rollback()
        return statistics.median(times)

    with engine.begin() as connection:
        connection.execute(text("ANALYZE webhook_outbox"))
    without = median_ms()
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO outboxkit_destinations (outbox, destination, status, updated_at) "
            "SELECT 'webhooks', 'http://quiet-' || n || '.example\\:80', 'healthy', now() FROM generate_series(1, 100000) AS n"
        ))
        connection.execute(text("ANALYZE outboxkit_destinations"))
    with_states = median_ms()
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM outboxkit_destinations"))
    clear(engine)
    return {
        "claim_ms_no_states": round(without, 2),
        "claim_ms_100k_states": round(with_states, 2),
        "claim_ms_ratio_100k_states": round(with_states / without, 2),
    }


def claim_figures(engine: Engine, url: str, healthy_url: str, dead_url: str, *, quick: bool) -> dict[str, object]:
    """Part 7 (bench/destination_claims.py); the second healthy receiver stands for destination B."""
    figures: dict[str, object] = {}
    figures.update(destination_claims.dead_of_destinations(engine, healthy_url, dead_url))
    print(f"1,000 destinations: {figures}; load {load_average()}", flush=True)
    figures.update(destination_claims.held_rows_claimed(engine, url, dead_url, tries=30 if quick else 100))
    figures.update(destination_claims.flaky_time_ratio(engine, rows=300 if quick else 1500))
    print(f"held and flaky: {figures}; load {load_average()}", flush=True)
    other = ReceiverProcess()
    try:
        figures.update(destination_claims.fair_p95(engine, healthy_url, other.url, backlog=20_000 if quick else 100_000,
                                                   samples=10 if quick else 30))
    finally:
        other.stop()
    figures.update(destination_claims.ordered_earliest_due(engine))
    print(f"claim figures: {figures}; load {load_average()}", flush=True)
    return figures


def load_average() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved pairs of runs; medians reported")
    parser.add_argument("--window", type=float, default=60.0,
                        help="seconds of probes counted while the breaker is open (0: skip probes and recovery)")
    parser.add_argument("--breaker", choices=sorted(BREAKER_MODES), default="both",
                        help="isolation runs with the breaker on, off, or both (each with its own keys)")
    parser.add_argument("--no-drain-calls", dest="drain_calls", action="store_false",
                        help="skip the isolation runs with Drainer.drain called in a loop")
    parser.add_argument("--quick", action="store_true", help="every key, small (under three minutes)")
    add_ordered_flags(parser)
    options = parser.parse_args()
    if options.quick:
        options.rows, options.repeat, options.window, options.breaker, options.no_ordered = 300, 1, 0.0, "on", True
    if options.ordered_only:
        print(json.dumps(run_ordered_only(repeat=options.ordered_repeat)))
        return
    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    engine = create_engine(scratch.sqlalchemy_url, pool_size=10)
    healthy = ReceiverProcess()
    dead = DeadReceiver()
    try:
        Base.metadata.create_all(engine)
        kit_metadata.create_all(engine)
        isolation: dict[str, object] = {}
        modes = [(calls, breaker) for calls in (False, True) for breaker in BREAKER_MODES[options.breaker]]
        if not options.drain_calls:
            modes = [(calls, breaker) for calls, breaker in modes if not calls]
        for calls, breaker in modes:
            isolation.update(isolation_figures(engine, healthy.url, dead.url, options, calls=calls, breaker=breaker))
        figures: dict[str, float] = {}
        if options.window > 0:
            figures = probes_and_recovery(engine, scratch.sqlalchemy_url, dead, window=options.window)
        for name, value in figures.items():
            print(f"{name}: {value:.2f}", flush=True)
        signing = microseconds_per_row(SECRETS[:1], delivery_of(500), 20_000)
        figures.update(claim_cost(engine))
        claims = claim_figures(engine, scratch.sqlalchemy_url, healthy.url, dead.url, quick=options.quick)
        ordered = {} if options.no_ordered else ordered_vs_unordered(engine, repeat=options.ordered_repeat)
    finally:
        dead.close()
        healthy.stop()
        engine.dispose()
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch.name}" WITH (FORCE)')
    target = isolation_target(isolation)
    if target:
        print(f"TARGET: {target['figure']} = {target['value']} (target >= {target['target']}): "
              f"{target['definition']}; per pair {target['per_pair']}", flush=True)
    result = {
        **target_keys(target),
        **isolation,
        **{name: round(value, 2) for name, value in figures.items()},
        "probe_cool_down_s": PROBE_COOL_DOWN,
        "recovery_target_s": PROBE_COOL_DOWN + 1,
        "signing_cpu_us_per_row": round(signing, 2),
        "rows": options.rows,
        **claims,
        **ordered,
        "load_average_at_end": load_average(),
    }
    result["healthy_ratio_worker"] = result.get("healthy_ratio")
    result["healthy_ratio_drain_calls"] = result.get("healthy_ratio_drain_calls")
    result["load_average"] = result["load_average_at_end"]
    print(json.dumps(result))


def add_ordered_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the ordered-delivery measurement (bench/ordered_delivery.py)."""
    parser.add_argument("--ordered-only", action="store_true", help="only the ordered-vs-unordered measurement")
    parser.add_argument("--no-ordered", action="store_true", help="leave the ordered-vs-unordered measurement out")
    parser.add_argument("--ordered-repeat", type=int, default=1, help="interleaved ordered/unordered pairs; medians")


if __name__ == "__main__":
    main()
