"""NATS JetStream messages handled once (the ``nats`` extra: ``pip install 'outboxkit[nats]'``).

::

    inbox = NatsInbox(engine, source="orders", handler=apply_order)
    await js.subscribe(
        "orders.>", durable="billing", cb=inbox.process, manual_ack=True,
        config=ConsumerConfig(max_deliver=5, ack_wait=30),
    )

``process`` is the callback of a JetStream subscription with manual
acknowledgement (push), or is called with each message a pull subscription
fetches.  For one message it:

1. reads the message id from the ``Nats-Msg-Id`` header (outboxkit's
   ``NatsTransport`` puts the row's idempotency key there; JetStream drops a
   copy published within the stream's duplicate window, and the inbox drops
   every copy after it, and every redelivery);
2. records it and runs ``handler(session, message)`` in one transaction
   (``outboxkit.inbox.brokers``), on a thread;
3. after the commit, ``ack()``s it; a duplicate is acknowledged without
   running the handler;
4. on a failure (the handler raised, the database failed, no
   ``Nats-Msg-Id``), ``nak(delay=retry_delay_seconds)``: JetStream delivers it
   again after the delay.

Redelivery is bounded by the consumer's ``max_deliver``: after that many
deliveries JetStream stops delivering the message and publishes an advisory
on ``$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>`` naming
its stream sequence.  The message stays in the stream (a limits or interest
stream keeps it), so the advisory is the dead letter: fix the handler, then
publish the message again from its sequence (``js.get_msg``), with its
``Nats-Msg-Id``.  Set ``ack_wait`` above the handler's longest run, or
JetStream redelivers a message still being handled (its copy then waits for
the first transaction and is dropped as a duplicate).

This module calls only the message's own methods; it imports no NATS client.
"""

from __future__ import annotations

from typing import Any

from outboxkit.inbox.brokers import DEFAULT_RETRY_DELAY_SECONDS, BrokerMessage, RedeliveringInbox, text_headers
from outboxkit.inbox.consumer import ConsumeOutcome
from outboxkit.transports.nats import KEY_HEADER, MESSAGE_ID_HEADER

__all__ = ["DEFAULT_RETRY_DELAY_SECONDS", "NatsInbox"]


class NatsInbox(RedeliveringInbox):
    """JetStream messages of one ``source``, each handled once; ``process`` acknowledges only after the commit.

    ``retry_delay_seconds`` (5 by default) is how long JetStream waits before
    delivering a failed message again.
    """

    async def process(self, msg: Any) -> ConsumeOutcome | None:
        """Handle one JetStream message once, then ``ack`` it; on a failure ``nak`` it for redelivery.

        Returns the outcome (``"handled"``, ``"duplicate"``), or None when it failed.
        """
        headers = text_headers(msg.headers)
        message = BrokerMessage(
            message_id=headers.get(MESSAGE_ID_HEADER, ""),
            body=msg.data or b"",
            headers=headers,
            key=headers.get(KEY_HEADER),
            deliveries=msg.metadata.num_delivered,
        )
        return await self.settle(message, acknowledge=msg.ack, give_back=lambda: msg.nak(delay=self.retry_delay_seconds))
