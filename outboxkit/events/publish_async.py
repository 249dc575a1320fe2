"""Publishing an event on an ``AsyncSession``, in the caller's transaction, with no thread hop.

::

    async with AsyncSession(async_engine) as session, session.begin():
        invoice.paid = True
        await publish_async(session, "invoice.paid", {"invoice": invoice.id}, tenant=invoice.customer)

The same checks and the same one statement as ``publish``
(``outboxkit.events.publish``), awaited on the session's own connection
(``postgresql+psycopg_async://``): the event and its deliveries commit or
roll back with the caller's change.  ``publish_async_with`` takes an
``AsyncConnection``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Unpack

from outboxkit.events.publish import CATALOG, PUBLISH, PublishCall, Published, PublishOptions

if TYPE_CHECKING:  # sqlalchemy.ext.asyncio needs greenlet, which a sync application may not have
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

__all__ = ["publish_async", "publish_async_with"]


async def publish_async(session: AsyncSession, event_type: str, payload: Any, **options: Unpack[PublishOptions]) -> Published:
    """``publish`` on an ``AsyncSession``, in its transaction; commit it with your change."""
    return await publish_async_with(await session.connection(), event_type, payload, **options)


async def publish_async_with(
    connection: AsyncConnection, event_type: str, payload: Any, **options: Unpack[PublishOptions]
) -> Published:
    """``publish_async`` on an ``AsyncConnection``, in the transaction it is in."""
    call = PublishCall.of(event_type, payload, options)
    call.check_catalog((await connection.execute(CATALOG, {"event_type": event_type})).first())
    return call.published((await connection.execute(PUBLISH, call.parameters)).one())
