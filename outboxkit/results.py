"""What a drain call and a job run report: plain values, below everything that produces or observes them.

``DrainResult`` comes back from ``drain_once``/``drain`` (and from each busy
spell of the background loop); ``RunRecord`` comes back from one scheduled
job run; ``Exchange`` is what one HTTP attempt sent and what came back, as the
attempt history keeps it (built, redacted, by
``outboxkit.transports.exchange``).  They live here, not beside their
producers, so the telemetry that observes them (``outboxkit.telemetry``, ``outboxkit.metrics``,
``outboxkit.telemetry.tracing``) imports no drain or scheduler code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_RUN_LINKS", "DrainResult", "Exchange", "RunRecord"]

# How many attempt spans a drain run's span links to, at most (the OpenTelemetry SDK's default link limit).
MAX_RUN_LINKS = 128


@dataclass
class DrainResult:
    """What one drain call did (or, for the background loop, one busy spell)."""

    job_name: str
    claimed: int = 0
    delivered: int = 0
    retried: int = 0
    stuck: int = 0
    lost_claims: int = 0  # outcomes not written: the row was reset or re-claimed meanwhile
    error: str | None = None  # a database error that cut the drain short
    schema_problem: bool = False  # that error is a missing table or column, already logged once with the fix
    batches: int = 0
    errors: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic, repr=False, compare=False)  # monotonic; for telemetry
    # Per attached observer (by id), what it kept of each send of this run (tracing: the attempt spans'
    # contexts, which the run's span links to); at most MAX_RUN_LINKS each.
    telemetry_links: dict[int, list[Any]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def eventful(self) -> bool:
        return bool(self.claimed or self.stuck or self.lost_claims or self.errors)

    def add(self, other: DrainResult) -> None:
        self.claimed += other.claimed
        self.delivered += other.delivered
        self.retried += other.retried
        self.stuck += other.stuck
        self.lost_claims += other.lost_claims
        self.batches += other.batches
        self.errors.extend(other.errors)
        self.error = other.error or self.error
        for observer, links in other.telemetry_links.items():
            kept = self.telemetry_links.setdefault(observer, [])
            kept.extend(links[: max(0, MAX_RUN_LINKS - len(kept))])

    def as_counts(self) -> dict[str, int]:
        return {
            "claimed": self.claimed,
            "delivered": self.delivered,
            "retried": self.retried,
            "stuck": self.stuck,
            "lost_claims": self.lost_claims,
        }


@dataclass(frozen=True)
class RunRecord:
    """What ``JobRunner.run`` did: ``skipped`` if the fence said the occurrence already ran."""

    outcome: str  # "ok", "error" or "skipped" (an "abandoned" run is one that never returned)
    counts: dict[str, int]
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Exchange:
    """What one HTTP attempt sent and what came back, already redacted (``outboxkit.transports.exchange``).

    ``body`` is the request body as sent (the transport's own bytes, not a
    copy); the attempt history keeps at most ``attempt_body_bytes`` of it,
    none by default.  ``status`` is None when no answer came (a timeout, a
    refused connection): the request part still says what was sent.
    """

    method: str
    url: str
    request_headers: tuple[tuple[str, str], ...]
    body: bytes | None
    body_size: int
    body_sha256: str | None
    status: int | None = None
    response_headers: tuple[tuple[str, str], ...] = ()
    response_excerpt: bytes = b""
    response_size: int | None = None  # bytes of the answer's body read (all of it; the excerpt is its first bytes)
