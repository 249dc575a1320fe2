"""The alert rules, the dashboard and docs/operations.md name only metrics a live ``OutboxMetrics`` registry exports.

The rules' own checks (YAML, promised alerts, promtool) are in tests/unit/test_alert_rules.py.
"""

from __future__ import annotations

import json
import re

import pytest

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.metrics.prometheus import OutboxMetrics
from tests.support.models import SampleEvent
from tests.unit.test_alert_rules import DASHBOARD_FILE, DOCS, rules

METRIC_NAME = re.compile(r"\boutboxkit_[a-z_]+\b")


@pytest.fixture
def exported(engine) -> set[str]:
    """Every series name the kit's registry can expose (counters with _total, histograms with their parts)."""
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(listen_enabled=False))
    metrics = OutboxMetrics(kit, refresh_seconds=3600)
    try:
        names = set()
        for family in metrics.registry.collect():
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [""])
            names.update(family.name + suffix for suffix in suffixes)
        return names
    finally:
        metrics.close()
        kit.close()


def test_every_metric_the_rules_the_dashboard_and_the_docs_name_is_exported(exported):
    in_rules = {name for rule in rules().values() for name in METRIC_NAME.findall(rule["expr"])}
    in_dashboard = on_the_dashboard()
    operations = (DOCS / "operations.md").read_text()
    section = operations.split("## Metrics, traces and alerts", 1)[1].split("\n## ", 1)[0]
    in_docs = set(re.findall(r"`(outboxkit_[a-z_]+)`", section))
    assert in_rules and in_dashboard and in_docs
    assert in_rules - exported == set()
    assert in_dashboard - exported == set()
    # The docs' table names each family once: counters with _total, histograms by their base name.
    assert in_docs == {re.sub(r"_(bucket|count|sum)$", "", name) for name in exported}


# Exported but drawn through another panel: failed reads show as the "Row gauges age" panel growing.
NOT_ON_THE_DASHBOARD = {"outboxkit_row_refresh_errors_total"}


def test_the_dashboard_draws_every_metric_the_kit_exports(exported):
    """A new metric (the destination gauges, the held-by-order gauge) gets a panel, or a reason here."""
    families = {re.sub(r"_(bucket|count|sum)$", "", name) for name in exported}
    drawn = {re.sub(r"_(bucket|count|sum)$", "", name) for name in on_the_dashboard()}
    assert families - drawn == NOT_ON_THE_DASHBOARD
    panels = json.loads(DASHBOARD_FILE.read_text())["panels"]
    destination_panels = {panel["title"] for panel in panels if "outboxkit_destination" in json.dumps(panel["targets"])}
    assert destination_panels == {
        "Destinations by state", "Destinations not healthy", "Destination open for", "Rows waiting per destination",
    }
    # No two panels share a cell of Grafana's 24-column grid.
    cells = [
        (panel["id"], (x, y))
        for panel in panels
        for x in range(panel["gridPos"]["x"], panel["gridPos"]["x"] + panel["gridPos"]["w"])
        for y in range(panel["gridPos"]["y"], panel["gridPos"]["y"] + panel["gridPos"]["h"])
    ]
    assert len({cell for _, cell in cells}) == len(cells)
    assert all(0 <= x < 24 for _, (x, _) in cells)
    assert len({panel["id"] for panel in panels}) == len(panels)


def on_the_dashboard() -> set[str]:
    """Every metric name a panel query of docs/grafana-dashboard.json reads."""
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    return {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in METRIC_NAME.findall(target["expr"])
    }
