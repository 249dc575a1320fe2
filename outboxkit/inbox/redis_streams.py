"""Redis Streams entries handled once, in a consumer group (the ``redis`` extra: ``pip install 'outboxkit[redis]'``).

::

    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379/0")
    inbox = RedisStreamsInbox(
        engine, source="orders", handler=apply_order,
        client=client, stream="orders", group="billing", consumer=socket.gethostname(),
    )
    await inbox.create_group()
    await inbox.run(stop)                     # until the asyncio.Event ``stop`` is set

Redis has no callback to hand messages to, so this consumer reads its group
itself.  Each ``poll``:

1. takes back the entries of the group left unacknowledged for
   ``retry_after_seconds`` (by a consumer that crashed, or whose handler
   failed: ``XPENDING``, then ``XCLAIM``, which only one consumer wins);
   an entry already delivered ``max_deliveries`` times is not handled again
   but dead-lettered: appended to ``dead_letter_stream`` (``<stream>.dead``
   by default) with ``dead_letter_id`` and ``dead_letter_deliveries`` beside its
   fields, and acknowledged, both in one ``MULTI``;
2. reads new entries (``XREADGROUP ... >``, waiting up to ``block_seconds``);
3. for each entry, reads the message id from its ``idempotency_key`` field
   (outboxkit's ``RedisStreamsTransport`` writes it; Redis does not
   de-duplicate, so a retried row can be in the stream twice, and the inbox
   drops the copy), records it and runs ``handler(session, message)`` in one
   transaction (``outboxkit.inbox.brokers``);
4. after the commit, ``XACK``s it; a duplicate is acknowledged without
   running the handler.  A failure (the handler raised, no
   ``idempotency_key``) acknowledges nothing: the entry stays pending and
   step 1 takes it again after ``retry_after_seconds``.  While the database
   does not answer, the entry is kept and handled again when it does
   (``outboxkit.inbox.brokers``).

A consumer that crashes between the commit and the ``XACK`` leaves the entry
pending; step 1 of any consumer of the group (itself, restarted under the same
name, included) takes it back, finds its record, and acknowledges it.  Set
``retry_after_seconds`` above the handler's longest run, or another consumer
takes back an entry still being handled (its copy then waits for the first
transaction and is dropped as a duplicate).

The client is the application's ``redis.asyncio.Redis`` (with or without
``decode_responses``); this module calls its methods and imports no Redis client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Engine

from outboxkit.errors import ConfigurationError
from outboxkit.inbox.brokers import DATABASE_PROBE_SECONDS, BrokerHandler, BrokerInbox, BrokerMessage
from outboxkit.inbox.consumer import InboxObserver
from outboxkit.telemetry.log_events import log_fields

__all__ = ["DEFAULT_MAX_DELIVERIES", "DEFAULT_RETRY_AFTER_SECONDS", "RedisStreamsInbox"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_DELIVERIES = 5
DEFAULT_RETRY_AFTER_SECONDS = 30.0


class RedisStreamsInbox(BrokerInbox):
    """The entries of ``stream`` read by ``consumer`` of ``group``, each handled once; acknowledged after the commit."""

    def __init__(
        self,
        engine: Engine,
        *,
        source: str,
        handler: BrokerHandler,
        client: Any,
        stream: str,
        group: str,
        consumer: str,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
        retry_after_seconds: float = DEFAULT_RETRY_AFTER_SECONDS,
        dead_letter_stream: str | None = None,
        observers: Iterable[InboxObserver] = (),
    ) -> None:
        super().__init__(engine, source=source, handler=handler, observers=observers)
        for name, value in (("stream", stream), ("group", group), ("consumer", consumer)):
            if not isinstance(value, str) or not value:
                raise ConfigurationError(f"RedisStreamsInbox: {name} must be a non-empty name, got {value!r}")
        if isinstance(max_deliveries, bool) or not isinstance(max_deliveries, int) or max_deliveries < 1:
            raise ConfigurationError(f"RedisStreamsInbox: max_deliveries must be a positive integer, got {max_deliveries!r}")
        if not retry_after_seconds > 0:
            raise ConfigurationError(f"RedisStreamsInbox: retry_after_seconds must be positive, got {retry_after_seconds!r}")
        self.client = client
        self.stream, self.group, self.name = stream, group, consumer
        self.max_deliveries = max_deliveries
        self.retry_after_ms = max(1, int(retry_after_seconds * 1000))
        self.dead_letter_stream = dead_letter_stream or f"{stream}.dead"

    async def create_group(self, *, start: str = "0") -> None:
        """Create the group (and the stream) if missing; a new group reads from ``start``.

        ``"0"`` (the default) reads every entry already in the stream, ``"$"`` only those appended later.
        """
        try:
            await self.client.xgroup_create(self.stream, self.group, id=start, mkstream=True)
        except Exception as exc:  # redis.exceptions.ResponseError
            if "BUSYGROUP" not in str(exc):
                raise

    async def run(self, stop: asyncio.Event, *, count: int = 10, block_seconds: float = 1.0) -> None:
        """``poll`` until ``stop`` is set; the entry in hand is finished first.

        A Redis that cannot be reached (or answers an error) does not end the
        loop: it is logged, and polled again at growing intervals
        (``DATABASE_PROBE_SECONDS``); what was not acknowledged stays pending.
        """
        failures = 0
        while not stop.is_set():
            try:
                await self.poll(count=count, block_seconds=block_seconds)
                failures = 0
            except Exception as exc:  # redis.exceptions.RedisError, OSError: the client reconnects on the next command
                wait = DATABASE_PROBE_SECONDS[min(failures, len(DATABASE_PROBE_SECONDS) - 1)]
                failures += 1
                logger.warning(
                    "inbox %s: reading the stream %s failed (%s: %s); trying again in %g s",
                    self.source, self.stream, type(exc).__name__, exc, wait,
                    extra=log_fields("inbox.stream_unavailable", None, source=self.source, stream=self.stream),
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)

    async def poll(self, *, count: int = 10, block_seconds: float = 1.0) -> int:
        """Take back idle entries, read new ones (waiting up to ``block_seconds``) and handle each.

        Returns how many were acknowledged (handled or dropped as duplicates).
        """
        settled = 0
        for entry_id, fields, deliveries in await self._take_back(count):
            settled += await self._settle(entry_id, fields, deliveries)
        answer = await self.client.xreadgroup(
            self.group, self.name, {self.stream: ">"}, count=count, block=max(1, int(block_seconds * 1000))
        )
        for _stream, entries in answer or []:
            for entry_id, fields in entries:
                if fields:  # an entry deleted before it was read comes back empty
                    settled += await self._settle(entry_id, fields, 1)
        return settled

    async def _take_back(self, count: int) -> list[tuple[Any, Mapping[Any, Any], int]]:
        """The group's entries idle past the retry time, claimed by this consumer; those past the limit dead-lettered."""
        pending = await self.client.xpending_range(
            self.stream, self.group, min="-", max="+", count=count, idle=self.retry_after_ms
        )
        taken = []
        for item in pending:
            entry_id, delivered = item["message_id"], int(item["times_delivered"])
            claimed = await self.client.xclaim(
                self.stream, self.group, self.name, min_idle_time=self.retry_after_ms, message_ids=[entry_id]
            )
            for claimed_id, fields in claimed:
                if not fields:
                    continue
                if delivered >= self.max_deliveries:
                    await self._dead_letter(claimed_id, fields, delivered)
                else:
                    taken.append((claimed_id, fields, delivered + 1))
        return taken

    async def _settle(self, entry_id: Any, fields: Mapping[Any, Any], deliveries: int) -> int:
        values = {_text(name): value for name, value in fields.items()}
        headers = values.get("headers")
        message = BrokerMessage(
            message_id=_text(values.get("idempotency_key", "")),
            body=_bytes(values.get("body", b"")),
            headers=json.loads(headers) if headers else {},
            key=_text(values["key"]) if "key" in values else None,
            deliveries=deliveries,
        )
        outcome = await self.consume(message)
        if outcome is None:
            return 0  # pending: taken back after retry_after_seconds
        try:
            await self.client.xack(self.stream, self.group, entry_id)
        except Exception as exc:  # stays pending; taken back and dropped as a duplicate
            self.acknowledgement_lost(message.message_id, exc)
        return 1

    async def _dead_letter(self, entry_id: Any, fields: Mapping[Any, Any], deliveries: int) -> None:
        dead = {**fields, "dead_letter_id": _text(entry_id), "dead_letter_deliveries": str(deliveries)}
        async with self.client.pipeline(transaction=True) as pipeline:
            pipeline.xadd(self.dead_letter_stream, dead)
            pipeline.xack(self.stream, self.group, entry_id)
            await pipeline.execute()
        self.consumer.count_failure(
            _text(fields.get("idempotency_key", fields.get(b"idempotency_key", ""))) or _text(entry_id),
            RuntimeError(
                f"entry {_text(entry_id)} was delivered {deliveries} times without being handled; "
                f"moved to the stream {self.dead_letter_stream!r}"
            ),
        )


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
