"""The alert rules, the dashboard and docs/operations.md name only metrics a live ``OutboxMetrics`` registry exports.

The rules' own checks (YAML, promised alerts, promtool) are in tests/unit/test_alert_rules.py.
"""

from __future__ import annotations

import json
import re

import pytest

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.metrics import OutboxMetrics
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
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    in_dashboard = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in METRIC_NAME.findall(target["expr"])
    }
    operations = (DOCS / "operations.md").read_text()
    section = operations.split("## Metrics, traces and alerts", 1)[1].split("\n## ", 1)[0]
    in_docs = set(re.findall(r"`(outboxkit_[a-z_]+)`", section))
    assert in_rules and in_dashboard and in_docs
    assert in_rules - exported == set()
    assert in_dashboard - exported == set()
    # The docs' table names each family once: counters with _total, histograms by their base name.
    assert in_docs == {re.sub(r"_(bucket|count|sum)$", "", name) for name in exported}
