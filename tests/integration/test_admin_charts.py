"""The live overview: per-minute figures kept by the drainers, drawn as server-rendered SVG, optional auto-refresh."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from outboxkit.storage.attempts import AttemptLog
from tests.support.admin import (  # noqa: F401  (fixtures)
    START,
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
)
from tests.support.receiver import Reply


def minutes_of(engine, outbox: str = "webhooks") -> list[dict]:
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM outboxkit_outbox_minutes WHERE outbox = :o ORDER BY minute"), {"o": outbox})
        return [dict(row._mapping) for row in rows]


def test_the_drain_counts_deliveries_and_failures_per_minute_and_the_overview_returns_the_last_hour(admin, receiver):
    add_webhooks(admin.engine, 2, status="pending", attempts=0, error=None, status_code=None, target_url=receiver.url + "/hook")
    add_webhooks(admin.engine, 1, status="pending", attempts=0, error=None, status_code=None, target_url=receiver.url + "/down")
    receiver.respond = lambda request: Reply(status=503) if request.path == "/down" else Reply()
    admin.kit.drain_once("webhooks")

    (minute,) = minutes_of(admin.engine)
    overview = admin.client.get("/admin/api/outboxes", params={"charts": "true"}).json()
    last_hour = {box["name"]: box["last_hour"] for box in overview["outboxes"]}

    assert (minute["delivered"], minute["failed"], minute["stuck"]) == (2, 1, 0)
    assert minute["minute"] == admin.clock.now().replace(second=0, microsecond=0)
    assert len(last_hour["webhooks"]) == 60 and len(last_hour["credit-grants"]) == 60
    assert (last_hour["webhooks"][-1]["delivered"], last_hour["webhooks"][-1]["failed"]) == (2, 1)
    assert all(entry["delivered"] == 0 for entry in last_hour["webhooks"][:-1])
    assert admin.client.get("/admin/api/outboxes").json()["outboxes"][0]["last_hour"] is None  # only when asked


def test_a_drainer_samples_the_backlog_once_a_minute(admin):
    now = admin.clock.now()
    add_webhooks(admin.engine, 4, status="pending", next_attempt_at=now - timedelta(minutes=5))
    add_webhooks(admin.engine, 2, status="pending", next_attempt_at=now + timedelta(hours=1))
    table = admin.kit.drainer("webhooks").queries.table_name
    first, second = AttemptLog("webhooks", keep_days=7, table=table), AttemptLog("webhooks", keep_days=7, table=table)
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        assert first.due(idle=True)  # nothing buffered, but the minute's upkeep is due
        first.flush(connection, now=now)
        add_webhooks(admin.engine, 10, status="pending", next_attempt_at=now - timedelta(minutes=1))
        second.flush(connection, now=now)  # another drainer in the same minute: already sampled
        assert not first.due(idle=True)

    (minute,) = minutes_of(admin.engine)
    assert (minute["pending"], minute["due"], minute["oldest_due_seconds"]) == (6, 4, 300.0)


def test_the_overview_page_draws_four_svg_charts_per_outbox_without_script(admin, receiver):
    add_webhooks(admin.engine, 2, status="pending", attempts=0, error=None, status_code=None, target_url=receiver.url + "/hook")
    admin.kit.drain_once("webhooks")
    page = admin.client.get("/admin/").text

    charts = page[page.index('id="charts-webhooks"'):page.index("</section>", page.index('id="charts-webhooks"'))]
    assert page.count('<svg class="chart ') == 8
    assert charts.count("<rect x=") == 1  # one minute with deliveries; no failures (hover columns are class="hit")
    assert "Delivered: 2 in 1 h, 2 in the last minute" in charts
    assert "<title>webhooks: deliveries per minute over the last 1 h</title>" in charts
    assert "<script" not in charts


def test_auto_refresh_is_optional_and_can_be_switched_off(admin):
    plain = admin.client.get("/admin/").text
    refreshing = admin.client.get("/admin/", params={"refresh": "15"}).text
    assert 'http-equiv="refresh"' not in plain and 'href="/admin/?refresh=15"' in plain
    assert '<meta http-equiv="refresh" content="15">' in refreshing and "Stop auto-refresh" in refreshing
    assert admin.client.get("/admin/", params={"refresh": "1"}).status_code == 422
    assert admin.client.get("/admin/", params={"refresh": "x"}).status_code == 422


def test_the_api_returns_the_chart_window_in_buckets_summing_counts_and_keeping_peaks(admin):
    with admin.engine.begin() as connection:
        for minutes_ago, delivered, due in ((90, 5, 10), (95, 7, 30), (20 * 60, 1, 2)):
            connection.execute(
                text(
                    "INSERT INTO outboxkit_outbox_minutes (outbox, minute, delivered, failed, stuck, due) "
                    "VALUES ('webhooks', :minute, :delivered, 0, 0, :due)"
                ),
                {"minute": START - timedelta(minutes=minutes_ago), "delivered": delivered, "due": due},
            )
    hour = admin.client.get("/admin/api/outboxes", params={"charts": "true"}).json()["outboxes"][1]
    day = admin.client.get("/admin/api/outboxes", params={"charts": "true", "window": "24h"}).json()["outboxes"][1]
    week = admin.client.get("/admin/api/outboxes", params={"charts": "true", "window": "7d"}).json()["outboxes"][1]
    assert hour["chart"]["buckets"] == hour["last_hour"] and sum(b["delivered"] for b in hour["last_hour"]) == 0
    assert (day["chart"]["window"], day["chart"]["bucket_seconds"], len(day["chart"]["buckets"])) == ("24h", 900, 96)
    assert day["last_hour"] is None
    busy = [bucket for bucket in day["chart"]["buckets"] if bucket["delivered"]]
    assert [(bucket["delivered"], bucket["due"]) for bucket in busy] == [(1, 2), (12, 30)]  # 90 and 95 min ago: one bucket
    assert (len(week["chart"]["buckets"]), sum(bucket["delivered"] for bucket in week["chart"]["buckets"])) == (84, 13)
    assert admin.client.get("/admin/api/outboxes", params={"charts": "true", "window": "1y"}).status_code == 422
