"""Kits over ``SampleEvent`` for the CLI tests: ``--app tests.support.worker_app:kit_from_environment``.

``kit_with_schedules_from_environment`` also declares a schedule in code
(``worker.tick``, every second) whose job reports the pid of the process
that ran it, so a test sees which process fired it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from sqlalchemy import create_engine

from outboxkit import OutboxKit
from outboxkit.schedules.definitions import ScheduleTrigger
from outboxkit.schedules.jobs import JobContext
from tests.support.database import sqlalchemy_url
from tests.support.models import SampleEvent, ScheduledCall


def kit_from_environment() -> OutboxKit:
    return OutboxKit(create_engine(sqlalchemy_url(os.environ["DATABASE_URL"]), pool_size=4), [SampleEvent])


def report_pid(context: JobContext) -> dict[str, int]:
    return {"pid": os.getpid()}


def kit_with_schedules_from_environment() -> OutboxKit:
    engine = create_engine(sqlalchemy_url(os.environ["DATABASE_URL"]), pool_size=4)
    kit = OutboxKit(engine, [SampleEvent, ScheduledCall])
    kit.schedules.add_job("worker.tick", report_pid, ScheduleTrigger.every(seconds=1))
    return kit


def receive_only_kit_from_environment() -> OutboxKit:
    return OutboxKit.receive_only(create_engine(sqlalchemy_url(os.environ["DATABASE_URL"]), pool_size=4))


APP = "tests.support.worker_app:kit_from_environment"
RECEIVE_ONLY_APP = "tests.support.worker_app:receive_only_kit_from_environment"
SCHEDULES_APP = "tests.support.worker_app:kit_with_schedules_from_environment"


def worker_command(*arguments: str, app: str = APP) -> list[str]:
    """``outboxkit --app <the kit> worker <arguments>`` as a subprocess argv, in this interpreter."""
    return [sys.executable, "-m", "outboxkit.cli", "--app", app, "worker", *arguments]


def metrics_port(process: subprocess.Popen[str]) -> int:
    """The port a ``worker --metrics-port 0`` subprocess serves on, read from its log (stderr, text mode)."""
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
        if found:
            return int(found.group(1))
    raise AssertionError("the worker did not say where it serves metrics")
