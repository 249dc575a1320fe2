"""Partitioned outboxes against the real database: the helper's table, partitions made ahead, a missing partition,
retention by dropping whole partitions (never one with a pending or stuck row), and the drain and the operator's
reads working across partitions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, insert, text

from outboxkit import Drainer, HttpTransport, ManualClock, OutboxKit
from outboxkit.leader.partitions import drop_done_partitions, ensure_partitions, partitions_job_id
from outboxkit.leader.retention import retention_job_id
from outboxkit.migrations.helpers import convert_to_partitioned, set_outbox_storage
from outboxkit.operations.service import OperationsService
from outboxkit.storage.partitions import OUTBOX_STORAGE_PARAMETERS, PartitionTable, interval_start, partitions
from outboxkit.storage.row_filter import RowFilter
from tests.support.lock_waits import wait_for_a_lock_wait
from tests.support.models import SampleEvent
from tests.support.partitioned import (
    ConvertedTable,
    PartitionedBase,
    PartitionedEvent,
    PlainBase,
    create_partitioned_event_table,
    migrate,
)

TABLE = "partitioned_event_outbox"
DAY = timedelta(days=1)


def database_now(engine: Engine) -> datetime:
    with engine.connect() as connection:
        return connection.execute(text("SELECT now()")).scalar_one()


@pytest.fixture
def today(engine: Engine) -> datetime:
    """Midnight UTC of the database's day; the table is made with its partitions from there."""
    now = database_now(engine)
    create_partitioned_event_table(engine, now=now)
    return interval_start(now, "day")


def partition_names(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return [partition.name for partition in partitions(connection, PartitionTable(PartitionedEvent))]


def add_rows(engine: Engine, count: int, *, created_at: datetime | None = None, status: str = "pending") -> list[int]:
    values = {"target_url": "http://127.0.0.1:9/e", "status": status}
    if created_at is not None:
        values["created_at"] = created_at
    if status == "done":
        values["delivered_at"] = created_at or datetime.now(timezone.utc)
    statement = insert(PartitionedEvent).returning(PartitionedEvent.id, sort_by_parameter_order=True)
    with engine.begin() as connection:
        return list(connection.scalars(statement, [dict(values, payload={"n": n}) for n in range(count)]))


def rows_by_partition(engine: Engine) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    with engine.connect() as connection:
        for partition, row_id in connection.execute(text(f"SELECT tableoid::regclass::text, id FROM {TABLE}")):
            found.setdefault(partition, set()).add(row_id)
    return found


def test_the_helper_makes_the_table_its_default_partition_and_the_partitions_ahead(engine, today):
    names = partition_names(engine)

    assert names[0] == f"{TABLE}_pdefault"
    assert names[1:] == [f"{TABLE}_p{today + DAY * n:%Y%m%d}" for n in range(5)]  # today and four ahead
    with engine.connect() as connection:
        kind, key = connection.execute(text(
            f"SELECT relkind, pg_get_partkeydef(oid) FROM pg_class WHERE oid = '{TABLE}'::regclass"
        )).one()
        options = connection.execute(text(
            f"SELECT reloptions FROM pg_class WHERE oid = '{names[1]}'::regclass"
        )).scalar_one()
        primary_key = connection.execute(text(
            f"SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = '{TABLE}'::regclass AND contype = 'p'"
        )).scalar_one()
    assert (kind, key) == ("p", "RANGE (created_at)")
    assert primary_key == "PRIMARY KEY (id, created_at)"
    assert set(options) == {f"{name}={value}" for name, value in OUTBOX_STORAGE_PARAMETERS.items()}


def test_create_all_gives_a_partitioned_outbox_its_default_partition(engine):
    PartitionedBase.metadata.create_all(engine)

    ids = add_rows(engine, 2)  # no range partition exists: the DEFAULT partition takes them

    assert partition_names(engine) == [f"{TABLE}_pdefault"]
    assert rows_by_partition(engine) == {f"{TABLE}_pdefault": set(ids)}


def test_a_row_with_no_partition_lands_in_default_and_the_job_moves_it_into_the_partition_it_creates(engine, today):
    far = today + DAY * 30
    ids = add_rows(engine, 3, created_at=far + timedelta(hours=5))  # beyond the partitions made ahead

    assert rows_by_partition(engine)[f"{TABLE}_pdefault"] == set(ids)

    outcome = ensure_partitions(engine, PartitionedEvent, now=far)

    assert outcome == {"created": 5, "moved_from_default": 3, "skipped": 0}
    assert rows_by_partition(engine) == {f"{TABLE}_p{far:%Y%m%d}": set(ids)}
    assert ensure_partitions(engine, PartitionedEvent, now=far) == {"created": 0, "moved_from_default": 0, "skipped": 0}


def test_partition_creation_racing_inserts_loses_and_refuses_no_row(engine, today):
    """Writers insert rows dated today and into the days the job is creating, while it creates them."""
    stop = threading.Event()
    inserted: list[int] = []
    errors: list[BaseException] = []

    def write(offset_days: int) -> None:
        try:
            while not stop.is_set():
                for day in range(offset_days, offset_days + 12):
                    inserted.extend(add_rows(engine, 2, created_at=today + DAY * day + timedelta(hours=1)))
        except BaseException as exc:
            errors.append(exc)

    writers = [threading.Thread(target=write, args=(offset,)) for offset in (0, 6)]
    for writer in writers:
        writer.start()
    try:
        created = 0
        for day in range(1, 14):  # the job running on each of the next days, while rows pour in
            created += ensure_partitions(engine, PartitionedEvent, now=today + DAY * day, lock_timeout=30)["created"]
    finally:
        stop.set()
        for writer in writers:
            writer.join()

    assert not errors
    assert created == 13
    found = rows_by_partition(engine)
    assert set().union(*found.values()) == set(inserted)  # every row, each once
    assert sum(len(ids) for ids in found.values()) == len(inserted)
    with engine.connect() as connection:
        misplaced = connection.execute(text(
            f"SELECT count(*) FROM {TABLE}_pdefault WHERE created_at < :end"), {"end": today + DAY * 18}
        ).scalar_one()
    assert misplaced == 0  # the DEFAULT partition keeps no row of a range that has its partition


def old_partitions(engine: Engine, today: datetime) -> dict[str, datetime]:
    """Partitions for the three days before the table's first one (made as the job made them then)."""
    days = {f"{TABLE}_p{today - DAY * n:%Y%m%d}": today - DAY * n for n in (3, 2, 1)}
    for day in days.values():
        ensure_partitions(engine, PartitionedEvent, now=day)
    return days


def test_retention_drops_a_partition_only_when_every_row_in_it_is_done(engine, today):
    days = old_partitions(engine, today)
    all_done, with_stuck, with_pending = days
    add_rows(engine, 20, created_at=days[all_done] + timedelta(hours=2), status="done")
    kept_stuck = add_rows(engine, 20, created_at=days[with_stuck] + timedelta(hours=2), status="done")
    kept_stuck += add_rows(engine, 1, created_at=days[with_stuck] + timedelta(hours=3), status="stuck")
    kept_pending = add_rows(engine, 20, created_at=days[with_pending] + timedelta(hours=2), status="done")
    kept_pending += add_rows(engine, 1, created_at=days[with_pending] + timedelta(hours=3), status="pending")

    outcome = drop_done_partitions(engine, PartitionedEvent, older_than=today)

    assert outcome == {"dropped": 1, "kept_unfinished": 2, "skipped": 0}
    names = partition_names(engine)
    assert all_done not in names and with_stuck in names and with_pending in names
    found = rows_by_partition(engine)
    assert found[with_stuck] == set(kept_stuck) and found[with_pending] == set(kept_pending)  # done rows stay too
    assert drop_done_partitions(engine, PartitionedEvent, older_than=today)["dropped"] == 0


@pytest.mark.parametrize("change", ["reset of the stuck row", "replay of a done row"])
def test_retention_racing_a_change_of_a_row_in_the_partition_keeps_the_partition(engine, today, change):
    """A transaction makes a row of the partition pending and has not committed when retention starts: retention
    waits for it, then sees the row pending and keeps the partition."""
    days = old_partitions(engine, today)
    name = next(iter(days))
    ids = add_rows(engine, 10, created_at=days[name] + timedelta(hours=1), status="done")
    if change.startswith("reset"):
        ids += add_rows(engine, 1, created_at=days[name] + timedelta(hours=2), status="stuck")
        statement = f"UPDATE {TABLE} SET status = 'pending', attempts = 0 WHERE id = :id AND status = 'stuck'"
    else:
        statement = f"UPDATE {TABLE} SET status = 'pending', delivered_at = NULL WHERE id = :id AND status = 'done'"
    outcomes: list[dict[str, int]] = []
    with engine.connect() as changer:
        changer.execute(text(statement), {"id": ids[-1]})
        retention = threading.Thread(
            target=lambda: outcomes.append(
                drop_done_partitions(engine, PartitionedEvent, older_than=today, lock_timeout=60)
            )
        )
        retention.start()
        wait_for_a_lock_wait(engine, statement="LOCK TABLE")
        changer.commit()
    retention.join()

    assert outcomes[0]["kept_unfinished"] == 1  # the two empty days around it are dropped
    assert name in partition_names(engine)
    assert rows_by_partition(engine)[name] == set(ids)


def test_retention_waits_no_longer_than_its_lock_timeout_and_drops_nothing(engine, today):
    days = old_partitions(engine, today)
    for day in days.values():
        add_rows(engine, 2, created_at=day + timedelta(hours=1), status="done")
    with engine.connect() as reader:
        reader.execute(text(f"SELECT count(*) FROM {TABLE}"))  # an open transaction holding the table

        outcome = drop_done_partitions(engine, PartitionedEvent, older_than=today, lock_timeout=0.2)

        reader.rollback()
    assert outcome == {"dropped": 0, "kept_unfinished": 0, "skipped": 3}
    assert set(days) <= set(partition_names(engine))


@pytest.fixture
def kit(engine: Engine, today) -> Iterator[OutboxKit]:
    kit = OutboxKit(engine, [PartitionedEvent], clock=ManualClock(today + DAY * 40))
    yield kit
    kit.close()


def test_the_scheduler_keeps_partitions_with_one_job_and_deletes_no_rows_one_by_one(kit):
    jobs = {job.id for job in kit.scheduler.jobs()}

    assert partitions_job_id(PartitionedEvent) in jobs
    assert retention_job_id(PartitionedEvent) not in jobs


def test_one_run_of_the_job_makes_partitions_ahead_and_drops_old_done_ones_and_records_what_it_did(kit, engine, today):
    """The kit's clock is 40 days on: the table's five partitions are past the one-day retention, and the days
    around the clock need partitions."""
    add_rows(engine, 4, created_at=today + timedelta(hours=1), status="done")
    kept = add_rows(engine, 1, created_at=today + DAY + timedelta(hours=1), status="stuck")

    record = kit.scheduler.run_job(partitions_job_id(PartitionedEvent), scheduled_for=today + DAY * 40)

    assert (record.outcome, record.counts) == (
        "ok", {"created": 5, "moved_from_default": 0, "skipped": 0, "dropped": 4, "kept_unfinished": 1},
    )
    assert rows_by_partition(engine) == {f"{TABLE}_p{today + DAY:%Y%m%d}": set(kept)}
    assert f"{TABLE}_p{today + DAY * 44:%Y%m%d}" in partition_names(engine)


def test_set_outbox_storage_gives_a_plain_outbox_the_autovacuum_settings(engine):
    migrate(engine, lambda operations: set_outbox_storage(SampleEvent, operations=operations))

    with engine.connect() as connection:
        options = connection.execute(
            text("SELECT reloptions FROM pg_class WHERE oid = 'sample_event_outbox'::regclass")
        ).scalar_one()
    assert set(options) == {f"{name}={value}" for name, value in OUTBOX_STORAGE_PARAMETERS.items()}


def test_the_drain_delivers_rows_of_every_partition_and_of_the_default_one(engine, today, receiver):
    spread = [today - DAY * 2, today, today + DAY * 2, today + DAY * 60]  # the first and last: DEFAULT
    ids = [row for moment in spread for row in add_rows(engine, 5, created_at=moment + timedelta(hours=1))]
    with engine.begin() as connection:
        connection.execute(text(f"UPDATE {TABLE} SET target_url = :url"), {"url": receiver.url + "/events"})
    transport = HttpTransport()
    drainer = Drainer(engine, PartitionedEvent, transport=transport, clock=ManualClock(today + DAY * 70))
    try:
        while drainer.drain_once().claimed:
            pass
    finally:
        drainer.close()
        transport.close()

    with engine.connect() as connection:
        statuses = dict(connection.execute(text(f"SELECT id, status FROM {TABLE}")).all())
    assert statuses == {row: "done" for row in ids}
    assert len(receiver.requests) == len(ids)


def test_the_operators_counts_lists_replay_and_export_work_across_partitions(kit, engine, today):
    stuck = [row for day in (0, 2) for row in add_rows(engine, 3, created_at=today + DAY * day, status="stuck")]
    stuck += add_rows(engine, 2, created_at=today + DAY * 90, status="stuck")  # in DEFAULT
    done = [row for day in (0, 1, 3) for row in add_rows(engine, 4, created_at=today + DAY * day, status="done")]
    pending = add_rows(engine, 5, created_at=today + DAY)
    operations = OperationsService(kit)

    counts = operations.outbox_overview("partitioned-events").counts
    page = operations.rows("partitioned-events", status="stuck", row_filter=RowFilter(), cursor=None, limit=5)
    rest = operations.rows("partitioned-events", status="stuck", row_filter=RowFilter(), cursor=page.next_cursor, limit=5)
    exported = b"".join(operations.exports.open("partitioned-events", row_filter=RowFilter(), status="done", format="csv"))
    replayed = operations.replays.replay("partitioned-events", RowFilter(), actor="test", dry_run=False)
    detail = operations.row("partitioned-events", stuck[-1])

    assert (counts.pending, counts.stuck, counts.done) == (len(pending), len(stuck), len(done))
    listed = [row.id for row in page.rows + rest.rows]
    assert sorted(listed) == sorted(stuck) and len(listed) == len(stuck)
    assert len(exported.decode().strip().splitlines()) == len(done) + 1  # a header and each done row
    assert replayed.replayed == len(done)
    assert detail.id == stuck[-1]
    after = operations.outbox_overview("partitioned-events").counts
    assert (after.pending, after.done) == (len(pending) + len(done), 0)


def test_counts_past_the_exact_limit_are_estimated_from_every_partition(kit, engine, today):
    for day in range(4):
        add_rows(engine, 3_000, created_at=today + DAY * day, status="done")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for name in partition_names(engine):
            connection.execute(text(f"ANALYZE {name}"))  # what autovacuum does; it never analyzes the parent

    counts = OperationsService(kit).outbox_overview("partitioned-events").counts

    assert counts.done_estimated
    assert 11_000 <= counts.done <= 13_000  # 12,000 rows, summed over the partitions' statistics


def test_an_existing_outbox_is_converted_online_keeping_every_row_while_writers_go_on(engine):
    PlainBase.metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO converted_outbox (target_url, status, created_at) "
            "SELECT 'http://127.0.0.1:9/c', (ARRAY['pending', 'done', 'stuck'])[n % 3 + 1], now() - n * interval '1 hour' "
            "FROM generate_series(1, 300) AS n"
        ))
        before = dict(connection.execute(text("SELECT id, status FROM converted_outbox")).all())
    stop = threading.Event()
    written: list[int] = []
    errors: list[BaseException] = []

    def write() -> None:  # an application inserting through the whole conversion, never refused
        try:
            while not stop.is_set():
                with engine.begin() as connection:
                    written.append(connection.execute(text(
                        "INSERT INTO converted_outbox (target_url) VALUES ('http://127.0.0.1:9/w') RETURNING id"
                    )).scalar_one())
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        migrate(engine, lambda operations: convert_to_partitioned(ConvertedTable, operations=operations, lock_timeout=30))
    finally:
        stop.set()
        writer.join()
    after_ids = add_converted_rows(engine, 3)

    assert not errors and written
    with engine.connect() as connection:
        kind = connection.execute(text("SELECT relkind FROM pg_class WHERE oid = 'converted_outbox'::regclass")).scalar_one()
        rows = dict(connection.execute(text("SELECT id, status FROM converted_outbox")).all())
        places = dict(connection.execute(text("SELECT id, tableoid::regclass::text FROM converted_outbox")).all())
        leftovers = connection.execute(text(
            "SELECT count(*) FROM pg_constraint WHERE conname LIKE '%conv_before_cutover'"
        )).scalar_one()
        names = [partition.name for partition in partitions(connection, PartitionTable(ConvertedTable))]
    assert kind == "p"
    assert {row: rows[row] for row in before} == before  # every row kept, with its status
    assert set(rows) == set(before) | set(written) | set(after_ids) and len(rows) == len(before) + len(written) + 3
    assert min(after_ids) > max(set(before) | set(written))  # the id sequence carried over
    assert {places[row] for row in before} == {"converted_outbox_pbefore"}
    assert leftovers == 0
    assert names[:2] == ["converted_outbox_pbefore", "converted_outbox_pdefault"] and len(names) == 2 + 5
    # The job finds nothing to do: the weeks before the cutover are the first partition's.
    assert ensure_partitions(engine, ConvertedTable, now=database_now(engine)) == {
        "created": 0, "moved_from_default": 0, "skipped": 0,
    }


def test_a_conversion_whose_swap_fails_leaves_the_table_as_it_was(engine):
    """The swap refuses a cutover that has passed (here: a conversion prepared a month ago): it is rolled back
    and the indexes and CHECK of the preparation are dropped again."""
    PlainBase.metadata.create_all(engine)
    long_ago = database_now(engine) - DAY * 30

    with pytest.raises(Exception, match="cutover .* has passed"):
        migrate(engine, lambda operations: convert_to_partitioned(ConvertedTable, operations=operations, now=long_ago))

    with engine.connect() as connection:
        kind = connection.execute(text("SELECT relkind FROM pg_class WHERE oid = 'converted_outbox'::regclass")).scalar_one()
        indexes = connection.execute(text(
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'converted_outbox' AND indexname LIKE '%\\_conv\\_%\\_created'"
        )).scalar_one()
        checks = connection.execute(text(
            "SELECT count(*) FROM pg_constraint WHERE conrelid = 'converted_outbox'::regclass AND contype = 'c'"
        )).scalar_one()
    assert (kind, indexes, checks) == ("r", 0, 1)  # a plain table with only the status CHECK
    add_converted_rows(engine, 1)  # and it takes rows dated now, past the refused cutover


def add_converted_rows(engine: Engine, count: int) -> list[int]:
    statement = insert(ConvertedTable).returning(ConvertedTable.id, sort_by_parameter_order=True)
    with engine.begin() as connection:
        return list(connection.scalars(statement, [{"target_url": "http://127.0.0.1:9/a"}] * count))
