"""Run the fault suite and print its reliability table.

::

    .venv/bin/python bench/faults_report.py            # the CI variants
    .venv/bin/python bench/faults_report.py --long      # the long (slow) variants
    .venv/bin/python bench/faults_report.py --seed 7    # another seed

It runs ``pytest tests/faults`` in a subprocess (its output goes to stderr),
collects the figures each scenario publishes, and prints a Markdown table
(the one in docs/reliability.md).  The last line of stdout is one JSON object:
per scenario, ``rows``, ``lost``, ``duplicates`` and ``faults``, plus, for the
scenarios that run the scheduler (3 and 5), ``max_holders``,
``failover_p50``, ``failover_max`` and ``two_believer_window`` (seconds).
The exit status is pytest's, or 1 if any scenario lost a row or ever saw two
holders of the leader key.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.faults.figures import (  # noqa: E402
    REPORT_DIR_VARIABLE,
    ScenarioFigures,
    load_figures,
    render_details,
    render_table,
    summary,
)
from tests.faults.scenario import DEFAULT_SEED, SEED_VARIABLE  # noqa: E402

ELECTION_FIGURES = ("max_holders", "failover_p50", "failover_max", "two_believer_window")


def election_summary(figures: list[ScenarioFigures]) -> dict[str, dict[str, Any]]:
    """``summary`` with the election figures added for the scenarios that have them."""
    result = summary(figures)
    for figure in figures:
        if figure.max_holders is not None:
            key = figure.scenario if figure.variant == "ci" else f"{figure.scenario}-{figure.variant}"
            result[key].update({name: getattr(figure, name) for name in ELECTION_FIGURES})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help="run the long variants (marked slow) instead of the CI ones")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"random seed (default {DEFAULT_SEED})")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, e.g. -k soak")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="outboxkit-faults-") as directory:
        environment = {**os.environ, REPORT_DIR_VARIABLE: directory, SEED_VARIABLE: str(args.seed)}
        command = [
            sys.executable, "-m", "pytest", "tests/faults", "-q", "-p", "no:cacheprovider",
            "-m", "slow" if args.long else "not slow", *args.pytest_args,
        ]  # fmt: skip
        print(f"running: {' '.join(command)} (seed {args.seed})", file=sys.stderr)
        completed = subprocess.run(command, cwd=REPO_ROOT, env=environment, stdout=sys.stderr, check=False)
        figures = load_figures(Path(directory))

    if not figures:
        print("no scenario published figures", file=sys.stderr)
        return completed.returncode or 1
    print(render_table(figures))
    print()
    print(render_details(figures))
    print()
    print(f"reproduce: {SEED_VARIABLE}={args.seed} .venv/bin/python bench/faults_report.py{' --long' if args.long else ''}")
    print(json.dumps(election_summary(figures), sort_keys=True))
    if any(figure.lost or (figure.max_holders or 0) > 1 for figure in figures):
        return 1
    return completed.returncode


if __name__ == "__main__":
    sys.exit(main())
