"""Schedules: when work runs, as rows any process may fire, each occurrence once.

* ``definitions``: a schedule as data (``ScheduleTrigger``, ``HttpTarget``, ``JobTarget``,
  ``ScheduleDefinition``); ``triggers``: the arithmetic (intervals on a shared anchor, cron,
  calendar intervals, DST); ``misfires``: which occurrences run late, which are missed;
* ``jobs``: a job's definition and the discipline of every run (a fresh session, the
  ``(job, fire time)`` fence, a run record), shared with the elected schedule of ``outboxkit.leader``;
  ``fences``: the fence, kept apart from the capped run history;
* ``store``: the schedule rows (create, edit, enable, disable, run now, delete, the sync of schedules
  declared in code); ``views``: what an operator reads about them;
* ``runner``: the trigger loop every process runs; ``claims``: what one transaction does with a due
  row; ``leases`` and ``runs``: the runs of Python jobs in progress, counted across processes;
  ``requests``: the outbox that carries HTTP targets (due and expired by the database server's clock,
  ``outboxkit.storage.database_time``);
* ``runtime``: ``KitSchedules`` (``kit.schedules``), which the lifespan and the worker start.

Invariants: a due row is claimed with ``FOR UPDATE SKIP LOCKED`` and its ``next_run_at`` advanced
before the claim commits, so two processes fire disjoint occurrences; an HTTP target is enqueued in
that same transaction; a Python job runs under a lease row, so it never overlaps itself past
``max_running``.  Start with ``runner``.
"""

from outboxkit.schedules.definitions import *  # noqa: F403  (the public names of a schedule)
from outboxkit.schedules.definitions import __all__  # noqa: F401
