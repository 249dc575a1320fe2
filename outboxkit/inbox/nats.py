"""NATS JetStream messages handled once (the ``nats`` extra: ``pip install 'outboxkit[nats]'``).

::

    inbox = NatsInbox(engine, source="orders", handler=apply_order)
    subscription = await js.pull_subscribe(
        "orders.>", durable="billing", config=ConsumerConfig(max_deliver=5, ack_wait=30),
    )
    await inbox.run(subscription, stop)       # until the asyncio.Event ``stop`` is set

``run`` fetches a batch at a time from a pull subscription and processes its
messages in order; ``process`` is also the callback of a push subscription
with manual acknowledgement, where the messages the client buffered while
one is in hand are not kept alive (a pull subscription is the safer choice).
For one message ``process``:

1. reads the message id from the ``Nats-Msg-Id`` header (outboxkit's
   ``NatsTransport`` puts the row's idempotency key there; JetStream drops a
   copy published within the stream's duplicate window, and the inbox drops
   every copy after it, and every redelivery);
2. records it and runs ``handler(session, message)`` in one transaction
   (``outboxkit.inbox.brokers``), on a thread;
3. after the commit, ``ack()``s it; a duplicate is acknowledged without
   running the handler;
4. on a failure (the handler raised, no ``Nats-Msg-Id``),
   ``nak(delay=retry_delay_seconds)``: JetStream delivers it again after the
   delay.  While the database does not answer, the message is kept and
   handled again when it does, with ``in_progress()`` sent meanwhile so
   ``ack_wait`` does not run out (``outboxkit.inbox.brokers``).

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

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from outboxkit.inbox.brokers import (
    DATABASE_PROBE_SECONDS,
    DEFAULT_RETRY_DELAY_SECONDS,
    BrokerMessage,
    RedeliveringInbox,
    text_headers,
)
from outboxkit.inbox.consumer import ConsumeOutcome
from outboxkit.telemetry.log_events import log_fields
from outboxkit.transports.nats import KEY_HEADER, MESSAGE_ID_HEADER

__all__ = ["DEFAULT_RETRY_DELAY_SECONDS", "NatsInbox"]

logger = logging.getLogger(__name__)


class NatsInbox(RedeliveringInbox):
    """JetStream messages of one ``source``, each handled once; acknowledged only after the commit.

    ``retry_delay_seconds`` (5 by default) is how long JetStream waits before
    delivering a failed message again.
    """

    async def run(self, subscription: Any, stop: asyncio.Event, *, batch: int = 10, wait_seconds: float = 1.0) -> None:
        """Fetch up to ``batch`` messages at a time from a pull ``subscription`` and ``process`` them in order, until ``stop``.

        The messages of a batch that wait for their turn while the database
        is down are kept in hand too (``in_progress()``).  A fetch that fails
        (the connection lost) is logged and tried again at growing intervals.
        """
        failures = 0
        while not stop.is_set():
            try:
                messages = await subscription.fetch(batch, timeout=wait_seconds)
                failures = 0
            except TimeoutError:  # nats.errors.TimeoutError: nothing to fetch within wait_seconds
                continue
            except Exception as exc:
                wait = DATABASE_PROBE_SECONDS[min(failures, len(DATABASE_PROBE_SECONDS) - 1)]
                failures += 1
                logger.warning(
                    "inbox %s: fetching from JetStream failed (%s: %s); trying again in %g s",
                    self.source, type(exc).__name__, exc, wait,
                    extra=log_fields("inbox.stream_unavailable", None, source=self.source, stream=None),
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
                continue
            for index, msg in enumerate(messages):
                await self.process(msg, waiting=messages[index + 1:])

    async def process(self, msg: Any, *, waiting: Sequence[Any] = ()) -> ConsumeOutcome | None:
        """Handle one JetStream message once, then ``ack`` it; on a failure ``nak`` it for redelivery.

        The callback of a push subscription (``manual_ack=True``), or called
        for each message a pull subscription fetched; ``waiting`` are messages
        fetched with it and not processed yet, kept in hand with it.  Returns
        the outcome (``"handled"``, ``"duplicate"``), or None when it failed.
        """
        headers = text_headers(msg.headers)
        message = BrokerMessage(
            message_id=headers.get(MESSAGE_ID_HEADER, ""),
            body=msg.data or b"",
            headers=headers,
            key=headers.get(KEY_HEADER),
            deliveries=msg.metadata.num_delivered,
        )

        async def keep_alive() -> None:  # ack_wait starts again: not redelivered while the database is down
            for held in (msg, *waiting):
                await held.in_progress()

        return await self.settle(
            message, acknowledge=msg.ack, give_back=lambda: msg.nak(delay=self.retry_delay_seconds), keep_alive=keep_alive
        )
