"""The subscription API's and pages' data: what is sent to create, edit, disable, rotate or replay, and what is read.

A request is JSON with strict types; what JSON Schema cannot say (a filter's
form, a secret's form, a URL the guard refuses, a header that frames the
request) is checked by ``outboxkit.events`` when the definition is built or
saved, and the ``InvalidSubscriptionError`` it raises names the field
(``url``, ``event_types``, ``secrets``, ``headers``...).  The API answers it
422 with that field as the error's ``loc``; the pages show it on the form.
Secrets are never read back: a subscription shows how many it has, and a
rotation returns the new one once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool, StrictStr

from outboxkit.destinations.limits import MAX_CAP, MAX_PER_SECOND
from outboxkit.events.definitions import MAX_FILTERS, MAX_NAME
from outboxkit.events.store import Subscription

__all__ = [
    "DeliveryModel",
    "TenantSubscriptionCreate",
    "TenantSubscriptionFields",
    "ReplayRequest",
    "ReplayResultModel",
    "RotateRequest",
    "RotateResult",
    "SubscriptionActionResult",
    "SubscriptionAuditEntry",
    "SubscriptionCreate",
    "SubscriptionDetail",
    "SubscriptionDisable",
    "SubscriptionFields",
    "SubscriptionModel",
    "TestEventResult",
]

Filters = Annotated[list[Annotated[StrictStr, Field(max_length=MAX_NAME)]], Field(min_length=1, max_length=MAX_FILTERS)]
Headers = Annotated[dict[Annotated[StrictStr, Field(max_length=200)], Annotated[StrictStr, Field(max_length=4000)]],
                    Field(max_length=50)]
Secret = Annotated[StrictStr, Field(max_length=500, description="A Standard Webhooks secret, whsec_<base64>.")]
# Typed here, ranged by the subscription's rule (the destination limits' own), whose message the 422 carries.
RateLimit = Annotated[float | None, Field(strict=True, description=(
    f"Requests per second to this endpoint, across every process: more than 0, at most {MAX_PER_SECOND:,.0f}; "
    "null or left out: the deliveries outbox's own."))]
MaxInFlight = Annotated[int | None, Field(strict=True, description=(
    f"Most sends to this endpoint in flight at once, across every process: 1 to {MAX_CAP:,}; "
    "null or left out: the deliveries outbox's own."))]


class _Model(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# A subscription as shown (URL and headers redacted, secrets counted) is the store's own record.
SubscriptionModel = Subscription


class SubscriptionAuditEntry(_Model):
    at: datetime
    actor: str
    action: Literal["create", "edit", "enable", "disable", "delete", "rotate", "replay", "test"]


class SubscriptionDetail(_Model):
    """One subscription, its recent changes (newest first) and its deliveries by status."""

    subscription: SubscriptionModel
    changes: list[SubscriptionAuditEntry]
    deliveries: dict[str, int]


class SubscriptionFields(_Request):
    """What an edit replaces, its limits included (the secrets stay as they are: rotate them)."""

    url: Annotated[StrictStr, Field(min_length=1, max_length=2000)]
    event_types: Filters
    tenant: Annotated[StrictStr | None, Field(max_length=MAX_NAME)] = None
    headers: Headers = Field(default_factory=dict)
    description: Annotated[StrictStr, Field(max_length=2000)] = ""
    rate_limit: RateLimit = None
    max_in_flight: MaxInFlight = None


class SubscriptionCreate(SubscriptionFields):
    """A new subscription; without ``secrets`` the kit generates one and returns it once."""

    secrets: Annotated[list[Secret], Field(max_length=10)] | None = None


class TenantSubscriptionFields(_Request):
    """What a tenant edits of its own subscription, its limits included: never the tenant, which its
    authentication decides."""

    url: Annotated[StrictStr, Field(min_length=1, max_length=2000)]
    event_types: Filters
    headers: Headers = Field(default_factory=dict)
    description: Annotated[StrictStr, Field(max_length=2000)] = ""
    rate_limit: RateLimit = None
    max_in_flight: MaxInFlight = None


class TenantSubscriptionCreate(TenantSubscriptionFields):
    """A tenant's new subscription; without ``secrets`` the kit generates one and returns it once."""

    secrets: Annotated[list[Secret], Field(max_length=10)] | None = None


class DeliveryModel(_Model):
    """One delivery of an event to a subscription, as its tenant sees it."""

    id: int
    event_id: int
    event_type: str
    status: str
    attempts: int
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None


class SubscriptionDisable(_Request):
    reason: Annotated[StrictStr, Field(min_length=1, max_length=500, description="Why (shown to operators).")]


class RotateRequest(_Request):
    secret: Secret | None = Field(default=None, description="The new secret; without it the kit generates one.")
    keep_previous: StrictBool = Field(default=True, description="The secret signing until now keeps signing beside it.")


class ReplayRequest(_Request):
    since: AwareDatetime
    until: AwareDatetime | None = Field(default=None, description="Exclusive; now when absent.")
    event_types: Filters | None = Field(
        default=None, description="Only these types (names or prefix.*), within the subscription's own."
    )
    dry_run: StrictBool = Field(default=False, description="Count the events only; nothing is enqueued or audited.")


class SubscriptionActionResult(_Model):
    subscription: SubscriptionModel | None
    secret: str | None = Field(default=None, description="A secret the kit generated, shown this once.")


class RotateResult(_Model):
    subscription: SubscriptionModel
    secret: str = Field(description="The new secret, shown this once: hand it to the receiver.")


class ReplayResultModel(_Model):
    subscription_id: int
    events: int = Field(description="Events the filter matches.")
    enqueued: int = Field(description="Deliveries enqueued (0 on a dry run).")
    dry_run: bool


class TestEventResult(_Model):
    subscription_id: int
    event_id: int
