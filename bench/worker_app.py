"""The kit ``bench/worker_start.py`` starts workers on: the example ``WebhookOutbox``, no web framework.

``--app bench.worker_app:kit_from_environment``; its imports are part of the start-up measured, so it imports
only what an application's kit module needs.
"""

from __future__ import annotations

import os

from exampleapp.models import WebhookOutbox
from sqlalchemy import create_engine

from outboxkit import OutboxKit


def kit_from_environment() -> OutboxKit:
    return OutboxKit(create_engine(os.environ["BENCH_WORKER_DATABASE_URL"], pool_size=2), [WebhookOutbox])
