"""Transports: how one claimed row leaves the process, and what its answer means.

Owns the transport interface (``base``: ``Delivery``, ``Transport.send`` returning an
``AttemptResult``), HTTP delivery on httpcore (``http``), the hard total deadline of one
send (``deadline``) and Standard Webhooks signing (``signing``).

Invariants:
* a transport never raises into the drain: every failure becomes an ``AttemptResult``
  that the outcome rules (``outboxkit.policy``) turn into done, retry or stuck;
* every send ends by its deadline (connect, send, the whole answer), so the lease that
  guards the row outlasts it.

Start with ``base``, then ``http``.  A new transport is one module here that implements
``Transport``; nothing in the drain changes (docs/architecture.md).
"""
