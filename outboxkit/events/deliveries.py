"""The kit's deliveries outbox: one row per event and subscription.

``EventDelivery`` is an ordinary outbox (``outboxkit.model.Outbox``), drained
like any other: retries on its backoff table, ``stuck`` where retrying
cannot help, reset, replay, export, the admin and the metrics apply
unchanged.  Register it with the kit (``OutboxKit(engine, outboxes=[...,
EventDelivery])``); its table belongs to the kit's migration branch.

Its rows are written by ``publish`` only, each holding the request as data:
the subscription's URL and custom headers at publish time, and the body, the
Standard Webhooks envelope ``{"type", "timestamp", "data"}``.  Because the URL
was typed at run time, the class declares ``__runtime_requests__``: every
send is checked again by the URL guard and pinned to the checked address
(``outboxkit.transports.guarded``), and the URL and headers are shown
redacted.

Each row is signed with its own subscription's secrets at send time by
``SubscriptionSigningTransport`` (``outboxkit.events.signing``; ``KitEvents``
installs it).  ``build_delivery`` puts the subscription's id in the
``webhook-signature`` header, which the signer replaces with the signature:
a request that were sent without the signer would carry no valid signature,
so a receiver refuses it rather than trusts it.

``ordering_key`` is ``<subscription id>:<key>`` when the event was published
with a ``key``: each subscription receives one key's events one at a time,
in order, and a receiver that fails holds back only its own.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import DDL, BigInteger, Index, String, Table, Text, event, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column

from outboxkit.model import Outbox, OutboxOptions, outbox_table_args
from outboxkit.storage.notify import install_trigger_sql
from outboxkit.storage.tables import kit_metadata
from outboxkit.transports.base import Delivery
from outboxkit.transports.signing import SIGNATURE_HEADER

__all__ = ["DELIVERIES_TABLE", "SIGNATURE_PLACEHOLDER", "EventDelivery", "deliveries_table"]

DELIVERIES_TABLE = "outboxkit_event_deliveries"
# What build_delivery writes in webhook-signature, for the signer to replace: "subscription:<id>".
SIGNATURE_PLACEHOLDER = "subscription:"


class _KitBase(DeclarativeBase):
    metadata = kit_metadata


class EventDelivery(Outbox, _KitBase):
    """One event sent to one subscription's endpoint, signed with that subscription's secrets."""

    __tablename__ = DELIVERIES_TABLE
    __outbox__ = OutboxOptions(job_name="event-deliveries", ordering_key="ordering_key")
    __runtime_requests__ = ("url", "headers")

    event_id: Mapped[int] = mapped_column(BigInteger)
    subscription_id: Mapped[int] = mapped_column(BigInteger)
    event_type: Mapped[str] = mapped_column(String(200))
    tenant: Mapped[str | None] = mapped_column(String(200))
    ordering_key: Mapped[str | None] = mapped_column(String(300))
    url: Mapped[str] = mapped_column(Text)
    headers: Mapped[dict[str, str]] = mapped_column(JSONB, default=dict)
    body: Mapped[Any] = mapped_column(JSONB)

    @declared_attr.directive
    @classmethod
    def __table_args__(cls) -> tuple[Any, ...]:
        # The rows of one subscription not delivered yet: what a disable or a delete holds back.
        waiting = Index(
            f"ix_{DELIVERIES_TABLE}_subscription", "subscription_id", postgresql_where=text("status <> 'done'")
        )
        return (*outbox_table_args(cls), waiting)

    def build_delivery(self) -> Delivery:
        headers = {**self.headers, SIGNATURE_HEADER: f"{SIGNATURE_PLACEHOLDER}{self.subscription_id}"}
        return Delivery(url=self.url, method="POST", json=self.body, headers=headers)


# create_all installs the NOTIFY trigger that wakes the drain on insert, as migration outboxkit_0013 does.
for _statement in install_trigger_sql(EventDelivery):
    event.listen(EventDelivery.__table__, "after_create", DDL(_statement))  # type: ignore[no-untyped-call]


def deliveries_table() -> Table:
    """The deliveries outbox's ``Table``, for Core statements."""
    table = EventDelivery.__table__
    assert isinstance(table, Table)
    return table
