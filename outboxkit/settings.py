"""Settings read from the environment (prefix ``OUTBOXKIT_``).

Everything here has a default; an operator overrides it without a deploy::

    OUTBOXKIT_ENVIRONMENT=production
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__MAX_ATTEMPTS=10
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__BACKOFF=1,5,30
    # or all at once, as JSON:
    OUTBOXKIT_OUTBOXES='{"credit_grants": {"backoff": [1, 5, 30], "max_attempts": 10}}'

Per-outbox keys are the outbox's ``job_name`` with ``-`` written as ``_``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["OutboxKitSettings", "OutboxOverride"]


class OutboxOverride(BaseModel):
    """Per-outbox values that replace the class's ``OutboxOptions`` when set."""

    model_config = ConfigDict(extra="forbid")

    backoff: tuple[float, ...] | None = None
    max_attempts: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=1, le=10_000)
    concurrency: int | None = Field(default=None, ge=1, le=10_000)
    timeout: float | None = Field(default=None, gt=0)

    @field_validator("backoff", mode="before")
    @classmethod
    def _split_backoff(cls, value: object) -> object:
        if isinstance(value, str):  # "5,15,60" from a shell
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    def values(self) -> dict[str, object]:
        return {name: value for name, value in self.model_dump().items() if value is not None}


class OutboxKitSettings(BaseSettings):
    """The kit's settings.  Build one explicitly or let the kit read the environment."""

    model_config = SettingsConfigDict(
        env_prefix="OUTBOXKIT_", env_nested_delimiter="__", extra="ignore", case_sensitive=False
    )

    environment: Literal["development", "test", "staging", "production"] = "development"
    outboxes: dict[str, OutboxOverride] = Field(default_factory=dict)

    @field_validator("outboxes", mode="before")
    @classmethod
    def _normalise_keys(cls, value: object) -> object:
        if isinstance(value, dict):
            return {str(key).lower().replace("-", "_"): item for key, item in value.items()}
        return value

    @property
    def is_production(self) -> bool:
        return self.environment == "production"
