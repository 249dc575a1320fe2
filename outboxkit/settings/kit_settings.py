"""``OutboxKitSettings``: the kit's settings, read from the environment (prefix ``OUTBOXKIT_``).

One field per setting with its default and its meaning; the per-outbox values are ``OutboxOverride``
(``outboxkit.settings.outboxes``).  ``OutboxKitSettings.from_environment()`` (what the kit uses by
default) turns a bad value into a ``ConfigurationError`` that names its variable.

One module, a few lines past 400: it is one class of fields, each a few lines of default and description (the
settings table in docs/operations.md is generated from them), and splitting the class would split the one place a
reader looks a setting up.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from outboxkit.errors import ConfigurationError, InvalidValueError
from outboxkit.settings.outboxes import OutboxOverride, outbox_key
from outboxkit.settings.variables import ENV_PREFIX, check_variable_names
from outboxkit.target_secrets import SECRET_NAME
from outboxkit.url_guard import AllowList

__all__ = ["DEFAULT_ADVISORY_LOCK_KEY", "OutboxKitSettings"]

# The session advisory lock key the leader holds.  It is the first 8 bytes of
# sha256(b"outboxkit:leader-election"), shifted right by one bit so it is a
# positive signed 64-bit integer: 2710940685875084841 (0x259f3230ccbcfe29).
# Derived from a fixed constant, so every outboxkit release agrees on it and
# it is unlikely to collide with another component's key.  Two kits (or two
# applications) sharing one database must each set their own key.
DEFAULT_ADVISORY_LOCK_KEY = 2710940685875084841
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Settings whose values an error message never repeats.
SECRET_SETTINGS = frozenset({"webhook_secrets", "secrets"})
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")  # what a secret is sent as: one HTTP header value


class OutboxKitSettings(BaseSettings):
    """The kit's settings.  Build one explicitly or let the kit read the environment."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore", case_sensitive=False)

    environment: Literal["development", "test", "staging", "production"] = Field(
        default="development",
        description=(
            "`development`, `test`, `staging` or `production`. In production a failed election starts no "
            "scheduler (fail closed) and a lock, LISTEN or engine connection a pooler would break is refused with"
            " a `ConfigurationError`; elsewhere the scheduler starts unelected and both log a warning (fail "
            "open). **Production must set it** (below)"
        ),
    )
    outboxes: dict[str, OutboxOverride] = Field(
        default_factory=dict,
        description=(
            'every per-outbox setting above as JSON: `{"credit_grants": {"max_attempts": 10}}`. It merges with '
            "their own variables; one setting of one outbox given both ways is refused at start, naming both "
            "variables"
        ),
    )

    # -- admin -----------------------------------------------------------------
    # The admin's POST bodies (JSON API and forms) are read only after the
    # auth dependency has admitted the request, and never beyond this size:
    # the biggest legitimate body (500 ids) is about 12 KB.
    admin_max_body_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="the largest POST body the admin reads, after auth; larger gets 413 (see docs/admin.md)",
    )
    # How long a CSRF token of the admin's pages is valid; a page always hands
    # out one with at least half of this left.
    admin_csrf_token_seconds: int = Field(
        default=2 * 3600, ge=60, le=7 * 86_400, description="lifetime of the admin pages' form tokens"
    )
    # The key that signs the admin's form tokens and notices (at least 16 characters).  Unset, the kit keeps
    # one generated key in its own table (outboxkit_secrets), shared by every process and host.
    admin_secret: SecretStr | None = Field(
        default=None,
        min_length=16,
        description=(
            "the key (16+ characters) that signs the admin's form tokens and notices; unset, the kit generates "
            "one and keeps it in `outboxkit_secrets`, so every worker and host agrees"
        ),
    )
    # The admin (and the CLI's row commands) run on their own small pool, built
    # from the kit engine's URL, so no admin request can take a connection the
    # application needs.  Each of their transactions, its wait for a connection
    # included, is cancelled after this many seconds (outboxkit.storage.operator_pool).
    # One connection by default: one admin scan at a time takes at most one of
    # the database's CPUs; other admin requests queue for it (the wait counts
    # against their time limit) and get 503 "busy" after the pool timeout.
    admin_statement_timeout_seconds: float = Field(
        default=5.0,
        ge=0.1,
        le=3600,
        allow_inf_nan=False,
        description=(
            "time limit of each transaction of the admin and of the CLI's row commands, its wait for a connection"
            ' included; past it the server cancels it and the admin answers 503 "narrow the filter" (0.1 to 3600;'
            ' see docs/admin.md, "The admin cannot stall the application")'
        ),
    )
    admin_pool_size: int = Field(
        default=1,
        ge=1,
        le=100,
        description=(
            "connections of the admin's own pool (built from the engine's URL, no overflow); it never uses the "
            "application's (1 to 100)"
        ),
    )
    admin_pool_timeout_seconds: float = Field(
        default=3.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description='how long an admin request waits for one of those connections before it gets 503 "busy"',
    )

    # -- election and scheduler ------------------------------------------------
    # The lock connection and the LISTEN connection hold session state (an
    # advisory lock, a LISTEN registration) for hours.  A transaction-mode
    # pooler (PgBouncer pool_mode=transaction) hands each transaction to any
    # server connection, so that state would leak to strangers or vanish.  Point
    # this at the database directly (or at a session-mode pool).  Unset: the
    # engine's URL is used.
    lock_database_url: str | None = Field(
        default=None,
        description=(
            "a direct or session-pool URL for the leader lock and `LISTEN` connections, never a transaction pool "
            '(refused; see "PgBouncer and other poolers"); unset, the application\'s engine opens both, so its '
            "`connect_args`, `creator` and `do_connect` hooks (SSL files, IAM tokens) apply, and detaches them "
            "from its pool"
        ),
    )
    advisory_lock_key: int = Field(
        default=DEFAULT_ADVISORY_LOCK_KEY, ge=_INT64_MIN, le=_INT64_MAX, description="the session advisory lock the leader holds"
    )
    leader_tick_seconds: float = Field(
        default=15.0, gt=0, le=3600, description="how often the leader checks it still holds the lock"
    )
    standby_probe_seconds: float = Field(default=60.0, gt=0, le=3600, description="how often a standby tries to take the lock")
    drain_interval_seconds: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="the leader's safety-net drain of every outbox; also the longest a drain loop sleeps",
    )
    # Drain work in this process: a background loop per outbox that claims on
    # NOTIFY and at each row's due time, without waiting for leadership (drains
    # are safe to run concurrently).  Off: this process only serves and, if it
    # leads, runs the schedule (the safety-net drain and the application's jobs).
    drain_enabled: bool = Field(
        default=True, description="this process runs a drain loop per outbox (NOTIFY, due times), leader or not"
    )
    # The drain loops LISTEN for inserts and resets and claim at once; without
    # it they still claim at due times and every drain_interval_seconds.
    listen_enabled: bool = Field(default=True, description="the drain loops LISTEN for inserts and resets and claim at once")
    drain_pool_size: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="connections of the drain's own pool (its claims, outcomes and LISTEN never take one of the "
        "application's); 0: two per outbox plus one, with as many again as overflow for drains beside the loops",
    )
    drain_pool_timeout_seconds: float = Field(
        default=30.0, gt=0, le=3600, allow_inf_nan=False, description="how long a drain waits for a connection of its pool"
    )
    # Whether the claim and the outcome commits wait for the WAL flush.  On
    # (the default): a PostgreSQL crash forgets nothing the kit committed, and
    # every attempt sent is counted, at the cost of a WAL flush per claim and
    # per outcome (docs/performance.md).  Off: a crash of the PostgreSQL
    # server within ~600 ms may forget them, so a row may be sent once more
    # than its attempts say (with the same Idempotency-Key; never lost).
    synchronous_commit: bool = Field(
        default=True,
        description=(
            "claims and outcomes wait for the WAL flush, so a PostgreSQL crash forgets nothing the kit committed "
            "and every attempt sent is counted; `false` skips the wait and may count one send too few after a "
            'server crash (see "Commit durability")'
        ),
    )
    # Server-side prepared statements for the kit's hot statements (the
    # outcome write, the attempt history) and psycopg's automatic preparing
    # on an engine the kit builds.  Off (the default): nothing is prepared,
    # which works through every pooler; a transaction-mode pooler before
    # PgBouncer 1.21 (or without max_prepared_statements) loses prepared
    # statements between transactions.  On: for direct connections, a
    # session-mode pool, or PgBouncer 1.21+ with max_prepared_statements > 0
    # (docs/performance.md has what it is worth).
    prepared_statements: bool = Field(
        default=False,
        description=(
            "`true`: the kit prepares its outcome write and attempt history on the server, and an engine it "
            "builds lets psycopg prepare; only for direct connections, session pools or PgBouncer 1.21+ with "
            '`max_prepared_statements` (see "PgBouncer and other poolers")'
        ),
    )
    # Run history kept per job in outboxkit_job_runs (older rows are trimmed).
    job_history_limit: int = Field(default=200, ge=10, le=100_000, description="run history rows kept per job")
    # Attempt history kept per outbox in outboxkit_attempts, in days (the
    # drainers trim older attempts); 0 records no attempt history.
    attempt_history_days: float = Field(
        default=7.0,
        ge=0,
        le=3650,
        allow_inf_nan=False,
        description=(
            "days of attempt history kept per outbox in `outboxkit_attempts` (the admin's row page and charts); "
            "`0` records none (see docs/admin.md)"
        ),
    )
    # How much of each request body the attempt history keeps (0: none, only its size and SHA-256).
    attempt_body_bytes: int = Field(
        default=0,
        ge=0,
        le=65_536,
        description=(
            "bytes of each attempt's request body kept in the attempt history and shown on the admin's row page; "
            "`0` (the default) keeps only the body's size and SHA-256 (bodies may hold personal data; see docs/admin.md)"
        ),
    )
    # Inbox records (outboxkit.inbox) kept, in days, then pruned by the elected leader's hourly
    # job; None (the default) runs no inbox retention.  Must exceed the senders' longest retry
    # schedule, or a late retry is handled twice (docs/inbox.md).
    inbox_retention_days: float | None = Field(
        default=None,
        ge=1 / 24,
        le=3650,
        allow_inf_nan=False,
        description=(
            "days the inbox keeps its records of handled messages (`outboxkit_inbox`) before the leader's hourly "
            "job prunes them; unset: none pruned. Must exceed the senders' longest retry schedule (see [the "
            "inbox](inbox.md))"
        ),
    )
    # Kill switch: no election and no scheduler in this process (e.g. a one-off script).
    scheduler_enabled: bool = Field(
        default=True, description="`false`: this process never campaigns (one-off scripts, API-only pods)"
    )
    # Schedules as rows (docs/schedules.md): every process that runs the kit
    # (kit.lifespan, outboxkit worker) syncs the schedules declared in code
    # into rows and runs a trigger loop that fires its share of the due rows,
    # no leader needed.  Off: this process neither syncs nor fires them.
    schedules_enabled: bool = Field(
        default=True,
        description=(
            "the lifespan and `outboxkit worker` sync the schedules declared in code into rows and fire this "
            "process's share of the due schedule rows, no leader needed; `false`: this process neither syncs nor "
            "fires them (see [schedules](schedules.md))"
        ),
    )
    # URLs that do not come from the application's code (a schedule's HTTP target) are sent only to public
    # addresses (outboxkit.url_guard); these networks (CIDR, or one address) and exact host names are let
    # through as well.  Comma-separated from the environment, e.g. 10.20.0.0/16,hooks.internal.
    url_allow_list: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "non-public networks (`10.20.0.0/16`, `127.0.0.1/32`) and exact host names (`hooks.internal`), "
            "comma-separated, that a schedule's HTTP target may send to; everything else must resolve to public "
            'addresses only (see [schedules](schedules.md), "Where an HTTP target may send")'
        ),
    )
    # How many characters of a non-2xx answer's body a schedule's request keeps in last_error (0: none; the
    # status alone).  The receiver is whatever a person typed, and last_error is shown in the admin and exports.
    schedule_error_body_chars: int = Field(
        default=0,
        ge=0,
        le=500,
        description=(
            "characters of an error answer's body a schedule's request keeps in `last_error` (0 to 500); `0` "
            "keeps the status alone"
        ),
    )
    # "Run now" calls one person (the admin's or the CLI's actor) may make per minute, over every schedule.
    schedule_run_now_per_minute: int = Field(
        default=6,
        ge=1,
        le=10_000,
        description=(
            "\"run now\" calls one person (the admin's or the CLI's actor) may make in a minute, over every "
            "schedule and every process; past it the admin answers 429 with `Retry-After` and the CLI exits with "
            "the wait (1 to 10000)"
        ),
    )
    # Credentials an HTTP target references by name: a header value 'secret:partner_token' is sent as the
    # value of OUTBOXKIT_SECRETS__PARTNER_TOKEN (outboxkit.target_secrets).  Never shown.
    secrets: dict[str, SecretStr] = Field(
        default_factory=dict,
        description=(
            "a credential a schedule's HTTP target sends as a header written `secret:<name>` (e.g. "
            "`OUTBOXKIT_SECRETS__PARTNER_TOKEN='Bearer ...'`, or all of them as JSON in `OUTBOXKIT_SECRETS`); "
            "names are 1 to 64 of `a-z`, `0-9`, `_`, values one header value; never shown (see "
            "[schedules](schedules.md#credentials))"
        ),
    )

    def __init__(self, **values: Any) -> None:
        check_variable_names(os.environ, type(self).model_fields)
        super().__init__(**values)

    @field_validator("outboxes", mode="before")
    @classmethod
    def _normalise_keys(cls, value: object) -> object:
        """Key by ``job_name`` with ``-`` as ``_``.

        Two spellings of one key (the JSON form's ``credit-grants`` and a
        variable's ``CREDIT_GRANTS``) merge setting by setting, the later
        source winning as the settings library orders them (explicit values
        last); the environment giving one setting twice is refused before
        this runs (``check_variable_names``).
        """
        if not isinstance(value, dict):
            return value
        normalised: dict[str, object] = {}
        for key, item in value.items():
            name = outbox_key(str(key))
            earlier = normalised.get(name)
            if isinstance(earlier, dict) and isinstance(item, dict):
                normalised[name] = {**earlier, **item}
            else:
                normalised[name] = item
        return normalised

    @field_validator("url_allow_list", mode="before")
    @classmethod
    def _split_allow_list(cls, value: object) -> object:
        if isinstance(value, str):  # "10.0.0.0/8,hooks.internal" from a shell
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, (list, tuple)):
            AllowList.parse(value)  # a bad entry is refused here, naming the variable
        return value

    @field_validator("secrets", mode="before")
    @classmethod
    def _secret_names(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        named = {str(name).lower(): secret for name, secret in value.items()}
        for name, secret in named.items():
            if not SECRET_NAME.fullmatch(name):
                raise InvalidValueError(f"secret name {name[:80]!r} must be 1-64 of a-z, 0-9 and _ (e.g. partner_token)")
            text = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
            if not isinstance(text, str) or not _HEADER_VALUE.fullmatch(text):
                raise InvalidValueError(f"secret {name!r} must be a header value: printable ASCII, no line breaks")
        return named

    @property
    def secret_values(self) -> dict[str, str]:
        """``secrets`` by name with their values, for the send that needs them (never shown)."""
        return {name: secret.get_secret_value() for name, secret in self.secrets.items()}

    @property
    def allow_list(self) -> AllowList:
        """``url_allow_list`` parsed (``outboxkit.url_guard``)."""
        return AllowList.parse(self.url_allow_list)

    @property
    def is_production(self) -> bool:
        return self.environment == "production"

    @classmethod
    def from_environment(cls) -> OutboxKitSettings:
        """Read the environment; a bad value or an unknown name raises ``ConfigurationError`` naming its variable."""
        try:
            return cls()
        except ValidationError as exc:
            first_problem: dict[str, str] = {}  # per variable; later complaints repeat the first
            for error in exc.errors():
                first_problem.setdefault(_variable_for(error["loc"]), _describe(error))
            problems = "; ".join(f"{name}: {problem}" for name, problem in first_problem.items())
            raise ConfigurationError(f"invalid outboxkit setting: {problems}") from None
        except SettingsError as exc:
            field = re.search(r'field "(\w+)"', str(exc))
            name = ENV_PREFIX + field.group(1).upper() if field else f"an {ENV_PREFIX}* variable"
            raise ConfigurationError(
                f"{name} could not be parsed ({exc}); a whole-table value such as OUTBOXKIT_OUTBOXES "
                'must be JSON, e.g. \'{"credit_grants": {"max_attempts": 10}}\''
            ) from None


def _describe(error: ErrorDetails) -> str:
    if SECRET_SETTINGS & {part for part in error["loc"] if isinstance(part, str)}:
        message = f"{error['msg']} (the value is not shown: it is a secret)"
    else:
        message = f"{error['msg']} (got {error['input']!r})"
    if error["type"] == "extra_forbidden":
        message += f"; per-outbox settings are {', '.join(OutboxOverride.model_fields)}"
    return message


def _variable_for(location: Sequence[object]) -> str:
    """The environment variable behind a settings field, e.g. ``OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__BACKOFF``.

    When that nested variable is not set the value came from the JSON form,
    so the JSON variable and the key inside it are named instead.
    """
    parts = [str(part) for part in location if isinstance(part, str)][:3]
    nested = ENV_PREFIX + "__".join(parts).upper()
    if len(parts) > 1 and not any(name.upper() == nested for name in os.environ):
        return f"{ENV_PREFIX}{parts[0].upper()} (at {'.'.join(parts[1:])})"
    return nested
