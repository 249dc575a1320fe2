"""Per-outbox settings: the values that replace a class's ``OutboxOptions`` from the environment.

``OUTBOXKIT_OUTBOXES__<KEY>__<SETTING>`` (or JSON in ``OUTBOXKIT_OUTBOXES``) is read into one
``OutboxOverride`` per outbox key; ``values()`` gives the fields that are set as ``OutboxOptions``
keyword arguments.  A value that only the kit can finish checking (a lease against the slowest batch,
a cap against ``concurrency``) is checked when the kit registers the outbox, naming the variable.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from outboxkit.errors import InvalidValueError

__all__ = ["OutboxOverride", "RateLimitOverride", "is_off", "outbox_key"]

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


def is_off(value: object) -> bool:
    """``"off"`` as an environment variable may spell it: any case, spaces around it."""
    return isinstance(value, str) and value.strip().lower() == "off"


def _rate_limit(value: object) -> object:
    """``5`` or ``"5"`` (every destination, default burst), ``"off"``, or a JSON object of ``RateLimit``'s arguments."""
    if is_off(value):
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
        return "off" if is_off(value) else value

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


def outbox_key(key: str) -> str:
    """An outbox's settings key: its ``job_name`` (or a variable's spelling of it) lowercased, ``-`` as ``_``."""
    return key.lower().replace("-", "_")
