"""Smoke test of the demo: real processes, the test server, free ports, a clean stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

from tests.support.database import sqlalchemy_url

ROOT = Path(__file__).resolve().parents[2]


class DemoProcess:
    """``outboxkit demo`` in a subprocess whose output lines are collected as they come."""

    def __init__(self, database_url: str, log_dir: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'admin'}",
            "OUTBOXKIT_DRAIN_INTERVAL_SECONDS": "1",
            "OUTBOXKIT_LEADER_TICK_SECONDS": "0.5",
        }
        command = [
            sys.executable,
            "-m",
            "outboxkit.cli",
            "demo",
            "--database-url",
            database_url,
            "--port",
            "0",
            "--receiver-port",
            "0",
            "--seed",
            "40",
            "--trickle",
            "0",
            "--reject",
            "0.5",
            "--fail",
            "0.1",
            "--hang",
            "0",
            "--log-dir",
            str(log_dir),
        ]
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for_line(self, pattern: str, timeout: float = 90) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if match := re.search(pattern, line):
                        return match
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.process.poll() is not None:
                    raise AssertionError(f"no line matching {pattern!r}; output:\n" + "\n".join(self.lines))
                self._changed.wait(min(remaining, 0.5))


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_demo_serves_the_admin_shows_stuck_rows_resets_one_and_stops_cleanly(database_factory, tmp_path):
    url = database_factory.create_empty()  # the demo runs the migrations itself
    demo = DemoProcess(sqlalchemy_url(url), tmp_path)
    try:
        admin = demo.wait_for_line(r"admin: (http://127\.0\.0\.1:\d+/admin/)  \(user: admin, password: (\S+)\)")
        base, password = admin.group(1), admin.group(2)
        pids = [int(demo.wait_for_line(rf"{name} pid (\d+)").group(1)) for name in ("receiver", "service")]
        client = httpx.Client(base_url=base, auth=("admin", password), timeout=10)
        assert client.get("").status_code == 200  # the overview page
        demo.wait_for_line(r"leader: \S+:\d+")

        stuck = wait_until(
            lambda: client.get("api/outboxes/credit-grants/rows", params={"status": "stuck"}).json()["rows"],
            timeout=90,
            what="stuck rows in the admin",
        )
        row_id = stuck[-1]["id"]
        reset = client.post("api/outboxes/credit-grants/reset", json={"ids": [row_id]})
        assert reset.status_code == 200 and reset.json()["changed"] == 1

        def settled_again():
            row = client.get(f"api/outboxes/credit-grants/rows/{row_id}").json()
            return (
                row
                if row["status"] in ("done", "stuck") and row["attempts"] >= 1 and row["updated_at"] > stuck[-1]["updated_at"]
                else None
            )

        row = wait_until(settled_again, timeout=90, what="the reset row to be delivered or stuck again")
        assert row["status"] in ("done", "stuck")
        client.close()
        # uvicorn's workers too: every process the demo started must be gone after the stop.
        pids += [child.pid for pid in pids for child in psutil.Process(pid).children(recursive=True)]
        assert len(pids) >= 4  # receiver, uvicorn's supervisor and its two workers
    finally:
        demo.process.send_signal(signal.SIGINT)
        code = demo.process.wait(timeout=60)
        database_factory.drop(url)
    assert code == 0, "\n".join(demo.lines)
    assert "stopped; every process the demo started has exited" in demo.lines[-1]
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
