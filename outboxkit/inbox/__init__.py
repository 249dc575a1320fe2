"""The inbox: the receiving side's half of exactly-once, each message's effect applied once.

What it owns: ``outboxkit_inbox``, one record per (source, message id) handled,
written in the consumer's own transaction with ``INSERT ... ON CONFLICT DO
NOTHING``, and ``outboxkit_inbox_sources``, the duplicates and handler failures
counted per source (tables in ``outboxkit.storage.tables``, migration
``outboxkit_0012``).

Its invariant: a message's record and its handler's writes commit together or
not at all, so a message is either handled once (and every later delivery is
a dropped duplicate) or not at all (and the next delivery handles it).

Where to start reading:

* ``store``: ``record_message``, the one call, and the counts beside it;
* ``consumer``: ``InboxConsumer``, record then handle then commit, failures counted;
* ``verify``: Standard Webhooks verification (the only importer of ``standardwebhooks``);
* ``webhooks``: ``WebhookReceiver``, the FastAPI route (verify, record, handle, answer);
* ``brokers``: what the broker consumers share (``BrokerMessage``, a message handled on a thread);
* ``nats``, ``rabbitmq``, ``redis_streams``: the broker consumers, each acknowledging only after the
  commit, each with its broker's bounded redelivery and dead letters;
* ``views``: per source, what operators see (admin, CLI);
* ``retention``: pruning records past the window (``OUTBOXKIT_INBOX_RETENTION_DAYS``).

docs/inbox.md is the user's guide.
"""

from outboxkit.inbox.consumer import ConsumeOutcome, InboxConsumer, InboxObserver
from outboxkit.inbox.retention import INBOX_RETENTION_JOB_ID, inbox_retention_job, prune_inbox
from outboxkit.inbox.store import record_handler_failure, record_message
from outboxkit.inbox.views import InboxSourceSummary, inbox_summaries

__all__ = [
    "INBOX_RETENTION_JOB_ID",
    "ConsumeOutcome",
    "InboxConsumer",
    "InboxObserver",
    "InboxSourceSummary",
    "inbox_retention_job",
    "inbox_summaries",
    "prune_inbox",
    "record_handler_failure",
    "record_message",
]
