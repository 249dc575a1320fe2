"""Testing an application that uses outboxkit: a recording transport, a drain that runs through backoff, row assertions.

::

    recorder = RecordingTransport()
    kit = OutboxKit(engine, outboxes=[OrderOutbox], clock=ManualClock(), transport=recorder)
    recorder.attach(kit)                       # sends are recorded per outbox

    place_order(engine, sku="tea", quantity=2) # writes the order and its outbox row
    assert_enqueued(engine, OrderOutbox, where={"sku": "tea"})
    recorder.queue(503, timeout(), 201)        # the receiver fails twice, then accepts
    report = drain_until_idle(kit)             # moves the clock through the backoff table
    assert report.delivered == 1 and len(recorder.sends_for(OrderOutbox)) == 3

The pytest fixtures that build a migrated database and such a kit per test
live in ``outboxkit.pytest_plugin``; docs/testing.md is the guide.

What fails loudly, and how:

* ``UnexpectedSendError``: a send the test did not plan for.  A strict
  ``RecordingTransport`` (``strict=True``) has no answer for it, or the
  transport it forwards to raised (respx raises ``AllMockedAssertionError``
  for a URL with no route).  The attempt itself fails like a refused
  connection, as it would in production, and ``drain_until_idle`` (or
  ``RecordingTransport.check()``) raises after the round, naming the sends.
* ``NotIdleError``: ``drain_until_idle`` could not reach idle within
  ``max_rounds``, or a drain failed (a database error, a missing table).
* ``OutboxAssertionError``: ``assert_enqueued`` found other rows than
  expected; the message lists what the table holds.

All three derive from ``OutboxKitError`` and from ``AssertionError``, so
pytest reports them as failures.
"""

from outboxkit.errors import NotIdleError, OutboxAssertionError, UnexpectedSendError
from outboxkit.testing.draining import IdleReport, drain_until_idle
from outboxkit.testing.recording import RecordedSend, RecordingTransport, UnexpectedSend, connection_error, reply, timeout
from outboxkit.testing.rows import assert_enqueued, outbox_rows

__all__ = [
    "IdleReport",
    "NotIdleError",
    "OutboxAssertionError",
    "RecordedSend",
    "RecordingTransport",
    "UnexpectedSend",
    "UnexpectedSendError",
    "assert_enqueued",
    "connection_error",
    "drain_until_idle",
    "outbox_rows",
    "reply",
    "timeout",
]
