"""The destination gauges (outboxkit.metrics.destination_gauges through outboxkit.metrics) read from the real database and
scraped in the text format: state, rows waiting and time open per destination, with a bounded number of series."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import delete, insert

from outboxkit import ManualClock, OutboxKit, OutboxKitSettings
from outboxkit.breaker import BreakerOptions, Reading, Signal
from outboxkit.destinations.store import DestinationStore, Observation
from outboxkit.errors import ConfigurationError
from outboxkit.metrics.prometheus import OutboxMetrics
from outboxkit.storage.tables import destinations as destination_table
from tests.support.models import SampleEvent

START = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
BREAKER = BreakerOptions(failures=2, cool_down=60, max_cool_down=600)
QUIET = {"drain_interval_seconds": 3600, "leader_tick_seconds": 3600, "standby_probe_seconds": 3600, "listen_enabled": False}
OPEN, GONE, FINE = "https://open.example:443", "https://gone.example:443", "https://fine.example:443"


@pytest.fixture
def kit(engine):
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(**QUIET), clock=ManualClock(START))
    yield kit
    kit.close()


def record(engine, destination: str, signal: Signal, *, at: datetime, code: int) -> None:
    with engine.begin() as connection:
        DestinationStore(SampleEvent).record(
            connection, destination, [Observation(Reading(signal), 1, code, "x")], now=at, options=BREAKER
        )


def hold_rows(engine, until: datetime, count: int) -> None:
    with engine.begin() as connection:
        connection.execute(insert(SampleEvent), [
            {"target_url": OPEN + "/hook", "payload": {}, "next_attempt_at": until} for _ in range(count)])


def scrape(metrics: OutboxMetrics) -> dict:
    metrics.refresh()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
        if sample.name.startswith("outboxkit_destination")
    }


def key(name: str, **labels: str) -> tuple:
    return name, tuple(sorted({"outbox": "sample-events", **labels}.items()))


def test_each_destination_has_its_state_rows_waiting_and_time_open(kit, engine):
    for _ in range(2):
        record(engine, OPEN, Signal.FAILURE, at=START, code=503)
    record(engine, GONE, Signal.GONE, at=START, code=410)
    record(engine, FINE, Signal.SUCCESS, at=START, code=200)
    hold_rows(engine, START + timedelta(seconds=60), 3)  # the open destination's cool-down end
    kit.clock.advance(seconds=40)
    with OutboxMetrics(kit, refresh_seconds=3600) as metrics:
        scraped = scrape(metrics)
    for destination, status in ((OPEN, "open"), (GONE, "disabled"), (FINE, "healthy")):
        one_hot = {state: scraped[key("outboxkit_destination_state", destination=destination, state=state)]
                   for state in ("healthy", "open", "half_open", "disabled")}
        assert one_hot == {state: float(state == status) for state in one_hot}, destination
    assert scraped[key("outboxkit_destination_waiting_rows", destination=OPEN)] == 3
    assert scraped[key("outboxkit_destination_waiting_rows", destination=FINE)] == 0
    assert scraped[key("outboxkit_destination_open_seconds", destination=OPEN)] == 40
    assert scraped[key("outboxkit_destination_open_seconds", destination=GONE)] == 0  # disabled has its own alert
    assert {state: scraped[key("outboxkit_destinations", state=state)] for state in ("healthy", "open", "half_open",
            "disabled")} == {"healthy": 1, "open": 1, "half_open": 0, "disabled": 1}


def test_the_series_cover_at_most_the_limit_those_needing_a_person_first_and_leave_with_their_destination(kit, engine):
    for _ in range(2):
        record(engine, OPEN, Signal.FAILURE, at=START, code=503)
    record(engine, GONE, Signal.GONE, at=START, code=410)
    record(engine, FINE, Signal.SUCCESS, at=START, code=200)
    with OutboxMetrics(kit, refresh_seconds=3600, destination_series_limit=2) as metrics:
        shown = {labels for (name, labels) in scrape(metrics) if name == "outboxkit_destination_waiting_rows"}
        assert shown == {key("", destination=GONE)[1], key("", destination=OPEN)[1]}  # the healthy one is cut off
        assert scrape(metrics)[key("outboxkit_destinations", state="healthy")] == 1  # but still counted
        with engine.begin() as connection:  # deleted by hand: healthy, no state, no series
            connection.execute(delete(destination_table).where(destination_table.c.destination == GONE))
        scraped = scrape(metrics)
    assert {labels for (name, labels) in scraped if name == "outboxkit_destination_waiting_rows"} == {
        key("", destination=OPEN)[1], key("", destination=FINE)[1]}
    assert not [labels for (name, labels) in scraped if GONE in dict(labels).values()]
    assert scraped[key("outboxkit_destinations", state="disabled")] == 0


@pytest.mark.parametrize("limit", [-1, True, 1.5, 10_001])
def test_a_bad_series_limit_is_refused(kit, limit):
    with pytest.raises(ConfigurationError, match="destination_series_limit"):
        OutboxMetrics(kit, destination_series_limit=limit)
