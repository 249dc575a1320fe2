"""A process that fires schedule rows, for tests that kill it.

    python -m tests.support.schedule_worker <sqlalchemy url> [<lease seconds>]

With a lease, the runner takes that lease and looks at the rows at least
every second (the kill tests); without one, it runs at its defaults (the
cadence tests).

Its job ``slow`` prints ``started <fire time>`` and then hangs until the
process is killed; ``record`` inserts its occurrence into
``schedule_worker_runs`` (created by the test).
"""

from __future__ import annotations

import sys
import threading

from sqlalchemy import create_engine, text

from outboxkit.schedules.jobs import JobContext
from outboxkit.schedules.runner import ScheduleRunner


def slow(context: JobContext) -> None:
    print(f"started {context.scheduled_for.isoformat()}", flush=True)
    threading.Event().wait()


def record(context: JobContext) -> None:
    context.session.execute(
        text("INSERT INTO schedule_worker_runs (name, scheduled_for, holder) VALUES (:name, :at, :holder)"),
        {"name": context.job_id, "at": context.scheduled_for, "holder": context.leader},
    )
    context.session.commit()


def main() -> None:
    url = sys.argv[1]
    options = {"lease_seconds": float(sys.argv[2]), "max_idle_seconds": 1.0} if len(sys.argv) > 2 else {}
    runner = ScheduleRunner(create_engine(url), jobs={"slow": slow, "record": record}, **options)
    runner.start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
