"""The ready-made alert rules (docs/alerts.yml) and dashboard (docs/grafana-dashboard.json).

Always: the rules parse and cover the alerts docs/operations.md promises
(tests/integration/test_alert_rules.py checks every metric name they use
against a live ``OutboxMetrics`` registry).  With ``promtool`` on the PATH (or
in ``$PROMTOOL``): ``promtool check rules`` and a ``promtool test rules``
unit test that feeds each alert series which must fire it and series which
must not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DOCS = Path(__file__).resolve().parents[2] / "docs"
RULES_FILE = DOCS / "alerts.yml"
DASHBOARD_FILE = DOCS / "grafana-dashboard.json"
PROMISED = {
    "OutboxkitDeliveryLagging", "OutboxkitStuckRowsGrowing", "OutboxkitNoLeader", "OutboxkitDeliveryFailureRatio",
    "OutboxkitOutboxPaused", "OutboxkitJobErrors", "OutboxkitDestinationOpen", "OutboxkitDestinationDisabled",
    "OutboxkitInboxDuplicatesRising",
}


def rules() -> dict[str, dict]:
    [group] = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return {rule["alert"]: rule for rule in group["rules"]}


def test_the_rules_cover_the_promised_alerts_and_each_says_how_bad_and_why():
    found = rules()
    assert PROMISED <= set(found)
    for name, rule in found.items():
        assert rule["expr"].strip() and rule["for"], name
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def promtool() -> str | None:
    return os.environ.get("PROMTOOL") or shutil.which("promtool")


def unit_tests() -> dict:
    """Series that must fire each alert (and series beside them that must not), one minute apart."""
    description = {name: rule["annotations"]["description"] for name, rule in rules().items()}

    def fired(name: str, summary: str, **labels: str) -> dict:
        severity = rules()[name]["labels"]["severity"]
        return {
            "exp_labels": {"severity": severity, **labels},
            "exp_annotations": {"summary": summary, "description": description[name]},
        }

    def series(name: str, values: str, **labels: str) -> dict:
        rendered = ",".join(f'{key}="{value}"' for key, value in {**labels, "instance": "app-1"}.items())
        return {"series": f"{name}{{{rendered}}}", "values": values}

    return {
        "rule_files": [str(RULES_FILE)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series("outboxkit_oldest_due_age_seconds", "0 0 400x10", outbox="grants"),
                    series("outboxkit_oldest_due_age_seconds", "0x12", outbox="healthy"),
                    series("outboxkit_oldest_due_age_seconds", "0 0 400x40", outbox="paused"),
                    series("outboxkit_outbox_paused", "0x40", outbox="grants"),
                    series("outboxkit_outbox_paused", "1x40", outbox="paused"),
                    series("outboxkit_job_runs_total", "0x5 1x20", job="billing.invoices", outcome="error"),
                    series("outboxkit_job_runs_total", "0+1x25", job="billing.invoices", outcome="ok"),
                    series("outboxkit_job_runs_total", "0x25", job="reports.daily", outcome="error"),
                    series("outboxkit_stuck_rows", "0x40 3x20", outbox="grants"),
                    series("outboxkit_stuck_rows", "2x60", outbox="healthy"),
                    series("outboxkit_leader", "1x5 0x20"),
                    series("outboxkit_attempts_total", "0+60x40", outbox="grants", outcome="delivered", status_class="2xx"),
                    series("outboxkit_attempts_total", "0+60x40", outbox="grants", outcome="retried", status_class="5xx"),
                    series("outboxkit_attempts_total", "0+60x40", outbox="healthy", outcome="delivered", status_class="2xx"),
                    series("outboxkit_drain_errors_total", "0+1x30", outbox="grants"),
                    series("outboxkit_drain_errors_total", "0x30", outbox="healthy"),
                    series("outboxkit_row_gauges_refreshed_timestamp_seconds", "0+60x5 300x30"),
                    series("outboxkit_destination_open_seconds", "0 0 60+60x30", outbox="grants", destination="https://a:443"),
                    series("outboxkit_destination_open_seconds", "0x30", outbox="grants", destination="https://b:443"),
                    series("outboxkit_destination_state", "0x5 1x20", outbox="grants", destination="https://c:443",
                           state="disabled"),
                    series("outboxkit_destination_state", "0x25", outbox="grants", destination="https://b:443",
                           state="disabled"),
                    # half of billing's messages are duplicates; one in 61 of shipping's
                    series("outboxkit_inbox_messages_total", "0+60x40", source="billing", outcome="handled"),
                    series("outboxkit_inbox_messages_total", "0+60x40", source="billing", outcome="duplicate"),
                    series("outboxkit_inbox_messages_total", "0+60x40", source="shipping", outcome="handled"),
                    series("outboxkit_inbox_messages_total", "0+1x40", source="shipping", outcome="duplicate"),
                ],
                "alert_rule_test": [
                    {"eval_time": "1m", "alertname": "OutboxkitDeliveryLagging", "exp_alerts": []},
                    {
                        "eval_time": "6m",
                        "alertname": "OutboxkitDeliveryLagging",
                        "exp_alerts": [
                            fired("OutboxkitDeliveryLagging", "outbox grants: a due row has waited 6m 40s", outbox="grants")
                        ],
                    },
                    {"eval_time": "20m", "alertname": "OutboxkitOutboxPaused", "exp_alerts": []},
                    {
                        "eval_time": "35m",
                        "alertname": "OutboxkitOutboxPaused",
                        "exp_alerts": [
                            fired(
                                "OutboxkitOutboxPaused", "outbox paused: drains have been paused for over 30 minutes",
                                outbox="paused",
                            )
                        ],
                    },
                    {"eval_time": "5m", "alertname": "OutboxkitJobErrors", "exp_alerts": []},
                    {
                        "eval_time": "9m",
                        "alertname": "OutboxkitJobErrors",
                        "exp_alerts": [
                            fired("OutboxkitJobErrors", "job billing.invoices: a run failed in the last 15 minutes",
                                  job="billing.invoices")
                        ],
                    },
                    {"eval_time": "35m", "alertname": "OutboxkitStuckRowsGrowing", "exp_alerts": []},
                    {
                        "eval_time": "50m",
                        "alertname": "OutboxkitStuckRowsGrowing",
                        "exp_alerts": [
                            fired(
                                "OutboxkitStuckRowsGrowing",
                                "outbox grants: 3 more stuck row(s) than 30 minutes ago",
                                outbox="grants",
                            )
                        ],
                    },
                    {"eval_time": "5m", "alertname": "OutboxkitNoLeader", "exp_alerts": []},
                    {
                        "eval_time": "10m",
                        "alertname": "OutboxkitNoLeader",
                        "exp_alerts": [
                            fired("OutboxkitNoLeader", "outboxkit: no process has held the leader lock for 2 minutes")
                        ],
                    },
                    {"eval_time": "5m", "alertname": "OutboxkitDeliveryFailureRatio", "exp_alerts": []},
                    {
                        "eval_time": "15m",
                        "alertname": "OutboxkitDeliveryFailureRatio",
                        "exp_alerts": [
                            fired(
                                "OutboxkitDeliveryFailureRatio",
                                "outbox grants: 50% of attempts failed over 10 minutes",
                                outbox="grants",
                            )
                        ],
                    },
                    {
                        "eval_time": "15m",
                        "alertname": "OutboxkitDrainErrors",
                        "exp_alerts": [
                            fired("OutboxkitDrainErrors", "outbox grants: drains keep hitting database errors", outbox="grants")
                        ],
                    },
                    {"eval_time": "15m", "alertname": "OutboxkitDestinationOpen", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "OutboxkitDestinationOpen",
                        "exp_alerts": [
                            fired(
                                "OutboxkitDestinationOpen",
                                "outbox grants: destination https://a:443 has been open for 19m 0s",
                                outbox="grants", destination="https://a:443",
                            )
                        ],
                    },
                    {"eval_time": "8m", "alertname": "OutboxkitDestinationDisabled", "exp_alerts": []},
                    {
                        "eval_time": "12m",
                        "alertname": "OutboxkitDestinationDisabled",
                        "exp_alerts": [
                            fired(
                                "OutboxkitDestinationDisabled", "outbox grants: destination https://c:443 is disabled",
                                outbox="grants", destination="https://c:443",
                            )
                        ],
                    },
                    {"eval_time": "10m", "alertname": "OutboxkitInboxDuplicatesRising", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "OutboxkitInboxDuplicatesRising",
                        "exp_alerts": [
                            fired(
                                "OutboxkitInboxDuplicatesRising",
                                "inbox source billing: 50% of its messages are duplicates",
                                source="billing",
                            )
                        ],
                    },
                    {"eval_time": "8m", "alertname": "OutboxkitRowGaugesStale", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "OutboxkitRowGaugesStale",
                        "exp_alerts": [
                            fired("OutboxkitRowGaugesStale", "outboxkit: the row gauges have not been read for 15m 0s")
                        ],
                    },
                ],
            },
            {
                # No process exports the leader gauge at all (none scraped, or none runs an election).
                "interval": "1m",
                "input_series": [series("outboxkit_stuck_rows", "0x10", outbox="grants")],
                "alert_rule_test": [
                    {
                        "eval_time": "3m",
                        "alertname": "OutboxkitNoLeader",
                        "exp_alerts": [
                            fired("OutboxkitNoLeader", "outboxkit: no process has held the leader lock for 2 minutes")
                        ],
                    },
                ],
            },
        ],
    }


@pytest.mark.skipif(promtool() is None, reason="promtool is not installed (the YAML and metric-name checks above still ran)")
def test_promtool_checks_the_rules_and_each_alert_fires_on_its_series_only(tmp_path):
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", str(RULES_FILE)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(yaml.safe_dump(unit_tests(), sort_keys=False))
    tested = subprocess.run([tool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120)
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.skipif(promtool() is None, reason="promtool is not installed")
def test_promtool_parses_every_dashboard_query(tmp_path):
    # Each panel query as a recording rule, Grafana's variables filled in: promtool then checks the PromQL.
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    filled = [expr.replace("$__rate_interval", "5m").replace("$outbox", ".*") for expr in expressions]
    records = [{"record": f"outboxkit:dashboard_query_{index}", "expr": expr} for index, expr in enumerate(filled)]
    rules_file = tmp_path / "dashboard_rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    checked = subprocess.run([promtool(), "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
