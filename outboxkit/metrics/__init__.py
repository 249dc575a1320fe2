"""Metrics and health endpoints.

* ``prometheus``: ``OutboxMetrics``, the Prometheus metrics of one kit (lag, failures, the leader,
  the jobs), and the worker's metrics server (``outboxkit[metrics]``);
* ``inbox``: the inbox's messages per source by outcome (``metrics.inbox``, an inbox observer);
* ``destination_gauges``: each destination's state, rows waiting and time open, bounded per outbox;
* ``health``: liveness, readiness and metrics over HTTP for a process without a web framework.
"""

from outboxkit.metrics.prometheus import *  # noqa: F403  (OutboxMetrics and the worker's server)
from outboxkit.metrics.prometheus import __all__  # noqa: F401
