"""The figures a fault scenario publishes, and the reliability table built from them.

Each scenario ends by publishing one ``ScenarioFigures``: it is printed, and
written as JSON into ``$OUTBOXKIT_FAULT_REPORT_DIR`` when that is set
(``bench/faults_report.py`` sets it, runs the suite and renders the table).
The columns that belong to the scheduler's election (holder count, failover,
two-believer window) stay ``None`` for drain-only scenarios and render "n/a".
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["REPORT_DIR_VARIABLE", "ScenarioFigures", "load_figures", "render_details", "render_table", "summary"]

REPORT_DIR_VARIABLE = "OUTBOXKIT_FAULT_REPORT_DIR"


@dataclass(frozen=True, kw_only=True)
class ScenarioFigures:
    scenario: str  # stable key, e.g. "kill-soak"
    title: str  # e.g. "1. kill -9 soak"
    variant: str  # "ci" or "long"
    faults: str  # what was injected, in words
    fault_count: int
    rows: int
    lost: int
    duplicates: int
    seed: int
    seconds: float
    command: str
    max_holders: int | None = None
    failover_p50: float | None = None
    failover_max: float | None = None
    two_believer_window: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def publish(self) -> None:
        print(f"fault figures: {json.dumps(asdict(self), default=str)}")
        directory = os.environ.get(REPORT_DIR_VARIABLE)
        if directory:
            path = Path(directory) / f"{self.scenario}-{self.variant}.json"
            path.write_text(json.dumps(asdict(self), default=str, indent=2))


def load_figures(directory: Path) -> list[ScenarioFigures]:
    figures = [ScenarioFigures(**json.loads(path.read_text())) for path in sorted(Path(directory).glob("*.json"))]
    return sorted(figures, key=lambda figure: (figure.title, figure.variant))


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def render_table(figures: list[ScenarioFigures]) -> str:
    """A Markdown table, one line per scenario run."""
    lines = [
        "| scenario | variant | faults injected | rows | lost | duplicates | max holder count "
        "| failover p50 / max | two-believer window | seed | took |",
        "|---|---|---|---:|---:|---:|---|---|---|---:|---:|",
    ]
    for figure in figures:
        failover = (
            "n/a" if figure.failover_p50 is None else f"{_seconds(figure.failover_p50)} / {_seconds(figure.failover_max)}"
        )
        holders = "n/a" if figure.max_holders is None else str(figure.max_holders)
        lines.append(
            f"| {figure.title} | {figure.variant} | {figure.faults} | {figure.rows} | {figure.lost} "
            f"| {figure.duplicates} | {holders} | {failover} | {_seconds(figure.two_believer_window)} "
            f"| {figure.seed} | {figure.seconds:.1f} s |"
        )
    return "\n".join(lines)


def render_details(figures: list[ScenarioFigures]) -> str:
    """One Markdown bullet per scenario run with its scenario-specific counts."""
    lines = []
    for figure in figures:
        counts = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in figure.details.items())
        lines.append(f"- {figure.title} ({figure.variant}): {counts}")
    return "\n".join(lines)


def summary(figures: list[ScenarioFigures]) -> dict[str, dict[str, Any]]:
    """One entry per scenario (variant appended for long runs): rows, lost, duplicates, faults."""
    result: dict[str, dict[str, Any]] = {}
    for figure in figures:
        key = figure.scenario if figure.variant == "ci" else f"{figure.scenario}-{figure.variant}"
        result[key] = {
            "rows": figure.rows,
            "lost": figure.lost,
            "duplicates": figure.duplicates,
            "faults": figure.fault_count,
        }
    return result
