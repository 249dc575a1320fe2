"""The drain's own pool: the drain never takes one of the application's connections, nor waits for them."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, event, insert, text
from sqlalchemy.orm import Session

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.storage.drain_pool import DrainDatabase, drain_pool_size
from tests.support.database import sqlalchemy_url
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent

# The loops' safety-net poll is an hour away: only the start's claim and NOTIFY wake them.
SETTINGS = OutboxKitSettings(drain_interval_seconds=3600, listen_enabled=True)
BACKLOG = 200


@pytest.fixture
def app_engine(database_url: str) -> Iterator[Engine]:
    """The application's engine, with a pool of two and no overflow: small enough for the application to fill."""
    engine = create_engine(sqlalchemy_url(database_url), pool_size=2, max_overflow=0, pool_timeout=60)
    yield engine
    engine.dispose()


def add_backlog(engine: Engine, receiver, count: int) -> None:
    rows = [{"target_url": receiver.url + "/events", "payload": {"n": n}} for n in range(count)]
    with engine.begin() as connection:
        connection.execute(insert(SampleEvent.__table__), rows)  # type: ignore[arg-type]


class CheckoutCounter:
    """Counts checkouts of one engine's pool, by thread name."""

    def __init__(self, engine: Engine) -> None:
        self.threads: list[str] = []
        self._lock = threading.Lock()
        event.listen(engine, "checkout", self._checkout)

    def _checkout(self, *args: object) -> None:
        with self._lock:
            self.threads.append(threading.current_thread().name)


def test_the_drain_its_listener_and_its_outcome_writes_never_check_out_an_application_connection(
    app_engine, engine, receiver
):
    add_backlog(engine, receiver, BACKLOG)
    kit = OutboxKit(app_engine, [SampleEvent], settings=SETTINGS)
    application = CheckoutCounter(app_engine)
    drain = CheckoutCounter(kit.drain_database.engine)
    try:
        kit.worker.start()
        receiver.wait_for(lambda r: len(r.requests) == BACKLOG, timeout=60)
        listener = kit.worker.listener
        assert listener is not None and listener.wait_for_generation(1, timeout=10)
        with Session(app_engine) as session, session.begin():  # a wake-up by NOTIFY, after the backlog
            session.add(SampleEvent(target_url=receiver.url + "/events", payload={"n": "late"}))
        receiver.wait_for(lambda r: len(r.requests) == BACKLOG + 1, timeout=30)
        wait_until(lambda: _done(engine) == BACKLOG + 1, timeout=30)
        assert kit.drain(SampleEvent).claimed == 0  # a drain called by the application: the drain's pool too
    finally:
        kit.close()
    # Only the enqueue above took an application connection; every claim, outcome and LISTEN took the drain's.
    assert application.threads == [threading.current_thread().name]
    assert drain.threads  # the drain did work, on its own pool


def test_a_backlog_drains_while_the_application_holds_every_connection_of_its_pool(app_engine, engine, receiver):
    add_backlog(engine, receiver, BACKLOG)
    kit = OutboxKit(app_engine, [SampleEvent], settings=SETTINGS)
    held = [app_engine.connect() for _ in range(2)]  # the application's whole pool, busy with its own requests
    try:
        assert app_engine.pool.checkedout() == 2
        kit.worker.start()
        receiver.wait_for(lambda r: len(r.requests) == BACKLOG, timeout=60)
        wait_until(lambda: _done(engine) == BACKLOG, timeout=30)
        # The application's requests go on meanwhile, each on one of its own connections.
        for connection in held:
            assert connection.execute(text("SELECT 1")).scalar_one() == 1
        assert app_engine.pool.checkedout() == 2
    finally:
        for connection in held:
            connection.close()
        kit.close()


def test_the_drain_pool_connects_as_the_application_engine_does_and_is_sized_per_outbox(database_url):
    seen: list[dict[str, object]] = []
    app = create_engine(sqlalchemy_url(database_url), connect_args={"prepare_threshold": None})

    @event.listens_for(app, "do_connect")
    def remember(dialect, record, cargs, cparams):  # type: ignore[no-untyped-def]
        seen.append(dict(cparams))

    settings = OutboxKitSettings()
    assert drain_pool_size(settings, [SampleEvent.__outbox__]) == 3
    assert drain_pool_size(OutboxKitSettings(drain_pool_size=7), [SampleEvent.__outbox__]) == 7
    drain = DrainDatabase(app, settings, size=3)
    try:
        with drain.engine.connect() as connection:
            driver = connection.connection.driver_connection
            assert driver is not None and driver.prepare_threshold is None  # the application's connect_args
            assert drain.checked_out == 1 and drain.waiting == 0
        assert seen and seen[0].get("prepare_threshold", "missing") is None  # its do_connect hooks ran
        assert drain.checked_out == 0
        assert app.pool.checkedout() == 0
    finally:
        drain.dispose()
        app.dispose()


def test_waiting_counts_the_threads_that_wait_for_a_connection_of_a_full_drain_pool(database_url):
    app = create_engine(sqlalchemy_url(database_url))
    drain = DrainDatabase(app, OutboxKitSettings(drain_pool_timeout_seconds=60), size=1)  # 1 plus 1 overflow
    held = [drain.engine.connect(), drain.engine.connect()]
    got = threading.Event()

    def wait_for_one() -> None:
        with drain.engine.connect():
            got.set()

    thread = threading.Thread(target=wait_for_one)
    try:
        thread.start()
        wait_until(lambda: drain.waiting == 1, timeout=10)
        assert drain.checked_out == 2
        held.pop().close()
        assert got.wait(10)
        thread.join(10)
        assert drain.waiting == 0
    finally:
        for connection in held:
            connection.close()
        drain.dispose()
        app.dispose()


def _done(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM sample_event_outbox WHERE status = 'done'")).scalar_one())
