"""Helpers for the destination tests of the admin, the CLI and the metrics: states set as the drain would set them."""

from __future__ import annotations

from datetime import datetime

from exampleapp.models import WebhookOutbox
from sqlalchemy import Engine, text

from outboxkit.breaker import BreakerOptions, DestinationState, Reading, Signal
from outboxkit.destinations.store import DestinationStore, Observation

DEAD = "http://127.0.0.1:9"  # the destination of add_webhooks' default target_url
BREAKER = BreakerOptions(failures=3, cool_down=30, max_cool_down=600)


def record(engine: Engine, signal: Signal, *, at: datetime, destination: str = DEAD, row_id: int = 1,
           status_code: int | None = 503, slow_down: float | None = None) -> DestinationState:
    """One attempt's outcome recorded against ``destination`` of the webhooks outbox, as the drain records it."""
    with engine.begin() as connection:
        seen = Observation(Reading(signal, slow_down), row_id, status_code, f"receiver answered {status_code}")
        _, after = DestinationStore(WebhookOutbox).record(connection, destination, [seen], now=at, options=BREAKER)
    return after


def open_breaker(engine: Engine, *, at: datetime, destination: str = DEAD) -> DestinationState:
    """Failures enough to open the destination's breaker at ``at``; its state after."""
    state = None
    for row_id in range(1, BREAKER.failures + 1):
        state = record(engine, Signal.FAILURE, at=at, destination=destination, row_id=row_id)
    assert state is not None and state.status == "open"
    return state


def destination_row(engine: Engine, destination: str = DEAD) -> dict | None:
    with engine.connect() as connection:
        row = connection.execute(
            text("SELECT * FROM outboxkit_destinations WHERE outbox = 'webhooks' AND destination = :name"),
            {"name": destination},
        ).one_or_none()
    return dict(row._mapping) if row is not None else None
