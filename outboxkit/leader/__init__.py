"""The elected schedule: exactly one process among all runs the kit's own periodic work.

* ``election``: the leader election's state machine (campaign, tick, standby probe, shutdown),
  with the timing margins in its docstring;
* ``lock``: the session advisory lock's statements and who holds it (``pg_locks``, with the
  database predicate);
* ``scheduler``: the APScheduler the leader runs: the kit's internal jobs (one safety-net drain per
  outbox, housekeeping) and any job still registered with the deprecated ``kit.scheduler.add_job``
  (applications declare their jobs as schedules, ``outboxkit.schedules``);
* ``retention``: the opt-in job that deletes old ``done`` rows;
* ``partitions``: a partitioned outbox's job: partitions created ahead, whole partitions of ``done`` rows dropped.

Invariants: the holder count never exceeds one; a leader that loses its lock stops its scheduler at
its next tick, and a new leader waits one tick before it starts, so no job fires twice within one
interval.  Start with ``election``.
"""
