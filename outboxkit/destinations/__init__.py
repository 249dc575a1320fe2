"""Destinations: where deliveries go, and how one failing receiver is kept from slowing the others.

A destination is the scheme, host and port of a delivery's URL, or a name the outbox chooses, stored on
each row when it is inserted.  Its rules are pure and sit below the row (``outboxkit.breaker``,
``outboxkit.rate_limits``); which rows a claim may take, rate limits included, is decided in the
claim's SQL (``outboxkit.storage.destination_claim``).  This package holds what is shared across processes and
what the drain consults after the claim:

* ``store``: destination state in ``outboxkit_destinations`` (record, resume, disable, probe now), each
  statement in the caller's transaction, shared by every process;
* ``gate``: after the claim, what outcomes do to the breaker;
* ``views``: what an operator reads (each state with the rows waiting for it);
* ``recent_keys``: a table per key that forgets keys idle past a bound.

Invariants: a blocked destination's rows are never claimed and spend no attempt; at most ``BreakerOptions.probes``
probes per cool-down across processes; a suspect destination's cap and a rate limit hold across processes.  Start with ``gate``.

``BreakerOptions`` and the other rules are importable from here for one release; their home is
``outboxkit.breaker``.
"""

from outboxkit.breaker import *  # noqa: F403  (the old ``outboxkit.destinations`` module's names, for one release)
from outboxkit.breaker import __all__  # noqa: F401
