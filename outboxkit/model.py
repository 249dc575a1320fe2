"""The outbox row: a mixin an application subclasses.

::

    class Base(DeclarativeBase):
        pass

    class CreditGrant(Outbox, Base):
        __tablename__ = "credit_grant_outbox"
        __outbox__ = OutboxOptions(job_name="credit-grants")

        workspace_id: Mapped[int]
        amount: Mapped[int]

        def build_delivery(self) -> Delivery:
            return Delivery(url="https://billing.internal/grants",
                            json={"workspace": self.workspace_id, "amount": self.amount})

The mixin owns the delivery columns (status, attempts, due time, claim lease,
last error...), a CHECK on ``status`` and the partial indexes the kit reads
through (see ``outbox_table_args``).  The application adds its own columns and
says what to send for one row.  A row inserted with ``next_attempt_at`` in the
future is a scheduled one-shot send.

One module: the mixin, its options and the checks a subclass gets at class creation
(``__init_subclass__`` refuses a concrete subclass that does not override ``build_delivery``).
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    DDL,
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy import event as sqlalchemy_event
from sqlalchemy.dialects.postgresql import dialect as postgresql_dialect
from sqlalchemy.orm import Mapped, MappedColumn, configure_mappers, declared_attr, mapped_column

from outboxkit.breaker import DESTINATION_NAME_LIMIT, BreakerOptions, check_destination_name, destination_of
from outboxkit.errors import ConfigurationError
from outboxkit.policy import DEFAULT_BACKOFF, DEFAULT_MAX_ATTEMPTS, RetryPolicy
from outboxkit.rate_limits import RateLimit
from outboxkit.transports.base import Delivery, validate_timeout
from outboxkit.transports.signing import SigningTransport, WebhookSecrets

if TYPE_CHECKING:
    from outboxkit.transports.base import Transport

__all__ = [
    "PARTITION_INTERVALS", "STATUSES", "Outbox", "OutboxOptions", "default_partition_name", "destination_of_values",
    "outbox_table_args",
]

STATUSES = ("pending", "done", "stuck", "discarded")  # discarded: kept, never sent, by a person's choice
RELAYS = ("drain", "cdc")
LAST_ERROR_LIMIT = 2000
# The default of OutboxOptions.hung_send_seconds: a send out this long stops counting against concurrency
# (outboxkit.drain.hung_sends holds the rule).
DEFAULT_HUNG_SEND_SECONDS = 1.0
# The default of OutboxOptions.hung_send_limit, per send thread (concurrency): how many sends may hang at once.
HUNG_SENDS_PER_THREAD = 4
# Default lease time beyond the slowest possible batch, for recording outcomes
# and scheduling jitter (``OutboxOptions.lease_margin``).
LEASE_MARGIN_SECONDS = 30.0
# The shortest retention accepted: a smaller value is almost surely a unit
# mistake (days or hours written as seconds).
MINIMUM_RETENTION_SECONDS = 60.0
_JOB_NAME = re.compile(r"[a-z][a-z0-9_-]{0,62}")
# The intervals a partitioned outbox may be cut into (OutboxOptions.partition_by), in days.
PARTITION_INTERVALS = {"day": 1, "week": 7}
# The longest table name a partitioned outbox may have: its partitions are named <table>_p<yyyymmdd>.
PARTITIONED_TABLE_NAME_LIMIT = 63 - len("_p20260101")


@dataclass(frozen=True, kw_only=True)
class OutboxOptions:
    """Per-outbox configuration, declared on the class as ``__outbox__``.

    ``job_name`` is the stable human name that the scheduler's job, the logs,
    the admin and the per-outbox settings key on: renaming it is a breaking
    change for monitors.  ``backoff`` and ``max_attempts`` may be overridden
    per environment (see ``OutboxKitSettings.outboxes``).

    ``timeout`` is each attempt's total deadline: a transport's ``send``
    returns within it (``HttpTransport`` enforces it), so the lease can be
    sized on it.

    ``lease_margin`` is how much longer than the slowest possible batch a
    claim holds its rows (default 30 s).  A shorter margin brings a crashed
    worker's rows back sooner but leaves less room for a slow database or a
    paused process.  Whatever the margin, a send never runs past its row's
    lease: its deadline is cut to end a third of the margin (at most 5 s)
    before the lease does, and a row with too little of its lease left when
    its send could start is not sent but retried, so a live delivery is
    never claimed twice.

    ``sign_webhooks`` (default False) signs every request as Standard
    Webhooks defines it (``webhook-id``, ``webhook-timestamp``,
    ``webhook-signature``; see ``outboxkit.transports.signing``).  Its secrets,
    ``webhook_secrets``, come from settings
    (``OUTBOXKIT_OUTBOXES__<KEY>__WEBHOOK_SECRETS``); an outbox that signs
    without a secret, or has secrets but does not sign, is refused when the
    kit starts.  They are never shown in the options' repr.

    ``breaker`` is each destination's circuit breaker and its thresholds,
    on by default (``BreakerOptions()``: 5 consecutive failures with no success
    for 10 s open it, a 30 s cool-down doubling up to 600 s; a ``410 Gone`` disables the
    destination until a person resumes it in the admin's destinations page,
    its JSON API or ``outboxkit destinations resume``; see
    docs/destinations.md).  ``breaker=None`` turns it off: every row is then
    sent and retried on its own backoff whatever its destination does.
    ``destination_concurrency`` caps the rows claimed at once for one
    destination, across every process, while it is suspect (no success on
    record yet, a failure run, or a send out longer than a second) and other
    destinations have rows due; default ``max(1, concurrency // 4)``, so a
    receiver that hangs holds at most a quarter of the send threads
    (``outboxkit.storage.destination_claim``).
    ``hung_send_seconds`` (default 1 s; None turns it off): a send out
    longer than this (or than four times its destination's slowest recent
    answer, if that is longer; to a destination that has not answered yet,
    four times the outbox's slowest recent answer, from 0.1 s up to this)
    is *hung* and stops counting against
    ``concurrency``: it keeps its thread and its place under its
    destination's cap, and the drain claims and sends others beside it, on
    more threads (``outboxkit.drain.hung_sends``).  It may be replaced per
    environment (``OUTBOXKIT_OUTBOXES__<KEY>__HUNG_SEND_SECONDS``: seconds,
    or ``off``).
    ``hung_send_limit`` (default None: four times ``concurrency``): how many
    sends of one drainer may be hung at once, each on a thread beyond
    ``concurrency``; a send overdue beyond that keeps counting.  Many dead
    destinations at once, one row each, need as many hung sends before the
    healthy destinations lose a send thread to them.  Per environment:
    ``OUTBOXKIT_OUTBOXES__<KEY>__HUNG_SEND_LIMIT``.
    ``rate_limit`` (default None: none) limits the requests per second each
    destination gets, across every process (``RateLimit(per_second=...)``,
    or limits for named destinations; ``outboxkit.rate_limits`` says how
    precise it is).  A destination without a limit pays nothing for it.  It
    may be replaced per environment like ``backoff``
    (``OUTBOXKIT_OUTBOXES__<KEY>__RATE_LIMIT``: a number, JSON or ``off``).

    ``ordering_key`` (default None: rows are unordered) names a column of the
    outbox (its attribute name) whose value orders delivery: rows sharing a
    value are sent one at a time in ``id`` order, each only once the one
    before it is ``done`` (or skipped by a person), so a retrying row holds
    the rows behind it and a ``stuck`` one blocks its key until an operator
    retries or skips it.  Rows with a NULL key are unordered.  Different keys
    proceed in parallel; see ``outboxkit.storage.ordering`` and docs/destinations.md,
    "Ordered delivery".  The mixin then adds the indexes the ordered claim
    reads (``outbox_table_args``).  A name that is not a column of the class
    is refused when the class is defined.

    ``retain_done_for`` (seconds, default None: keep every row forever) turns
    on retention of delivered rows: a scheduled job deletes ``done`` rows
    whose ``delivered_at`` is older than that, never a ``pending`` or
    ``stuck`` row (see ``outboxkit.leader.retention``).  It may be overridden per
    environment like ``backoff``.

    ``partition_by`` (default None: one plain table) makes the outbox a
    table partitioned by ``created_at`` with PostgreSQL's declarative range
    partitioning, one partition per ``"day"`` or ``"week"`` (UTC, weeks from
    Monday).  The table's primary key is then ``(id, created_at)``; ``id``
    stays unique in practice (it comes from one identity sequence) but is
    no longer enforced by a unique index, and neither is ``idempotency_key``
    alone (``(idempotency_key, created_at)`` is).  A DEFAULT partition
    (``<table>_pdefault``) takes any row whose partition does not exist yet,
    so an insert never fails for want of one; the elected job
    ``<job_name>-partitions`` keeps ``partitions_ahead`` intervals (default
    4, at least 2) created ahead and moves rows out of the DEFAULT partition
    into the partition it creates for them.  With ``retain_done_for``, that
    job also drops a partition once its whole range is older than the
    period and every row in it is ``done``; a partition holding a
    ``pending`` or ``stuck`` row is never dropped and all its rows stay
    (``outboxkit.leader.partitions``, docs/partitioning.md).
    ``relay`` is ``"drain"`` (the default: the kit delivers the rows) or
    ``"cdc"``: a change data capture connector reads the rows from the WAL,
    the kit schedules no drain for the outbox and its workers leave it alone,
    and the class needs no ``build_delivery`` (``outboxkit.storage.debezium``,
    docs/cdc.md).
    """

    job_name: str
    backoff: tuple[float, ...] = DEFAULT_BACKOFF
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    batch_size: int = 50
    concurrency: int = 32
    timeout: float = 10.0
    lease: float | None = None
    lease_margin: float = LEASE_MARGIN_SECONDS
    retain_done_for: float | None = None
    transport: Transport | None = field(default=None, compare=False)
    breaker: BreakerOptions | None = BreakerOptions()  # None: off
    destination_concurrency: int | None = None
    hung_send_seconds: float | None = DEFAULT_HUNG_SEND_SECONDS
    hung_send_limit: int | None = None
    rate_limit: RateLimit | None = None
    sign_webhooks: bool = False
    webhook_secrets: WebhookSecrets | Sequence[str] | None = field(default=None, repr=False, compare=False)
    ordering_key: str | None = None
    partition_by: str | None = None
    partitions_ahead: int = 4
    # "drain": the kit delivers the rows; "cdc": change data capture reads them from the WAL and the kit never
    # drains this outbox (docs/cdc.md).
    relay: str = "drain"

    def __post_init__(self) -> None:
        if not isinstance(self.job_name, str) or not _JOB_NAME.fullmatch(self.job_name):
            raise ConfigurationError(
                f"job_name {self.job_name!r} must be 1-63 chars of lowercase letters, digits, '-' or '_', "
                "starting with a letter (e.g. 'credit-grants')"
            )
        if self.relay not in RELAYS:
            raise ConfigurationError(
                f"outbox {self.job_name!r}: relay must be one of {', '.join(map(repr, RELAYS))}, got {self.relay!r} "
                "('cdc': a change data capture connector reads the rows and the kit does not drain them)"
            )
        for name in ("batch_size", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
                raise ConfigurationError(f"{name} must be an integer from 1 to 10000, got {value!r}")
        try:
            validate_timeout(self.timeout)
            RetryPolicy(backoff=self.backoff, max_attempts=self.max_attempts)
        except ValueError as exc:
            raise ConfigurationError(f"outbox {self.job_name!r}: {exc}") from None
        object.__setattr__(self, "backoff", tuple(self.backoff))
        margin = self.lease_margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin <= 0:
            raise ConfigurationError(
                f"outbox {self.job_name!r}: lease_margin must be a positive number of seconds, got {margin!r}"
            )
        retain = self.retain_done_for
        if retain is not None and (
            isinstance(retain, bool)
            or not isinstance(retain, (int, float))
            or not math.isfinite(retain)
            or retain < MINIMUM_RETENTION_SECONDS
        ):
            raise ConfigurationError(
                f"outbox {self.job_name!r}: retain_done_for must be None (keep delivered rows forever) or a number "
                f"of seconds of at least {MINIMUM_RETENTION_SECONDS:g}, e.g. 7 * 86400 for a week; got {retain!r}"
            )
        self._check_signing_options()
        self._check_partitioning()
        key = self.ordering_key
        if key is not None and (not isinstance(key, str) or not key.isidentifier()):
            raise ConfigurationError(
                f"outbox {self.job_name!r}: ordering_key must be None or the attribute name of one of the outbox's "
                f"columns (e.g. ordering_key='account_id'), got {key!r}"
            )
        if self.breaker is not None and not isinstance(self.breaker, BreakerOptions):
            raise ConfigurationError(
                f"outbox {self.job_name!r}: breaker must be BreakerOptions(...) or None, got {type(self.breaker).__name__}"
            )
        if self.rate_limit is not None and not isinstance(self.rate_limit, RateLimit):
            raise ConfigurationError(
                f"outbox {self.job_name!r}: rate_limit must be RateLimit(...) or None, got {type(self.rate_limit).__name__}"
            )
        cap = self.destination_concurrency
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= self.concurrency):
            raise ConfigurationError(
                f"outbox {self.job_name!r}: destination_concurrency must be None or an integer from 1 to concurrency "
                f"({self.concurrency}), got {cap!r}"
            )
        hung = self.hung_send_seconds
        if hung is not None and (
            isinstance(hung, bool) or not isinstance(hung, (int, float)) or not math.isfinite(hung) or hung <= 0
        ):
            raise ConfigurationError(
                f"outbox {self.job_name!r}: hung_send_seconds must be None (off) or a positive number of seconds, "
                f"got {hung!r}"
            )
        limit = self.hung_send_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ConfigurationError(
                f"outbox {self.job_name!r}: hung_send_limit must be None (four times concurrency) or a positive "
                f"integer, got {limit!r}"
            )
        if self.lease is not None:
            if isinstance(self.lease, bool) or not isinstance(self.lease, (int, float)) or not math.isfinite(self.lease):
                raise ConfigurationError(
                    f"outbox {self.job_name!r}: lease must be a finite number of seconds, got {self.lease!r}"
                )
            if self.lease < self.minimum_lease:
                raise ConfigurationError(
                    f"outbox {self.job_name!r}: lease {self.lease!r}s is shorter than the slowest batch "
                    "(ceil(batch_size / concurrency) * timeout + lease_margin "
                    f"{self.lease_margin:g}s = {self.minimum_lease:g}s), "
                    "so a live delivery could be claimed again; raise lease or concurrency, or lower timeout or batch_size"
                )

    def _check_signing_options(self) -> None:
        if not isinstance(self.sign_webhooks, bool):
            raise ConfigurationError(f"outbox {self.job_name!r}: sign_webhooks must be True or False, got {self.sign_webhooks!r}")
        if self.webhook_secrets is None:
            return
        if not isinstance(self.webhook_secrets, WebhookSecrets):  # a list of strings (or settings' SecretStr)
            try:
                object.__setattr__(self, "webhook_secrets", WebhookSecrets(self.webhook_secrets))
            except (TypeError, ValueError) as exc:  # the message names a secret by position, never its value
                raise ConfigurationError(f"outbox {self.job_name!r}: {exc}") from None
        if not self.sign_webhooks:
            raise ConfigurationError(
                f"outbox {self.job_name!r} has webhook secrets but does not sign its requests; declare "
                "OutboxOptions(sign_webhooks=True), or remove the secrets"
            )

    def _check_partitioning(self) -> None:
        if self.partition_by is not None and self.partition_by not in PARTITION_INTERVALS:
            raise ConfigurationError(
                f"outbox {self.job_name!r}: partition_by must be None (one plain table), 'day' or 'week', "
                f"got {self.partition_by!r}"
            )
        ahead = self.partitions_ahead
        if isinstance(ahead, bool) or not isinstance(ahead, int) or not 2 <= ahead <= 366:
            raise ConfigurationError(
                f"outbox {self.job_name!r}: partitions_ahead must be an integer from 2 to 366 (intervals created "
                f"ahead of now), got {ahead!r}"
            )

    def check_signing(self) -> None:
        """Refuse an outbox that signs without a secret (the kit calls it at start-up)."""
        if self.sign_webhooks and self.webhook_secrets is None:
            raise ConfigurationError(
                f"outbox {self.job_name!r} signs its requests (sign_webhooks=True) but has no secret; set "
                f"OUTBOXKIT_OUTBOXES__{self.settings_key.upper()}__WEBHOOK_SECRETS=whsec_... "
                "(several, comma-separated, while rotating)"
            )

    def sending_transport(self, transport: Transport) -> Transport:
        """The transport this outbox sends through: ``transport``, wrapped to sign each request when it signs."""
        self.check_signing()
        if not isinstance(self.webhook_secrets, WebhookSecrets):
            return transport
        return SigningTransport(transport, self.webhook_secrets)

    @property
    def destination_cap(self) -> int:
        """Sends in flight to one suspect destination: ``destination_concurrency``, or a quarter of ``concurrency``."""
        return self.destination_concurrency or max(1, self.concurrency // 4)

    @property
    def hung_sends_allowed(self) -> int:
        """Sends of one drainer that may be hung at once: ``hung_send_limit``, or four times ``concurrency``."""
        return self.hung_send_limit or HUNG_SENDS_PER_THREAD * self.concurrency

    @property
    def minimum_lease(self) -> float:
        """The shortest safe lease: every round of sends in a batch running to its deadline (``timeout``), plus a margin."""
        rounds = math.ceil(self.batch_size / self.concurrency)
        return rounds * self.timeout + self.lease_margin

    @property
    def lease_seconds(self) -> float:
        """How long a claim holds a row: ``lease`` if set, else ``minimum_lease``."""
        return float(self.lease) if self.lease is not None else self.minimum_lease

    @property
    def settings_key(self) -> str:
        """The key for this outbox in ``OUTBOXKIT_OUTBOXES`` (``credit-grants`` -> ``credit_grants``)."""
        return self.job_name.replace("-", "_")


def outbox_table_args(cls: type) -> tuple[Any, ...]:
    """The constraints and indexes the kit needs on an outbox table.

    Include them if you declare your own ``__table_args__``::

        @declared_attr.directive
        def __table_args__(cls):
            return (*outbox_table_args(cls), Index("ix_mine", "workspace_id"))

    Each partial index holds only the rows one reader looks at, so its size
    follows the work left, not the table:

    * ``ix_<table>_due_id`` on ``(next_attempt_at, id) WHERE status = 'pending'``
      serves the drain's claim, which orders by both columns.  Its name differs
      from the former ``ix_<table>_due`` (on ``next_attempt_at`` alone, which
      sorted every group of rows sharing one due time on each claim), so
      Alembic autogenerate on an existing table proposes dropping the old index
      and creating this one (docs/operations.md, "Upgrading the due index");
    * ``ix_<table>_stuck`` on ``id WHERE status = 'stuck'`` serves the admin's
      stuck list and count, and ``ix_<table>_discarded`` the discarded ones;
    * ``ix_<table>_claimed`` on ``claimed_until WHERE claimed_until IS NOT NULL``
      serves the in-flight count (``claimed_until > now`` implies the
      predicate): a claim sets the lease and every outcome write, park or
      reset clears it, so the index holds the rows claimed right now (and
      those of a crashed worker until they are claimed again);
    * ``ix_<table>_destination_due`` on ``(destination, next_attempt_at, id)
      WHERE status = 'pending'``: each destination's due rows in claim order,
      so the claim can read them per destination.

    An outbox with an ``ordering_key`` gets two more, which its claim reads
    (``outboxkit.storage.ordering``):

    * ``ix_<table>_order`` on ``(<key>, id) WHERE status <> 'done' AND <key>
      IS NOT NULL``: the rows not yet delivered of each key, in order; the
      claim steps from key to key and reads each key's first row;
    * ``ix_<table>_due_unkeyed`` on ``(next_attempt_at, id) WHERE status =
      'pending' AND <key> IS NULL``: the due rows without a key, which are
      unordered.
    """
    table = cls.__tablename__  # type: ignore[attr-defined]
    statuses = ", ".join(f"'{status}'" for status in STATUSES)
    # A unique constraint on a partitioned table must hold the partition key (docs/partitioning.md).
    unique_key = ("idempotency_key", "created_at") if _partitioned(cls) else ("idempotency_key",)
    indexes = (
        CheckConstraint(f"status IN ({statuses})", name=f"ck_{table}_status"),
        UniqueConstraint(*unique_key, name=f"uq_{table}_idempotency_key"),
        Index(f"ix_{table}_due_id", "next_attempt_at", "id", postgresql_where=text("status = 'pending'")),
        Index(f"ix_{table}_stuck", "id", postgresql_where=text("status = 'stuck'")),
        Index(f"ix_{table}_discarded", "id", postgresql_where=text("status = 'discarded'")),
        Index(f"ix_{table}_claimed", "claimed_until", postgresql_where=text("claimed_until IS NOT NULL")),
        Index(
            f"ix_{table}_destination_due", "destination", "next_attempt_at", "id",
            postgresql_where=text("status = 'pending'"),
        ),
    )
    options = getattr(cls, "__outbox__", None)
    key = options.ordering_key if isinstance(options, OutboxOptions) else None
    if key is None:
        return indexes
    column = _ordering_column_name(cls, key)
    return (
        *indexes,
        Index(f"ix_{table}_order", key, "id", postgresql_where=text(f"status <> 'done' AND {column} IS NOT NULL")),
        Index(
            f"ix_{table}_due_unkeyed", "next_attempt_at", "id",
            postgresql_where=text(f"status = 'pending' AND {column} IS NULL"),
        ),
    )


def _partitioned(cls: type) -> bool:
    options = getattr(cls, "__outbox__", None)
    return isinstance(options, OutboxOptions) and options.partition_by is not None


def default_partition_name(table: str) -> str:
    """The DEFAULT partition of a partitioned outbox table: ``<table>_pdefault``."""
    return f"{table}_pdefault"


def _check_partitioned_table(cls: type) -> None:
    """Refuse, at class definition, a partitioned outbox whose partitions' names would not fit PostgreSQL's 63 bytes."""
    table = getattr(cls, "__tablename__", None)
    if _partitioned(cls) and isinstance(table, str) and len(table.encode()) > PARTITIONED_TABLE_NAME_LIMIT:
        raise ConfigurationError(
            f"{cls.__name__}: a partitioned outbox's table name must be at most {PARTITIONED_TABLE_NAME_LIMIT} bytes "
            f"(its partitions are named <table>_p<yyyymmdd>), got {table!r}"
        )


def _partition_table(cls: type) -> None:
    """Make a partitioned outbox's mapped table partitioned, and give it a DEFAULT partition when it is created.

    Set on the table after mapping, so an application's own ``__table_args__``
    (``outbox_table_args`` plus its indexes) needs nothing more.  The DEFAULT
    partition comes with ``metadata.create_all`` (and the Alembic helper
    ``create_partitioned_outbox``): with it, no insert fails for want of a
    partition before the elected job has made them.
    """
    table = vars(cls).get("__table__")
    if table is None or not _partitioned(cls):
        return
    table.dialect_kwargs["postgresql_partition_by"] = "RANGE (created_at)"
    quote = postgresql_dialect().identifier_preparer.quote  # type: ignore[no-untyped-call]
    schema = f"{quote(table.schema)}." if table.schema else ""
    statement = (
        f"CREATE TABLE IF NOT EXISTS {schema}{quote(default_partition_name(table.name))} "
        f"PARTITION OF {schema}{quote(table.name)} DEFAULT"
    )
    sqlalchemy_event.listen(table, "after_create", DDL(statement))  # type: ignore[no-untyped-call]


def _ordering_column_name(cls: type, key: str) -> str:
    """The quoted database name of the ordering key's column (its attribute may be named differently)."""
    attribute = next((vars(klass)[key] for klass in cls.__mro__ if key in vars(klass)), None)
    name = getattr(getattr(attribute, "column", None), "name", None) or key
    return str(postgresql_dialect().identifier_preparer.quote(name))  # type: ignore[no-untyped-call]


def _check_ordering_key(cls: type, options: OutboxOptions) -> None:
    """Refuse, at class definition, an ordering key that is not one of the application's columns."""
    key = options.ordering_key
    if key is None:
        return
    owned = set(KIT_COLUMNS)
    columns = sorted(_declared_columns(cls) - owned)
    if key not in columns:
        reason = "is one of the kit's own columns" if key in owned else "is not a column of the class"
        raise ConfigurationError(
            f"{cls.__name__}: ordering_key {key!r} {reason}; name one of the application's columns "
            f"(declared: {', '.join(columns) or 'none'}), e.g. account_id: Mapped[int | None] = mapped_column() "
            "with OutboxOptions(..., ordering_key='account_id')"
        )


def _declared_columns(cls: type) -> set[str]:
    """Attribute names declared as columns on ``cls`` and its bases: ``Mapped[...]`` annotations, or column objects."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        names.update(name for name, hint in vars(klass).get("__annotations__", {}).items() if "Mapped" in str(hint))
        names.update(name for name, value in vars(klass).items() if isinstance(value, (MappedColumn, Column)))
    return names


class Outbox:
    """Mixin for an outbox table.  Subclass it together with your declarative base.

    Subclasses must set ``__tablename__``, ``__outbox__`` (an ``OutboxOptions``)
    and implement ``build_delivery``.  Intermediate abstract classes set
    ``__abstract__ = True``.
    """

    __outbox__: ClassVar[OutboxOptions]
    # Set by an outbox whose rows hold requests typed at run time (a schedule's HTTP target), not built by the
    # application's code: its URL and headers attributes, by name.  Every send of such a row passes the URL
    # guard, pinned to the checked address (outboxkit.transports.guarded), and those columns are shown redacted.
    __runtime_requests__: ClassVar[tuple[str, str] | None] = None

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    idempotency_key: Mapped[uuid.UUID] = mapped_column(
        Uuid, default=uuid.uuid4, server_default=func.gen_random_uuid(), nullable=False
    )
    status: Mapped[str] = mapped_column(String(16), default="pending", server_default=text("'pending'"))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_error: Mapped[str | None] = mapped_column(Text)
    last_status_code: Mapped[int | None] = mapped_column(SmallInteger)
    # sort_order=1 from here on keeps created_at (a declared_attr, which the ORM places after the plain
    # columns) in its place in the table: after last_status_code, before updated_at.
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), sort_order=1)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), sort_order=1)
    # The claim lease: a drain stamps both when it takes the row.  While
    # claimed_until is in the future the row is in flight; once it passes, the
    # row is due again (next_attempt_at is set to the same instant), which is
    # how a crashed worker's rows come back without any sweeper.
    claimed_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), sort_order=1)
    claim_token: Mapped[uuid.UUID | None] = mapped_column(Uuid, sort_order=1)

    @declared_attr
    @classmethod
    def created_at(cls) -> Mapped[datetime]:
        """When the row was inserted; the partition key of a partitioned outbox, then part of its primary key."""
        return mapped_column(DateTime(timezone=True), server_default=func.now(), primary_key=_partitioned(cls))

    @declared_attr
    @classmethod
    def destination(cls) -> Mapped[str | None]:
        """Where the row's delivery goes (``destination_for``), decided when the row is inserted.

        The ORM sets it before the insert (``_decide_destination``); any other
        insert through SQLAlchemy (``enqueue``, a Core ``insert()``) gets it as
        the column's default, from the values inserted.  NULL when it could
        not be decided then (``build_delivery`` or ``destination_for`` raised):
        the drain decides it after the claim, as for a row inserted before the
        column existed.
        """
        return mapped_column(
            String(DESTINATION_NAME_LIMIT),
            default=lambda context: destination_of_values(cls, context.get_current_parameters()),
            sort_order=1,
        )

    @declared_attr.directive
    @classmethod
    def __table_args__(cls) -> tuple[Any, ...]:
        return outbox_table_args(cls)

    @declared_attr.directive
    @classmethod
    def __mapper_args__(cls) -> dict[str, Any]:
        # A partitioned outbox's table key is (id, created_at); its rows are still addressed by id alone.
        return {"primary_key": [cls.__table__.c.id]} if _partitioned(cls) else {}  # type: ignore[attr-defined]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Check before the declarative base maps the class, so a refused
        # class leaves no table behind in the application's metadata.
        if not cls.__dict__.get("__abstract__", False):
            options = getattr(cls, "__outbox__", None)
            if not isinstance(options, OutboxOptions):
                raise ConfigurationError(
                    f"{cls.__name__} must declare __outbox__ = OutboxOptions(job_name='...'), "
                    "or set __abstract__ = True if it is an intermediate base"
                )
            if cls.build_delivery is Outbox.build_delivery and options.relay != "cdc":  # cdc: a connector sends
                raise ConfigurationError(f"{cls.__name__} must implement build_delivery(self) -> Delivery")
            _check_ordering_key(cls, options)
            _check_partitioned_table(cls)
        super().__init_subclass__(**kwargs)
        _partition_table(cls)

    def build_delivery(self) -> Delivery:
        """Say what to send for this row.  Runs in the drain, after the claim commits.

        Every concrete outbox class must override it: ``__init_subclass__`` refuses a class that does not, so this
        body runs only if it is called on the mixin itself.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement build_delivery")

    def destination_for(self, delivery: Delivery) -> str:
        """The destination this row's delivery goes to (``outboxkit.breaker``), stored on the row at insert.

        By default the URL's scheme, host and port.  Override it to name
        destinations yourself (per tenant, per partner): rows that share a
        name share a circuit breaker and a cap on sends in flight.  A name is
        a string of 1 to 300 characters.  It runs when the row is inserted,
        so it may read only what the row has then (not ``id``); if it or
        ``build_delivery`` raises there, the drain decides the destination
        after the claim, and an exception then is a failed attempt like one
        in ``build_delivery``.
        """
        return destination_of(delivery.url)

    def _decide_destination(self) -> str | None:
        """``destination_for(build_delivery())`` as the row is inserted; None when either raises."""
        try:
            delivery = self.build_delivery()
            return check_destination_name(self.destination_for(delivery)) if isinstance(delivery, Delivery) else None
        except Exception:  # the drain's build says it again, as the row's failed attempt
            return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self.id} status={self.status} attempts={self.attempts}>"


def destination_of_values(outbox: type[Outbox], values: dict[str, Any]) -> str | None:
    """The destination of a row about to be inserted as ``values`` (column keys), or None if it cannot be decided."""
    mapper = outbox.__mapper__  # type: ignore[attr-defined]
    if not mapper.configured:  # a Core insert before any ORM use: the attributes are instrumented on configuration
        configure_mappers()
    row = mapper.class_manager.new_instance()  # not __init__: an application's constructor may want other arguments
    table = outbox.__table__  # type: ignore[attr-defined]
    for key, value in values.items():
        column = table.columns.get(key)
        if column is not None and column.key != "destination":
            setattr(row, mapper.get_property_by_column(column).key, value)
    return row._decide_destination()  # type: ignore[no-any-return]


KIT_COLUMNS: frozenset[str] = frozenset(
    name for name, hint in Outbox.__annotations__.items() if str(hint).startswith("Mapped[")
) | {"created_at", "destination"}
"""The columns the mixin owns (the row's delivery state and its destination)."""


@sqlalchemy_event.listens_for(Outbox, "before_insert", propagate=True)
def _destination_before_insert(mapper: Any, connection: Any, row: Outbox) -> None:
    """The ORM path: the destination decided from the instance itself (its relationships and properties too)."""
    if row.destination is None:
        row.destination = row._decide_destination()
