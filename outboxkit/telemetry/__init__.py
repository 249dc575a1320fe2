"""Telemetry: what the kit says about what it did.

* ``hooks``: ``Telemetry``, the one place the drain, the election and the job runners report to,
  fanning out to observers (metrics, tracing, an application's own);
* ``log_events``: the structured fields of every log line (each line names its event);
* ``tracing``: OpenTelemetry spans per attempt and per drain run (``outboxkit[tracing]``).

Logger names equal module paths, so ``outboxkit.drain`` names every line of the drain.
"""
