"""Settings read from the environment (prefix ``OUTBOXKIT_``).

Everything here has a default; an operator overrides it without a deploy::

    OUTBOXKIT_ENVIRONMENT=production
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__MAX_ATTEMPTS=10
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__BACKOFF=1,5,30
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__RETAIN_DONE_FOR=604800   # or "off"
    # or all at once, as JSON:
    OUTBOXKIT_OUTBOXES='{"credit_grants": {"backoff": [1, 5, 30], "max_attempts": 10}}'

Per-outbox keys are the outbox's ``job_name`` with ``-`` written as ``_``.
``OutboxKitSettings.from_environment()`` (what the kit uses by default) turns
a bad value into a ``ConfigurationError`` that names its variable.

The election and the scheduler (see docs/election.md)::

    OUTBOXKIT_LOCK_DATABASE_URL=postgresql://app@db-primary:5432/app   # direct, not via a transaction pooler
    OUTBOXKIT_ADVISORY_LOCK_KEY=2710940685875084841
    OUTBOXKIT_LEADER_TICK_SECONDS=15
    OUTBOXKIT_STANDBY_PROBE_SECONDS=60
    OUTBOXKIT_DRAIN_INTERVAL_SECONDS=60
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from outboxkit.errors import ConfigurationError

__all__ = ["DEFAULT_ADVISORY_LOCK_KEY", "OutboxKitSettings", "OutboxOverride"]

# The session advisory lock key the leader holds.  It is the first 8 bytes of
# sha256(b"outboxkit:leader-election"), shifted right by one bit so it is a
# positive signed 64-bit integer: 2710940685875084841 (0x259f3230ccbcfe29).
# Derived from a fixed constant, so every outboxkit release agrees on it and
# it is unlikely to collide with another component's key.  Two kits (or two
# applications) sharing one database must each set their own key.
DEFAULT_ADVISORY_LOCK_KEY = 2710940685875084841
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

ENV_PREFIX = "OUTBOXKIT_"
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


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
        if values.get("retain_done_for") == "off":
            values["retain_done_for"] = None
        return values


class OutboxKitSettings(BaseSettings):
    """The kit's settings.  Build one explicitly or let the kit read the environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore", case_sensitive=False
    )

    environment: Literal["development", "test", "staging", "production"] = "development"
    outboxes: dict[str, OutboxOverride] = Field(default_factory=dict)

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
    # The leader LISTENs for inserts and drains at once; the interval job stays the safety net.
    listen_enabled: bool = True
    # Run history kept per job in outboxkit_job_runs (older rows are trimmed).
    job_history_limit: int = Field(default=200, ge=10, le=100_000)
    # Kill switch: no election and no scheduler in this process (e.g. a one-off script).
    scheduler_enabled: bool = True

    @field_validator("outboxes", mode="before")
    @classmethod
    def _normalise_keys(cls, value: object) -> object:
        if isinstance(value, dict):
            return {str(key).lower().replace("-", "_"): item for key, item in value.items()}
        return value

    @property
    def is_production(self) -> bool:
        return self.environment == "production"

    @classmethod
    def from_environment(cls) -> OutboxKitSettings:
        """Read the environment; a bad value raises ``ConfigurationError`` naming its variable."""
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


def _describe(error: dict) -> str:
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
