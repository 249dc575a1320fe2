"""A kit over ``SampleEvent`` for the CLI tests: ``--app tests.support.worker_app:kit_from_environment``."""

from __future__ import annotations

import os
import sys

from sqlalchemy import create_engine

from outboxkit import OutboxKit
from tests.support.database import sqlalchemy_url
from tests.support.models import SampleEvent


def kit_from_environment() -> OutboxKit:
    return OutboxKit(create_engine(sqlalchemy_url(os.environ["DATABASE_URL"]), pool_size=4), [SampleEvent])


APP = "tests.support.worker_app:kit_from_environment"


def worker_command(*arguments: str) -> list[str]:
    """``outboxkit --app <this kit> worker <arguments>`` as a subprocess argv, in this interpreter."""
    return [sys.executable, "-m", "outboxkit.cli", "--app", APP, "worker", *arguments]
