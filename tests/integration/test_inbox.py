"""The inbox's one call and its consumer, against real PostgreSQL: exactly once, across failures and races."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from outboxkit.errors import InvalidTypeError, InvalidValueError
from outboxkit.inbox import InboxConsumer, inbox_summaries, record_handler_failure, record_message
from tests.support.inbox import applied, apply, create_applied_table, records
from tests.support.lock_waits import wait_for_a_lock_wait


@pytest.fixture
def business(engine):
    create_applied_table(engine)
    return engine


class Counting:
    """An observer that counts what it hears."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, str]] = []

    def message_handled(self, source: str) -> None:
        self.heard.append(("handled", source))

    def duplicate_dropped(self, source: str) -> None:
        self.heard.append(("duplicate", source))

    def handler_failed(self, source: str) -> None:
        self.heard.append(("failed", source))


def test_the_first_record_is_new_and_the_second_a_duplicate_counted_for_its_source(business):
    with Session(business) as session, session.begin():
        assert record_message(session, source="billing", message_id="m-1") is True
    with Session(business) as session, session.begin():
        assert record_message(session, source="billing", message_id="m-1") is False
    with business.begin() as connection:  # a Connection works too; another source is another key
        assert record_message(connection, source="shipping", message_id="m-1") is True
    assert records(business) == {("billing", "m-1"), ("shipping", "m-1")}
    with business.connect() as connection:
        summaries = {summary.source: summary for summary in inbox_summaries(connection)}
    assert (summaries["billing"].received, summaries["billing"].duplicates) == (1, 1)
    assert summaries["billing"].last_duplicate_at is not None
    assert (summaries["shipping"].received, summaries["shipping"].duplicates) == (1, 0)


def test_the_record_commits_with_the_business_write_or_not_at_all(business):
    with Session(business) as session:
        with session.begin():
            assert record_message(session, source="billing", message_id="m-1")
            apply(session, "m-1")
            session.rollback()  # the consumer gave up: neither the write nor the record stays
    assert records(business) == set() and applied(business) == {}


def test_a_handler_that_raises_rolls_both_back_and_the_next_delivery_handles_it(business):
    observer = Counting()
    consumer = InboxConsumer(business, source="billing", observers=[observer])

    def failing(session: Session) -> None:
        apply(session, "m-1")
        raise RuntimeError("the ledger is closed")

    with pytest.raises(RuntimeError, match="ledger is closed"):
        consumer.consume("m-1", failing)
    assert records(business) == set() and applied(business) == {}

    assert consumer.consume("m-1", lambda session: apply(session, "m-1")) == "handled"
    assert consumer.consume("m-1", lambda session: apply(session, "m-1")) == "duplicate"
    assert applied(business) == {"m-1": 1}
    assert observer.heard == [("failed", "billing"), ("handled", "billing"), ("duplicate", "billing")]
    with business.connect() as connection:
        [summary] = inbox_summaries(connection)
    assert (summary.received, summary.duplicates, summary.handler_failures) == (1, 1, 1)
    assert summary.last_error == "RuntimeError: the ledger is closed"


def race(consumer: InboxConsumer, first_fails: bool) -> tuple[object, object]:
    """Deliver "m-1" twice at once: the second INSERT waits on the first transaction, which then ends.

    Returns what each delivery gave (an outcome, or the exception the first raised).
    """
    inside, release = threading.Event(), threading.Event()

    def first_handler(session: Session) -> None:
        apply(session, "m-1")
        inside.set()
        assert release.wait(60)
        if first_fails:
            raise RuntimeError("crashed mid-handler")

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(consumer.consume, "m-1", first_handler)
        assert inside.wait(60)
        second = pool.submit(consumer.consume, "m-1", lambda session: apply(session, "m-1"))
        wait_for_a_lock_wait(consumer.engine, statement="INSERT INTO outboxkit_inbox")
        release.set()
        return (first.exception(60) or first.result()), second.result(60)


def test_two_deliveries_at_once_apply_the_message_once(business):
    """When the first commits, the waiting second is a duplicate."""
    assert race(InboxConsumer(business, source="billing"), first_fails=False) == ("handled", "duplicate")
    assert applied(business) == {"m-1": 1}


def test_when_the_first_of_two_deliveries_fails_the_waiting_one_handles_the_message(business):
    first, second = race(InboxConsumer(business, source="billing"), first_fails=True)
    assert isinstance(first, RuntimeError) and second == "handled"
    assert applied(business) == {"m-1": 1}


@pytest.mark.parametrize(
    ("source", "message_id", "error"),
    [
        ("", "m-1", InvalidValueError),
        ("x" * 201, "m-1", InvalidValueError),
        ("billing", "", InvalidValueError),
        ("billing", "m" * 301, InvalidValueError),
        ("billing", "line\nbreak", InvalidValueError),
        (None, "m-1", InvalidTypeError),
        ("billing", 17, InvalidTypeError),
    ],
)
def test_a_bad_source_or_id_is_refused_and_nothing_is_written(business, source, message_id, error):
    with Session(business) as session, session.begin():
        with pytest.raises(error, match="inbox"):
            record_message(session, source=source, message_id=message_id)
    with pytest.raises(error, match="inbox"):
        if source == "billing":
            InboxConsumer(business, source=source).consume(message_id, lambda session: None)
        else:
            InboxConsumer(business, source=source)
    assert records(business) == set()
    with business.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM outboxkit_inbox_sources")).scalar() == 0


def test_a_failure_keeps_only_the_start_of_a_long_error(business):
    record_handler_failure(business, source="billing", error="e" * 5000)
    with business.connect() as connection:
        [summary] = inbox_summaries(connection)
    assert summary.handler_failures == 1 and summary.received == 0 and len(summary.last_error or "") == 2000
