"""Run the fault suite and print its reliability table.

::

    .venv/bin/python bench/faults_report.py            # the CI variants
    .venv/bin/python bench/faults_report.py --long      # the long (slow) variants
    .venv/bin/python bench/faults_report.py --seed 7    # another seed

It runs ``pytest tests/faults`` in a subprocess (its output goes to stderr),
collects the figures each scenario publishes, and prints a Markdown table
(the one in docs/reliability.md).  The last line of stdout is one JSON object:
per scenario, ``rows``, ``lost``, ``duplicates`` and ``faults``.  The exit
status is pytest's, or 1 if any scenario lost a row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.faults.figures import REPORT_DIR_VARIABLE, load_figures, render_details, render_table, summary  # noqa: E402
from tests.faults.scenario import DEFAULT_SEED, SEED_VARIABLE  # noqa: E402


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
    print(json.dumps(summary(figures), sort_keys=True))
    if any(figure.lost for figure in figures):
        return 1
    return completed.returncode


if __name__ == "__main__":
    sys.exit(main())
