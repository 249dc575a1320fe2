"""Settings read from the environment (prefix ``OUTBOXKIT_``).

Everything here has a default; an operator overrides it without a deploy::

    OUTBOXKIT_ENVIRONMENT=production
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__MAX_ATTEMPTS=10
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__BACKOFF=1,5,30
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__RETAIN_DONE_FOR=604800   # or "off"
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__WEBHOOK_SECRETS=whsec_new...,whsec_old...   # sign_webhooks outboxes
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__RATE_LIMIT=20       # requests/s per destination; JSON for more, or "off"
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__HUNG_SEND_SECONDS=2 # a send out longer is hung: no longer counted; or "off"
    # or all at once, as JSON:
    OUTBOXKIT_OUTBOXES='{"credit_grants": {"backoff": [1, 5, 30], "max_attempts": 10}}'

The forms merge (the JSON may set one setting of an outbox, a variable of its
own another); one setting given in both is refused, naming both variables.

Per-outbox keys are the outbox's ``job_name`` with ``-`` written as ``_``.
``OutboxKitSettings.from_environment()`` (what the kit uses by default) turns
a bad value into a ``ConfigurationError`` that names its variable.

The admin (see docs/admin.md)::

    OUTBOXKIT_ADMIN_MAX_BODY_BYTES=65536        # larger POST bodies get 413
    OUTBOXKIT_ADMIN_CSRF_TOKEN_SECONDS=7200     # lifetime of a page's form token
    OUTBOXKIT_ADMIN_SECRET=...                 # signs the admin's form tokens; unset: one generated key kept in the database
    OUTBOXKIT_ADMIN_STATEMENT_TIMEOUT_SECONDS=5 # time limit of each admin transaction (then "narrow the filter")
    OUTBOXKIT_ADMIN_POOL_SIZE=1                 # the admin's own connections (none taken from the application's pool)
    OUTBOXKIT_ADMIN_POOL_TIMEOUT_SECONDS=3      # how long a request waits for one of them (then 503)

The election and the scheduler (see docs/election.md)::

    OUTBOXKIT_LOCK_DATABASE_URL=postgresql://app@db-primary:5432/app   # direct, not via a transaction pooler
    OUTBOXKIT_ADVISORY_LOCK_KEY=2710940685875084841
    OUTBOXKIT_LEADER_TICK_SECONDS=15
    OUTBOXKIT_STANDBY_PROBE_SECONDS=60
    OUTBOXKIT_DRAIN_INTERVAL_SECONDS=60

Schedules as rows (see docs/schedules.md)::

    OUTBOXKIT_SCHEDULES_ENABLED=true    # this process syncs the schedules declared in code and fires due rows
    OUTBOXKIT_URL_ALLOW_LIST=10.20.0.0/16,hooks.internal  # non-public networks/hosts a schedule may send to
    OUTBOXKIT_SCHEDULE_ERROR_BODY_CHARS=0                 # characters of an error answer's body kept in last_error
    OUTBOXKIT_SCHEDULE_RUN_NOW_PER_MINUTE=6               # "run now" calls one person may make per minute
    OUTBOXKIT_SECRETS__PARTNER_TOKEN='Bearer ...'         # what a target's header 'secret:partner_token' sends

Drain work (see docs/operations.md, "Drains and workers")::

    OUTBOXKIT_DRAIN_ENABLED=true        # this process drains (NOTIFY, due times), leader or not
    OUTBOXKIT_LISTEN_ENABLED=true
    OUTBOXKIT_SYNCHRONOUS_COMMIT=true   # false: claims and outcomes do not wait for the WAL flush
    OUTBOXKIT_PREPARED_STATEMENTS=false # true: server-side prepared statements (direct, or PgBouncer 1.21+)

A variable that starts with ``OUTBOXKIT_`` but names no setting (a typo such
as ``OUTBOXKIT_LEADER_TICK``, or ``OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__MAX_ATEMPTS``)
is refused with the closest valid name, rather than silently ignored.  The
kit's own tools use a few ``OUTBOXKIT_`` variables that are not settings;
those are allowed (``NON_SETTING_VARIABLES`` and ``NON_SETTING_PREFIXES``):
``OUTBOXKIT_APP`` (the CLI's ``--app``), and ``OUTBOXKIT_TEST_*``,
``OUTBOXKIT_BENCH_*`` and ``OUTBOXKIT_FAULT_*`` (the test suite, the
benchmarks and the fault tests).

One module: one field per setting with its documented meaning, and the per-outbox overrides
(``OutboxOverride``) that the same environment parsing validates together.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from outboxkit.errors import ConfigurationError, InvalidValueError
from outboxkit.target_secrets import SECRET_NAME
from outboxkit.url_guard import AllowList

__all__ = [
    "DEFAULT_ADVISORY_LOCK_KEY",
    "NON_SETTING_PREFIXES",
    "NON_SETTING_VARIABLES",
    "OutboxKitSettings",
    "OutboxOverride",
    "RateLimitOverride",
]

# The session advisory lock key the leader holds.  It is the first 8 bytes of
# sha256(b"outboxkit:leader-election"), shifted right by one bit so it is a
# positive signed 64-bit integer: 2710940685875084841 (0x259f3230ccbcfe29).
# Derived from a fixed constant, so every outboxkit release agrees on it and
# it is unlikely to collide with another component's key.  Two kits (or two
# applications) sharing one database must each set their own key.
DEFAULT_ADVISORY_LOCK_KEY = 2710940685875084841
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

ENV_PREFIX = "OUTBOXKIT_"
# OUTBOXKIT_ variables that are not settings: outboxkit's CLI reads the first;
# its test suite, benchmarks and fault tests own the prefixes.
NON_SETTING_VARIABLES = frozenset({"OUTBOXKIT_APP"})
NON_SETTING_PREFIXES = ("OUTBOXKIT_TEST_", "OUTBOXKIT_BENCH_", "OUTBOXKIT_FAULT_")
# Settings whose values an error message never repeats.
SECRET_SETTINGS = frozenset({"webhook_secrets", "secrets"})
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")  # what a secret is sent as: one HTTP header value
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]  # requests per second


class RateLimitOverride(BaseModel):
    """A rate limit from the environment (``OUTBOXKIT_OUTBOXES__<KEY>__RATE_LIMIT``), as ``RateLimit``'s arguments.

    Checked here, so a bad value names its variable; the kit builds the
    ``outboxkit.rate_limits.RateLimit`` from it when it registers the outbox.
    """

    model_config = ConfigDict(extra="forbid")

    per_second: Rate | None = None
    destinations: dict[Annotated[str, Field(min_length=1)], Rate] = Field(default_factory=dict)
    burst_seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0

    @model_validator(mode="after")
    def _limits_something(self) -> RateLimitOverride:
        if self.per_second is None and not self.destinations:
            raise InvalidValueError("it limits nothing: give per_second (every destination), destinations (named ones), or both")
        return self


_RATE_LIMIT_FORMS = (
    'requests per second (e.g. 20), "off", or a JSON object such as '
    '{"per_second": 20, "destinations": {"https://partner.example:443": 2}, "burst_seconds": 1}'
)


def _is_off(value: object) -> bool:
    """``"off"`` as an environment variable may spell it: any case, spaces around it."""
    return isinstance(value, str) and value.strip().lower() == "off"


def _rate_limit(value: object) -> object:
    """``5`` or ``"5"`` (every destination, default burst), ``"off"``, or a JSON object of ``RateLimit``'s arguments."""
    if _is_off(value):
        return "off"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidValueError(f"expected {_RATE_LIMIT_FORMS}") from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = {"per_second": value}
    if isinstance(value, RateLimitOverride):
        return value
    if not isinstance(value, dict):
        raise InvalidValueError(f"expected {_RATE_LIMIT_FORMS}")
    try:
        return RateLimitOverride.model_validate(value)
    except ValidationError as exc:  # one message naming the field inside the value
        raise InvalidValueError("; ".join(_rate_limit_problem(error) for error in exc.errors())) from None


def _rate_limit_problem(error: ErrorDetails) -> str:
    message = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:
        return message
    return f"{'.'.join(str(part) for part in error['loc'])}: {message} (got {error['input']!r})"


class OutboxOverride(BaseModel):
    """Per-outbox values that replace the class's ``OutboxOptions`` when set."""

    model_config = ConfigDict(extra="forbid")

    backoff: tuple[Seconds, ...] | None = Field(default=None, min_length=1)
    max_attempts: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=1, le=10_000)
    concurrency: int | None = Field(default=None, ge=1, le=10_000)
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # Seconds, or "off" to keep delivered rows forever whatever the class says
    # (the range is checked by OutboxOptions, which names the variable).
    retain_done_for: Annotated[float, Field(allow_inf_nan=False)] | Literal["off"] | None = None
    # Requests per second per destination (outboxkit.rate_limits), replacing the class's rate_limit: a number
    # for every destination, a JSON object of RateLimit's arguments, or "off" to lift the class's limit.
    rate_limit: RateLimitOverride | Literal["off"] | None = None
    # Seconds after which a send is hung and stops counting against concurrency (outboxkit.drain.hung_sends), or "off".
    hung_send_seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)] | Literal["off"] | None = None
    # Standard Webhooks secrets (whsec_...), comma-separated; never shown (outboxkit.transports.signing).
    webhook_secrets: tuple[SecretStr, ...] | None = Field(default=None, min_length=1)

    @field_validator("webhook_secrets", mode="before")
    @classmethod
    def _split_secrets(cls, value: object) -> object:
        if isinstance(value, str):  # "whsec_a,whsec_b" from a shell
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("retain_done_for", "hung_send_seconds", mode="before")
    @classmethod
    def _parse_off(cls, value: object) -> object:
        return "off" if _is_off(value) else value

    @field_validator("rate_limit", mode="before")
    @classmethod
    def _parse_rate_limit(cls, value: object) -> object:
        return _rate_limit(value)

    @field_validator("backoff", mode="before")
    @classmethod
    def _split_backoff(cls, value: object) -> object:
        if isinstance(value, str):  # "5,15,60" from a shell
            return tuple(part.strip() for part in value.split(","))
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # "5" arrives decoded as 5
            return (value,)
        return value

    def values(self) -> dict[str, object]:
        """The fields that are set, as ``OutboxOptions`` keyword arguments."""
        values = {name: value for name, value in self.model_dump().items() if value is not None}
        for name in ("retain_done_for", "rate_limit", "hung_send_seconds"):
            if values.get(name) == "off":
                values[name] = None
        return values


class OutboxKitSettings(BaseSettings):
    """The kit's settings.  Build one explicitly or let the kit read the environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore", case_sensitive=False
    )

    environment: Literal["development", "test", "staging", "production"] = "development"
    outboxes: dict[str, OutboxOverride] = Field(default_factory=dict)

    # -- admin -----------------------------------------------------------------
    # The admin's POST bodies (JSON API and forms) are read only after the
    # auth dependency has admitted the request, and never beyond this size:
    # the biggest legitimate body (500 ids) is about 12 KB.
    admin_max_body_bytes: int = Field(default=64 * 1024, ge=1024, le=64 * 1024 * 1024)
    # How long a CSRF token of the admin's pages is valid; a page always hands
    # out one with at least half of this left.
    admin_csrf_token_seconds: int = Field(default=2 * 3600, ge=60, le=7 * 86_400)
    # The key that signs the admin's form tokens and notices (at least 16 characters).  Unset, the kit keeps
    # one generated key in its own table (outboxkit_secrets), shared by every process and host.
    admin_secret: SecretStr | None = Field(default=None, min_length=16)
    # The admin (and the CLI's row commands) run on their own small pool, built
    # from the kit engine's URL, so no admin request can take a connection the
    # application needs.  Each of their transactions, its wait for a connection
    # included, is cancelled after this many seconds (outboxkit.storage.operator_pool).
    # One connection by default: one admin scan at a time takes at most one of
    # the database's CPUs; other admin requests queue for it (the wait counts
    # against their time limit) and get 503 "busy" after the pool timeout.
    admin_statement_timeout_seconds: float = Field(default=5.0, ge=0.1, le=3600, allow_inf_nan=False)
    admin_pool_size: int = Field(default=1, ge=1, le=100)
    admin_pool_timeout_seconds: float = Field(default=3.0, gt=0, le=3600, allow_inf_nan=False)

    # -- election and scheduler ------------------------------------------------
    # The lock connection and the LISTEN connection hold session state (an
    # advisory lock, a LISTEN registration) for hours.  A transaction-mode
    # pooler (PgBouncer pool_mode=transaction) hands each transaction to any
    # server connection, so that state would leak to strangers or vanish.  Point
    # this at the database directly (or at a session-mode pool).  Unset: the
    # engine's URL is used.
    lock_database_url: str | None = None
    advisory_lock_key: int = Field(default=DEFAULT_ADVISORY_LOCK_KEY, ge=_INT64_MIN, le=_INT64_MAX)
    leader_tick_seconds: float = Field(default=15.0, gt=0, le=3600)
    standby_probe_seconds: float = Field(default=60.0, gt=0, le=3600)
    drain_interval_seconds: float = Field(default=60.0, gt=0, le=86_400)
    # Drain work in this process: a background loop per outbox that claims on
    # NOTIFY and at each row's due time, without waiting for leadership (drains
    # are safe to run concurrently).  Off: this process only serves and, if it
    # leads, runs the schedule (the safety-net drain and the application's jobs).
    drain_enabled: bool = True
    # The drain loops LISTEN for inserts and resets and claim at once; without
    # it they still claim at due times and every drain_interval_seconds.
    listen_enabled: bool = True
    # The drain's own pool (outboxkit.storage.drain_pool), built with the engine's connection factory: its
    # claims, outcomes and LISTEN never take one of the application's connections.  0: two per outbox plus one,
    # with as many again as overflow for drains beside the loops.  A drain waits this long for a connection.
    drain_pool_size: int = Field(default=0, ge=0, le=1000)
    drain_pool_timeout_seconds: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    # Whether the claim and the outcome commits wait for the WAL flush.  On
    # (the default): a PostgreSQL crash forgets nothing the kit committed, and
    # every attempt sent is counted, at the cost of a WAL flush per claim and
    # per outcome (docs/performance.md).  Off: a crash of the PostgreSQL
    # server within ~600 ms may forget them, so a row may be sent once more
    # than its attempts say (with the same Idempotency-Key; never lost).
    synchronous_commit: bool = True
    # Server-side prepared statements for the kit's hot statements (the
    # outcome write, the attempt history) and psycopg's automatic preparing
    # on an engine the kit builds.  Off (the default): nothing is prepared,
    # which works through every pooler; a transaction-mode pooler before
    # PgBouncer 1.21 (or without max_prepared_statements) loses prepared
    # statements between transactions.  On: for direct connections, a
    # session-mode pool, or PgBouncer 1.21+ with max_prepared_statements > 0
    # (docs/performance.md has what it is worth).
    prepared_statements: bool = False
    # Run history kept per job in outboxkit_job_runs (older rows are trimmed).
    job_history_limit: int = Field(default=200, ge=10, le=100_000)
    # Attempt history kept per outbox in outboxkit_attempts, in days (the
    # drainers trim older attempts); 0 records no attempt history.
    attempt_history_days: float = Field(default=7.0, ge=0, le=3650, allow_inf_nan=False)
    # Inbox records (outboxkit.inbox) kept, in days, then pruned by the elected leader's hourly
    # job; None (the default) runs no inbox retention.  Must exceed the senders' longest retry
    # schedule, or a late retry is handled twice (docs/inbox.md).
    inbox_retention_days: float | None = Field(default=None, ge=1 / 24, le=3650, allow_inf_nan=False)
    # Kill switch: no election and no scheduler in this process (e.g. a one-off script).
    scheduler_enabled: bool = True
    # Schedules as rows (docs/schedules.md): every process that runs the kit
    # (kit.lifespan, outboxkit worker) syncs the schedules declared in code
    # into rows and runs a trigger loop that fires its share of the due rows,
    # no leader needed.  Off: this process neither syncs nor fires them.
    schedules_enabled: bool = True
    # URLs that do not come from the application's code (a schedule's HTTP target) are sent only to public
    # addresses (outboxkit.url_guard); these networks (CIDR, or one address) and exact host names are let
    # through as well.  Comma-separated from the environment, e.g. 10.20.0.0/16,hooks.internal.
    url_allow_list: Annotated[tuple[str, ...], NoDecode] = ()
    # How many characters of a non-2xx answer's body a schedule's request keeps in last_error (0: none; the
    # status alone).  The receiver is whatever a person typed, and last_error is shown in the admin and exports.
    schedule_error_body_chars: int = Field(default=0, ge=0, le=500)
    # "Run now" calls one person (the admin's or the CLI's actor) may make per minute, over every schedule.
    schedule_run_now_per_minute: int = Field(default=6, ge=1, le=10_000)
    # Credentials an HTTP target references by name: a header value 'secret:partner_token' is sent as the
    # value of OUTBOXKIT_SECRETS__PARTNER_TOKEN (outboxkit.target_secrets).  Never shown.
    secrets: dict[str, SecretStr] = Field(default_factory=dict)

    def __init__(self, **values: Any) -> None:
        check_variable_names(os.environ)
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
            name = _outbox_key(str(key))
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


def check_variable_names(environment: Mapping[str, str]) -> None:
    """Refuse ``OUTBOXKIT_*`` variables that name no setting (suggesting the closest valid name),
    and a per-outbox setting given both as its own variable and inside a JSON value."""
    problems = [problem for name in sorted(environment) if (problem := _unknown_variable(name.upper()))]
    problems += _set_twice(environment)
    if problems:
        raise ConfigurationError(f"invalid outboxkit setting: {'; '.join(problems)}")


def _set_twice(environment: Mapping[str, str]) -> list[str]:
    """Per-outbox settings the environment gives more than once.

    A setting can come from ``OUTBOXKIT_OUTBOXES__<KEY>__<SETTING>``, from
    ``OUTBOXKIT_OUTBOXES__<KEY>`` as JSON and from ``OUTBOXKIT_OUTBOXES`` as
    JSON (under any spelling of the key: ``credit-grants``, ``credit_grants``).
    The forms merge, so each may set different things; one setting in two
    places would leave its value to precedence nobody reads, so it is
    refused.  A JSON value that does not parse is left to the settings' own
    error.
    """
    places: dict[tuple[str, str], list[str]] = {}  # (outbox key, setting) -> where it is set
    for name in sorted(environment):
        parts = name.upper().split("__")
        if parts[0] != f"{ENV_PREFIX}OUTBOXES" or len(parts) > 3:
            continue
        if len(parts) == 3:
            places.setdefault((_outbox_key(parts[1]), parts[2].lower()), []).append(name)
            continue
        try:
            document = json.loads(environment[name])
        except ValueError:
            continue
        tables = document if len(parts) == 1 else {parts[1]: document}
        if not isinstance(tables, dict):
            continue
        for key, table in tables.items():
            if isinstance(table, dict):
                for setting in table:
                    where = name if len(parts) == 2 else f"{name} (as {str(key)!r})"
                    places.setdefault((_outbox_key(str(key)), str(setting).lower()), []).append(where)
    return [
        f"{' and '.join(where)} {'both' if len(where) == 2 else 'all'} set {key}.{setting}; set it in one place"
        for (key, setting), where in sorted(places.items())
        if len(where) > 1
    ]


def _outbox_key(key: str) -> str:
    return key.lower().replace("-", "_")


def _unknown_variable(name: str) -> str | None:
    """What is wrong with one variable's name, or None when it names a setting (or is not outboxkit's)."""
    if not name.startswith(ENV_PREFIX) or name in NON_SETTING_VARIABLES or name.startswith(NON_SETTING_PREFIXES):
        return None
    parts = name[len(ENV_PREFIX) :].split("__")
    settings = [field.upper() for field in OutboxKitSettings.model_fields]
    if parts[0] not in settings:
        suggestion = _closest(parts[0], settings, ENV_PREFIX)
        return f"{name}: no such setting{suggestion}; the settings are {ENV_PREFIX}<one of {', '.join(settings)}>"
    if parts[0] == "SECRETS":  # OUTBOXKIT_SECRETS (JSON) or OUTBOXKIT_SECRETS__<NAME>
        example = f"{ENV_PREFIX}SECRETS__PARTNER_TOKEN"
        return f"{name}: secrets look like {ENV_PREFIX}SECRETS__<NAME>, e.g. {example}" if len(parts) > 2 else None
    if parts[0] != "OUTBOXES":
        return f"{name}: {ENV_PREFIX}{parts[0]} takes no nested keys" if len(parts) > 1 else None
    if len(parts) <= 2:  # OUTBOXKIT_OUTBOXES or OUTBOXKIT_OUTBOXES__<KEY>, as JSON
        return None
    fields = [field.upper() for field in OutboxOverride.model_fields]
    outbox = f"{ENV_PREFIX}OUTBOXES__{parts[1]}__"
    if len(parts) > 3 or not parts[1]:
        return f"{name}: per-outbox variables look like {ENV_PREFIX}OUTBOXES__<KEY>__<SETTING>, e.g. {outbox}MAX_ATTEMPTS"
    if parts[2] not in fields:
        return (
            f"{name}: no such per-outbox setting{_closest(parts[2], fields, outbox)}; "
            f"per-outbox settings are {', '.join(field.lower() for field in fields)}"
        )
    return None


def _closest(word: str, candidates: Sequence[str], prefix: str) -> str:
    match = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f" (did you mean {prefix}{match[0]}?)" if match else ""
