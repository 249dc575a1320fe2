"""RabbitMQ messages handled once (the ``rabbitmq`` extra: ``pip install 'outboxkit[rabbitmq]'``).

::

    inbox = RabbitMqInbox(engine, source="orders", handler=apply_order)
    queue = await channel.declare_queue("billing", durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 5, "x-dead-letter-exchange": "billing.dead",
    })
    await queue.consume(inbox.process)          # no_ack=False: acknowledged by the inbox

``process`` is the callback of an aio-pika consumer with manual
acknowledgement.  For one message it:

1. reads the message id from its ``message_id`` property (outboxkit's
   ``RabbitMqTransport`` sets it to the row's idempotency key; RabbitMQ does
   not de-duplicate, so a retried row can be in the queue twice, and the
   inbox drops the copy);
2. records it and runs ``handler(session, message)`` in one transaction
   (``outboxkit.inbox.brokers``), on a thread;
3. after the commit, ``ack()``s it; a duplicate is acknowledged without
   running the handler;
4. on a failure (the handler raised, no ``message_id``), waits
   ``retry_delay_seconds`` and ``nack(requeue=True)``s it: the queue delivers
   it again.  While the database does not answer, the message is kept and
   handled again when it does (``outboxkit.inbox.brokers``).

A consumer that dies before its acknowledgement (a crash between the commit
and the ack included) leaves its messages unacknowledged, and RabbitMQ
requeues them when its connection closes.

Redelivery is bounded by the queue, not by the consumer: declare a quorum
queue with ``x-delivery-limit`` and ``x-dead-letter-exchange``, and after that
many returns RabbitMQ dead-letters the message to the exchange (bind a queue
to it: the dead letters wait there, with their ``message_id``, until a person
moves them back).  A classic queue has no such limit and returns a message
that always fails for ever; the inbox still never applies it.

This module calls only the message's own methods; it imports no RabbitMQ client.
"""

from __future__ import annotations

import asyncio
from typing import Any

from outboxkit.inbox.brokers import DEFAULT_RETRY_DELAY_SECONDS, BrokerMessage, RedeliveringInbox, text_headers
from outboxkit.inbox.consumer import ConsumeOutcome
from outboxkit.transports.rabbitmq import KEY_HEADER

__all__ = ["DEFAULT_RETRY_DELAY_SECONDS", "RabbitMqInbox"]

# The count a quorum queue keeps of a message's earlier returns.
DELIVERY_COUNT_HEADER = "x-delivery-count"


class RabbitMqInbox(RedeliveringInbox):
    """RabbitMQ messages of one ``source``, each handled once; ``process`` acknowledges only after the commit.

    ``retry_delay_seconds`` (5 by default) is how long a failed message is
    held before it is returned to its queue, so a failing handler does not spin.
    """

    async def process(self, incoming: Any) -> ConsumeOutcome | None:
        """Handle one message once, then ``ack`` it; on a failure return it to its queue.

        Returns the outcome (``"handled"``, ``"duplicate"``), or None when it failed.
        """
        headers = text_headers(incoming.headers)
        earlier = headers.get(DELIVERY_COUNT_HEADER, "")
        message = BrokerMessage(
            message_id=incoming.message_id or "",
            body=incoming.body or b"",
            headers=headers,
            key=headers.get(KEY_HEADER),
            deliveries=int(earlier) + 1 if earlier.isdigit() else None,
        )

        async def give_back() -> None:
            await asyncio.sleep(self.retry_delay_seconds)
            await incoming.nack(requeue=True)

        return await self.settle(message, acknowledge=incoming.ack, give_back=give_back)
