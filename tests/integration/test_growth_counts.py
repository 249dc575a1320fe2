"""The overview's counts stay cheap as the table grows: capped exact counts, flagged estimates past the cap.

``COUNT_EXACT_LIMIT`` is 100,000 in the kit; these tests lower it so a few
thousand rows stand for a big backlog.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

import outboxkit.storage.operator_queries
from tests.support.admin import (  # noqa: F401  (fixtures)
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
)

LIMIT = 1_000


@pytest.fixture
def low_limit(monkeypatch):
    monkeypatch.setattr(outboxkit.storage.operator_queries, "COUNT_EXACT_LIMIT", LIMIT)


def analyze(engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE webhook_outbox"))


def webhook_counts(admin) -> dict:
    overview = admin.client.get("/admin/api/outboxes").json()
    return next(box for box in overview["outboxes"] if box["name"] == "webhooks")["counts"]


def test_counts_up_to_the_limit_are_exact(admin, low_limit):
    now = admin.clock.now()
    add_webhooks(admin.engine, LIMIT, status="pending", next_attempt_at=now - timedelta(minutes=1))
    add_webhooks(admin.engine, LIMIT, status="stuck")
    analyze(admin.engine)

    counts = webhook_counts(admin)

    assert (counts["pending"], counts["pending_estimated"]) == (LIMIT, False)
    assert (counts["stuck"], counts["stuck_estimated"]) == (LIMIT, False)


def test_past_the_limit_pending_and_stuck_are_flagged_estimates(admin, low_limit):
    now = admin.clock.now()
    add_webhooks(admin.engine, 3_000, status="pending", next_attempt_at=now - timedelta(minutes=1))
    add_webhooks(admin.engine, 2_000, status="stuck")
    analyze(admin.engine)

    counts = webhook_counts(admin)

    assert counts["pending_estimated"] is True and counts["stuck_estimated"] is True
    assert abs(counts["pending"] - 3_000) <= 300
    assert abs(counts["stuck"] - 2_000) <= 200


def test_an_estimate_after_growth_since_the_last_vacuum_stays_flagged_and_above_the_limit(admin, low_limit):
    now = admin.clock.now()
    add_webhooks(admin.engine, 2_000, status="pending", next_attempt_at=now - timedelta(minutes=1))
    analyze(admin.engine)
    add_webhooks(admin.engine, 6_000, status="pending", next_attempt_at=now - timedelta(minutes=1))

    counts = webhook_counts(admin)

    # The estimate is only as fresh as the last VACUUM / ANALYZE (scaled by
    # the index's size, which lags while freed pages are reused), so it is
    # flagged; it never claims fewer rows than the exact scan already saw.
    assert counts["pending_estimated"] is True
    assert counts["pending"] > LIMIT


def test_in_flight_is_exact_and_read_from_the_claimed_index(admin, low_limit):
    now = admin.clock.now()
    lease = now + timedelta(minutes=2)
    add_webhooks(admin.engine, 2_000, status="pending", next_attempt_at=now + timedelta(hours=1))
    add_webhooks(admin.engine, 7, status="pending", next_attempt_at=lease, claimed_until=lease)
    # A crashed worker's lease that ran out: claimed, but no longer in flight.
    add_webhooks(
        admin.engine, 2, status="pending", next_attempt_at=now - timedelta(minutes=1), claimed_until=now - timedelta(minutes=1)
    )
    analyze(admin.engine)

    assert webhook_counts(admin)["in_flight"] == 7


def test_the_pages_mark_estimated_counts(admin, low_limit):
    add_webhooks(admin.engine, 1_500, status="stuck")
    analyze(admin.engine)

    overview = admin.client.get("/admin/")
    rows = admin.client.get("/admin/outboxes/webhooks?status=stuck")

    assert overview.status_code == 200 and rows.status_code == 200
    assert "(estimate)" in overview.text and "~1," in overview.text
    assert '<span class="count">~1,' in rows.text
