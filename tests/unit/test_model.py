"""The outbox mixin and its options: validation, class checks, the kit's checks of its outboxes.

The schema in PostgreSQL is in tests/integration/test_model.py.
"""

from __future__ import annotations

import pytest
from exampleapp.models import Grant
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit import ConfigurationError, Delivery, Outbox, OutboxKit, OutboxOptions
from outboxkit.model import LEASE_MARGIN_SECONDS
from tests.support.models import SampleEvent

NEVER_CONNECTED = "postgresql+psycopg://nobody@127.0.0.1:1/never_connected"


def fresh_base() -> type[DeclarativeBase]:
    class Base(DeclarativeBase):
        pass

    return Base


# -- OutboxOptions ---------------------------------------------------------------


def test_options_defaults():
    options = OutboxOptions(job_name="credit-grants")
    assert (options.backoff, options.max_attempts) == ((5, 15, 60, 300, 900, 3600), 24)
    assert (options.batch_size, options.concurrency, options.timeout, options.lease) == (50, 32, 10.0, None)
    assert options.settings_key == "credit_grants"


@pytest.mark.parametrize("job_name", ["credit-grants", "a", "webhooks_v2", "x" * 63])
def test_good_job_names_are_accepted(job_name):
    assert OutboxOptions(job_name=job_name).job_name == job_name


@pytest.mark.parametrize(
    "job_name",
    ["", "Credit-Grants", "credit grants", "2fast", "-leading", "_leading", "x" * 64, "crédit", "grants\n", "a.b", None, 7],
)
def test_bad_job_names_are_refused_with_an_example(job_name):
    with pytest.raises(ConfigurationError, match=r"job_name .* must be 1-63 chars .* \(e\.g\. 'credit-grants'\)"):
        OutboxOptions(job_name=job_name)


@pytest.mark.parametrize("name", ["batch_size", "concurrency"])
@pytest.mark.parametrize("value", [0, -1, 10_001, 2.0, True, "50", None])
def test_batch_size_and_concurrency_bounds(name, value):
    with pytest.raises(ConfigurationError, match=rf"{name} must be an integer from 1 to 10000"):
        OutboxOptions(job_name="grants", **{name: value})


@pytest.mark.parametrize("name", ["batch_size", "concurrency"])
@pytest.mark.parametrize("value", [1, 10_000])
def test_batch_size_and_concurrency_limits_are_inclusive(name, value):
    assert getattr(OutboxOptions(job_name="grants", **{name: value}), name) == value


@pytest.mark.parametrize("timeout", [0, -5, float("nan"), float("inf"), "10", True, None])
def test_bad_timeout_is_refused(timeout):
    with pytest.raises(ConfigurationError, match=r"outbox 'grants': timeout must be a positive number of seconds"):
        OutboxOptions(job_name="grants", timeout=timeout)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"backoff": ()}, "backoff needs at least one step"),
        ({"backoff": (5, -1)}, "backoff steps must be finite seconds >= 0"),
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1"),
    ],
)
def test_bad_retry_options_are_refused_as_configuration_errors(arguments, message):
    with pytest.raises(ConfigurationError, match=rf"outbox 'grants': {message}"):
        OutboxOptions(job_name="grants", **arguments)


def test_minimum_lease_covers_every_round_of_timeouts_plus_a_margin():
    options = OutboxOptions(job_name="grants", batch_size=50, concurrency=16, timeout=10)
    assert options.minimum_lease == 4 * 10 + LEASE_MARGIN_SECONDS
    assert options.lease_seconds == options.minimum_lease


def test_a_lease_shorter_than_the_minimum_is_refused_with_the_fix():
    with pytest.raises(ConfigurationError) as raised:
        OutboxOptions(job_name="grants", batch_size=50, concurrency=10, timeout=10, lease=60)
    message = str(raised.value)
    assert "lease 60s is shorter than the slowest batch" in message
    assert "= 80s" in message
    assert "raise lease or concurrency, or lower timeout or batch_size" in message


def test_a_lease_at_or_above_the_minimum_is_kept():
    options = OutboxOptions(job_name="grants", batch_size=50, concurrency=10, timeout=10, lease=80)
    assert options.lease_seconds == 80.0
    assert OutboxOptions(job_name="grants", lease=3600).lease_seconds == 3600.0


@pytest.mark.parametrize("lease", [float("nan"), float("inf"), True, "600"])
def test_a_lease_that_is_not_finite_seconds_is_refused(lease):
    with pytest.raises(ConfigurationError, match="lease must be a finite number of seconds"):
        OutboxOptions(job_name="grants", lease=lease)


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "4"])
def test_hung_send_limit_must_be_a_positive_integer_or_none(limit):
    with pytest.raises(ConfigurationError, match="hung_send_limit must be None"):
        OutboxOptions(job_name="grants", hung_send_limit=limit)
    assert OutboxOptions(job_name="grants", concurrency=8).hung_sends_allowed == 32  # four times concurrency
    assert OutboxOptions(job_name="grants", hung_send_limit=100).hung_sends_allowed == 100


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), True, "1"])
def test_hung_send_seconds_must_be_positive_seconds_or_none(seconds):
    with pytest.raises(ConfigurationError, match="hung_send_seconds must be None"):
        OutboxOptions(job_name="grants", hung_send_seconds=seconds)
    assert OutboxOptions(job_name="grants").hung_send_seconds == 1.0
    assert OutboxOptions(job_name="grants", hung_send_seconds=None).hung_send_seconds is None
    # The lease is sized as before: a hung send neither shortens a row's wait nor lengthens its own deadline.
    assert OutboxOptions(job_name="grants", hung_send_seconds=0.1).minimum_lease == OutboxOptions(job_name="grants").minimum_lease


def test_retention_is_off_by_default_and_takes_seconds():
    assert OutboxOptions(job_name="grants").retain_done_for is None
    assert OutboxOptions(job_name="grants", retain_done_for=7 * 86400).retain_done_for == 604800
    assert OutboxOptions(job_name="grants", retain_done_for=60.0).retain_done_for == 60.0


@pytest.mark.parametrize("retain", [0, -1, 59.9, 7, float("nan"), float("inf"), True, "604800", [604800]])
def test_a_bad_retention_is_refused_with_an_example(retain):
    with pytest.raises(
        ConfigurationError,
        match=r"outbox 'grants': retain_done_for must be None \(keep delivered rows forever\) or a number of seconds "
        r"of at least 60, e\.g\. 7 \* 86400 for a week; got ",
    ):
        OutboxOptions(job_name="grants", retain_done_for=retain)


def test_options_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        OutboxOptions("grants")  # type: ignore[misc]
    options = OutboxOptions(job_name="grants")
    with pytest.raises(AttributeError):
        options.max_attempts = 3  # type: ignore[misc]


# -- the mixin's class checks ----------------------------------------------------


def test_a_subclass_without_outbox_options_is_refused_and_not_mapped():
    base = fresh_base()
    with pytest.raises(ConfigurationError, match=r"Orphan must declare __outbox__ = OutboxOptions\(job_name='...'\)"):

        class Orphan(Outbox, base):
            __tablename__ = "orphan_outbox"

            def build_delivery(self) -> Delivery:
                return Delivery(url="http://127.0.0.1:1/")

    assert "orphan_outbox" not in base.metadata.tables


def test_outbox_options_of_the_wrong_type_are_refused():
    with pytest.raises(ConfigurationError, match="must declare __outbox__ = OutboxOptions"):

        class Wrong(Outbox, fresh_base()):
            __tablename__ = "wrong_outbox"
            __outbox__ = {"job_name": "wrong"}

            def build_delivery(self) -> Delivery:
                return Delivery(url="http://127.0.0.1:1/")


def test_a_subclass_without_build_delivery_is_refused_and_not_mapped():
    base = fresh_base()
    with pytest.raises(ConfigurationError, match=r"Silent must implement build_delivery\(self\) -> Delivery"):

        class Silent(Outbox, base):
            __tablename__ = "silent_outbox"
            __outbox__ = OutboxOptions(job_name="silent")

    assert "silent_outbox" not in base.metadata.tables


def test_an_abstract_intermediate_is_allowed_and_its_subclasses_checked():
    base = fresh_base()

    class TenantOutbox(Outbox, base):
        __abstract__ = True

        tenant: Mapped[str] = mapped_column()

        def build_delivery(self) -> Delivery:
            return Delivery(url=f"http://127.0.0.1:1/{self.tenant}")

    class InvoiceOutbox(TenantOutbox):
        __tablename__ = "invoice_outbox"
        __outbox__ = OutboxOptions(job_name="invoices")

    table = base.metadata.tables["invoice_outbox"]
    assert {"tenant", "idempotency_key", "status", "next_attempt_at", "claim_token"} <= set(table.columns.keys())
    assert {index.name for index in table.indexes} == {
        "ix_invoice_outbox_due_id",
        "ix_invoice_outbox_stuck",
        "ix_invoice_outbox_discarded",
        "ix_invoice_outbox_claimed",
        "ix_invoice_outbox_destination_due",
    }
    assert InvoiceOutbox(tenant="acme").build_delivery().url == "http://127.0.0.1:1/acme"

    with pytest.raises(ConfigurationError, match="Untitled must declare __outbox__"):

        class Untitled(TenantOutbox):
            __tablename__ = "untitled_outbox"


# -- the kit's start-up checks ---------------------------------------------------


def test_a_kit_on_sqlite_is_refused():
    engine = create_engine("sqlite://")
    try:
        with pytest.raises(
            ConfigurationError, match=r"outboxkit needs PostgreSQL .* the engine is 'sqlite'.*postgresql\+psycopg://"
        ):
            OutboxKit(engine, [SampleEvent])
    finally:
        engine.dispose()


@pytest.fixture
def offline_engine():
    engine = create_engine(NEVER_CONNECTED)
    yield engine
    engine.dispose()


def make_outbox(base: type[DeclarativeBase], class_name: str, table: str, job_name: str) -> type[Outbox]:
    def build_delivery(self) -> Delivery:
        return Delivery(url="http://127.0.0.1:1/")

    namespace = {"__tablename__": table, "__outbox__": OutboxOptions(job_name=job_name), "build_delivery": build_delivery}
    return type(class_name, (Outbox, base), namespace)


def test_duplicate_job_names_are_refused(offline_engine):
    base = fresh_base()
    first = make_outbox(base, "FirstGrants", "first_grant_outbox", "grants")
    second = make_outbox(base, "SecondGrants", "second_grant_outbox", "grants")
    with pytest.raises(ConfigurationError, match="job_name 'grants' is used by both FirstGrants and SecondGrants"):
        OutboxKit(offline_engine, [first, second])


def test_job_names_that_collide_in_settings_are_refused(offline_engine):
    base = fresh_base()
    dashed = make_outbox(base, "Dashed", "dashed_outbox", "credit-grants")
    underscored = make_outbox(base, "Underscored", "underscored_outbox", "credit_grants")
    with pytest.raises(ConfigurationError, match="share the settings key 'credit_grants'"):
        OutboxKit(offline_engine, [dashed, underscored])


def test_the_same_class_twice_is_refused(offline_engine):
    with pytest.raises(ConfigurationError, match="SampleEvent is listed twice"):
        OutboxKit(offline_engine, [SampleEvent, SampleEvent])


@pytest.mark.parametrize("outboxes", [[], [Grant], [object], ["sample-events"]])
def test_a_kit_needs_mapped_outbox_classes(offline_engine, outboxes):
    with pytest.raises(ConfigurationError, match="at least one outbox class|is not a mapped Outbox subclass"):
        OutboxKit(offline_engine, outboxes)


def test_the_circuit_breaker_is_on_by_default_and_breaker_none_turns_it_off():
    from outboxkit.breaker import BreakerOptions

    assert OutboxOptions(job_name="on").breaker == BreakerOptions()
    assert OutboxOptions(job_name="off", breaker=None).breaker is None


# -- partitioned outboxes ----------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"partition_by": "month"}, "partition_by must be None"),
        ({"partition_by": "day", "partitions_ahead": 1}, "partitions_ahead must be an integer from 2 to 366"),
        ({"partition_by": "week", "partitions_ahead": True}, "partitions_ahead must be an integer"),
    ],
)
def test_bad_partitioning_options_are_refused(options, message):
    with pytest.raises(ConfigurationError, match=message):
        OutboxOptions(job_name="partitioned", **options)


def partitioned_class(table: str, **options: object) -> type[Outbox]:
    class Partitioned(Outbox, fresh_base()):
        __tablename__ = table
        __outbox__ = OutboxOptions(job_name="partitioned", partition_by="day", **options)

        def build_delivery(self) -> Delivery:
            return Delivery(url="http://127.0.0.1:9/")

    return Partitioned


def test_a_partitioned_outbox_keys_its_table_on_id_and_created_at_and_its_rows_on_id():
    table = partitioned_class("p_outbox").__table__  # type: ignore[attr-defined]
    mapper = partitioned_class("p_outbox").__mapper__  # type: ignore[attr-defined]

    assert [column.name for column in table.primary_key] == ["id", "created_at"]
    assert [column.name for column in mapper.primary_key] == ["id"]
    assert table.dialect_options["postgresql"]["partition_by"] == "RANGE (created_at)"
    unique = next(constraint for constraint in table.constraints if constraint.name == "uq_p_outbox_idempotency_key")
    assert [column.name for column in unique.columns] == ["idempotency_key", "created_at"]


def test_a_plain_outbox_keeps_its_key_and_its_column_order():
    assert [column.name for column in SampleEvent.__table__.primary_key] == ["id"]
    assert list(SampleEvent.__table__.columns.keys())[3:] == [
        "id", "idempotency_key", "status", "attempts", "next_attempt_at", "last_error", "last_status_code",
        "created_at", "updated_at", "delivered_at", "claimed_until", "claim_token", "destination",
    ]


def test_a_partitioned_outbox_whose_partition_names_would_not_fit_is_refused():
    with pytest.raises(ConfigurationError, match="at most 53 bytes"):
        partitioned_class("x" * 54)
