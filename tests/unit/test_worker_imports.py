"""A drainer imports only what it drains with: not the CLI's tables and colours, not httpx's own command line."""

from __future__ import annotations

import json
import subprocess
import sys

# Imported by rich (the CLI's tables), pygments (rich's syntax colours) and click (httpx's command line).
NOT_NEEDED_TO_DRAIN = ("rich", "pygments", "click")


def modules_after(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; it leaves a ``result`` dict, printed back as JSON."""
    finished = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json; print(json.dumps(result))"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(finished.stdout.splitlines()[-1])


def test_the_worker_command_imports_no_output_library_and_not_httpx_command_line():
    result = modules_after(
        "import sys\n"
        "import outboxkit, outboxkit.cli, outboxkit.drain.worker, outboxkit.metrics, outboxkit.transports.http\n"
        f"result = {{name: name in sys.modules for name in {NOT_NEEDED_TO_DRAIN!r}}}\n"
        "result['httpx'] = 'httpx' in sys.modules"
    )
    assert result == {"rich": False, "pygments": False, "click": False, "httpx": True}


def test_httpx_command_line_stays_importable_after_outboxkit():
    result = modules_after(
        "import outboxkit\n"
        "import httpx._main\n"  # the absent mark was removed: the real module loads on request
        "result = {'main': type(httpx._main.main).__name__, 'rich': __import__('sys').modules.get('rich') is not None}"
    )
    assert result == {"main": "Command", "rich": True}  # httpx's click command


def test_an_application_that_imported_httpx_first_keeps_it_whole():
    result = modules_after("import httpx\nimport outboxkit\nresult = {'main': type(httpx.main).__name__}")
    assert result == {"main": "Command"}  # httpx's click command, not the stub of a missing CLI


def test_the_cli_still_prints_tables_and_errors_with_rich():
    finished = subprocess.run(
        [sys.executable, "-m", "outboxkit.cli", "--app", "no_such_module:kit", "status"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert finished.returncode == 1
    assert finished.stderr.startswith("outboxkit: ") and "no_such_module" in finished.stderr


def test_a_drainer_loads_neither_the_scheduler_nor_the_election_until_asked():
    result = modules_after(
        "import sys\n"
        "from sqlalchemy import create_engine\n"
        "import outboxkit, outboxkit.cli, outboxkit.drain.worker\n"
        "from tests.support.models import SampleEvent\n"
        "kit = outboxkit.OutboxKit(create_engine('postgresql+psycopg://nobody@127.0.0.1:9/none'), [SampleEvent])\n"
        "kit.drainer(SampleEvent), kit.worker\n"
        "names = ('outboxkit.leader.scheduler', 'outboxkit.leader.election', 'apscheduler.schedulers.background')\n"
        "result = {name: name in sys.modules for name in names}\n"
        "kit.scheduler\n"
        "result['after'] = all(name in sys.modules for name in names)"
    )
    assert result == {
        "outboxkit.leader.scheduler": False, "outboxkit.leader.election": False, "apscheduler.schedulers.background": False,
        "after": True,
    }
