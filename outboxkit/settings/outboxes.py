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

__all__ = ["BreakerOverride", "OutboxOverride", "RateLimitOverride", "is_off", "outbox_key"]

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
    value = _parsed(value, _RATE_LIMIT_FORMS)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = {"per_second": value}
    return _validated(value, RateLimitOverride, _RATE_LIMIT_FORMS)


def _parsed(value: object, forms: str) -> object:
    """A string from the environment read as JSON (a bare number is JSON too)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise InvalidValueError(f"expected {forms}") from None


def _validated(value: object, model: type[BaseModel], forms: str) -> object:
    if isinstance(value, model):
        return value
    if not isinstance(value, dict):
        raise InvalidValueError(f"expected {forms}")
    try:
        return model.model_validate(value)
    except ValidationError as exc:  # one message naming the field inside the value
        raise InvalidValueError("; ".join(_field_problem(error) for error in exc.errors())) from None


def _field_problem(error: ErrorDetails) -> str:
    message = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:
        return message
    return f"{'.'.join(str(part) for part in error['loc'])}: {message} (got {error['input']!r})"


class BreakerOverride(BaseModel):
    """A breaker from the environment (``OUTBOXKIT_OUTBOXES__<KEY>__BREAKER``): ``BreakerOptions``' arguments to change.

    The fields given replace those of the class's breaker (or of ``BreakerOptions()`` when the class turned
    it off); their ranges are checked by ``BreakerOptions``, which the kit builds when it registers the outbox.
    """

    model_config = ConfigDict(extra="forbid")

    failures: int | None = None
    failure_span: float | None = None
    cool_down: float | None = None
    max_cool_down: float | None = None
    window: float | None = None
    max_slow_down: float | None = None
    probes: int | None = None


_BREAKER_FORMS = '"off", or a JSON object of BreakerOptions\' arguments such as {"failures": 10, "cool_down": 60}'


def _breaker(value: object) -> object:
    return "off" if is_off(value) else _validated(_parsed(value, _BREAKER_FORMS), BreakerOverride, _BREAKER_FORMS)


def _is_auto(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


class OutboxOverride(BaseModel):
    """Per-outbox values that replace the class's ``OutboxOptions`` when set.

    Each field is one variable, ``OUTBOXKIT_OUTBOXES__<KEY>__<FIELD>``; its description is the
    reference table's "meaning" (docs/operations.md, "Settings", held to this class by a test).
    """

    model_config = ConfigDict(extra="forbid")

    backoff: tuple[Seconds, ...] | None = Field(
        default=None, min_length=1, description="backoff table in seconds, comma separated; the last entry repeats"
    )
    max_attempts: int | None = Field(default=None, ge=1, description="attempts before a row is parked as `stuck`")
    batch_size: int | None = Field(default=None, ge=1, le=10_000, description="rows per claim (1 to 10000)")
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="deliveries in flight at once per process, not counting hung sends, which run on at most as many "
        "threads more (1 to 10000)",
    )
    timeout: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="total deadline of one attempt, in seconds: lookup, connect, request and the whole answer "
        "(the lease is sized on it)",
    )
    lease: Annotated[float, Field(gt=0, allow_inf_nan=False)] | Literal["auto"] | None = Field(
        default=None,
        description="seconds a claim holds its rows; a crashed worker's rows come back when it ends. At least the "
        "slowest batch (`ceil(batch_size / concurrency) * timeout + lease_margin`), else refused at start; `auto`: "
        "that minimum",
    )
    lease_margin: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="seconds the lease outlasts the slowest batch: shorter brings a crashed worker's rows back "
        "sooner, longer leaves room for a slow database or a paused process",
    )
    # Seconds, or "off" to keep delivered rows forever whatever the class says
    # (the range is checked by OutboxOptions, which names the variable).
    retain_done_for: Annotated[float, Field(allow_inf_nan=False)] | Literal["off"] | None = Field(
        default=None,
        description="seconds a delivered row is kept before the retention job deletes it (at least 60), or "
        "`off` to keep them (see [retention](#retention-of-delivered-rows))",
    )
    partitions_ahead: int | None = Field(
        default=None,
        ge=2,
        le=366,
        description="on a partitioned outbox, how many intervals of partitions the elected job keeps made ahead "
        "(2 to 366; see [partitioning](partitioning.md))",
    )
    breaker: BreakerOverride | Literal["off"] | None = Field(
        default=None,
        description="each destination's circuit breaker: a JSON object of `BreakerOptions`' arguments to change "
        '(`{"failures": 10, "cool_down": 60}`; the others keep the class\'s values), or `off`: every row is sent '
        "and retried on its own backoff (see [destinations](destinations.md#the-circuit-breaker))",
    )
    destination_concurrency: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        default=None,
        description="rows claimed at once for one suspect destination (no success yet, a failure run, a slow send), "
        "across every process, while others have rows due; at most `concurrency`; `auto`: a quarter of "
        "`concurrency`",
    )
    # Seconds after which a send is hung and stops counting against concurrency (outboxkit.drain.hung_sends), or "off".
    hung_send_seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)] | Literal["off"] | None = Field(
        default=None,
        description="seconds after which a send is hung (or four times its destination's slowest recent answer, if "
        "longer): it keeps its thread and its destination's place but stops counting against `concurrency`; `off` "
        "counts every send until it ends (see [destinations](destinations.md#hung-sends-no-longer-count-against-"
        "concurrency))",
    )
    hung_send_limit: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        default=None,
        description="how many sends of one process may be hung at once, each on a thread beyond `concurrency` "
        "(a send overdue beyond that keeps counting); as many as the destinations that may be dead at once; "
        "`auto`: four times `concurrency`",
    )
    # Requests per second per destination (outboxkit.rate_limits), replacing the class's rate_limit: a number
    # for every destination, a JSON object of RateLimit's arguments, or "off" to lift the class's limit.
    rate_limit: RateLimitOverride | Literal["off"] | None = Field(
        default=None,
        description="requests per second each destination gets, across every process: a number (`20`: every "
        'destination, a burst of one second), a JSON object of `RateLimit`\'s arguments (`{"per_second": 50, '
        '"destinations": {"https://slow.partner.example:443": 2}, "burst_seconds": 0.25}`), or `off` '
        "(see [destinations](destinations.md#rate-limits))",
    )
    sign_webhooks: bool | None = Field(
        default=None,
        description="sign every request as Standard Webhooks defines it; `true` needs `WEBHOOK_SECRETS` "
        "(see [destinations](destinations.md#signed-requests-standard-webhooks))",
    )
    # Standard Webhooks secrets (whsec_...), comma-separated; never shown (outboxkit.transports.signing).
    webhook_secrets: tuple[SecretStr, ...] | None = Field(
        default=None,
        min_length=1,
        description="Standard Webhooks secrets (`whsec_...`, comma separated while rotating) of an outbox that "
        "signs; required for it, refused for any other; never shown",
    )

    @field_validator("breaker", mode="before")
    @classmethod
    def _parse_breaker(cls, value: object) -> object:
        return _breaker(value)

    @field_validator("lease", "destination_concurrency", mode="before")
    @classmethod
    def _parse_auto(cls, value: object) -> object:
        return "auto" if _is_auto(value) else value

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
        for name in ("retain_done_for", "rate_limit", "hung_send_seconds", "breaker"):
            if values.get(name) == "off":
                values[name] = None
        for name in ("lease", "destination_concurrency", "hung_send_limit"):
            if values.get(name) == "auto":
                values[name] = None
        return values


def outbox_key(key: str) -> str:
    """An outbox's settings key: its ``job_name`` (or a variable's spelling of it) lowercased, ``-`` as ``_``."""
    return key.lower().replace("-", "_")
