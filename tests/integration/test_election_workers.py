"""The election in the example app: through the FastAPI lifespan, and across real uvicorn workers."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
from exampleapp.app import create_app
from fastapi.testclient import TestClient

from outboxkit import OutboxKitSettings
from outboxkit.leader.election import lock_holders
from outboxkit.leader.scheduler import OutboxScheduler
from tests.support.leadership import holder_count, wait_until

ROOT = Path(__file__).resolve().parents[2]
FAST = {"leader_tick_seconds": 0.3, "standby_probe_seconds": 0.5}


def test_lifespan_elects_on_startup_and_releases_on_shutdown(engine, database_url):
    app = create_app(database_url, settings=OutboxKitSettings(**FAST))
    with TestClient(app) as client:
        wait_until(lambda: client.get("/health").json()["election"] == "leader", message="leadership")
        assert holder_count(engine) == 1
        assert client.post("/grants", json={"workspace": "w1", "amount": 5}).status_code == 201
    assert holder_count(engine) == 0
    assert not app.state.kit.scheduler.running


def test_scheduler_failure_is_logged_and_never_blocks_the_api(database_url, monkeypatch, caplog):
    def refuse(self, **overrides):
        raise RuntimeError("scheduler misconfigured")

    monkeypatch.setattr(OutboxScheduler, "elect", refuse)
    app = create_app(database_url, settings=OutboxKitSettings(**FAST))
    with caplog.at_level(logging.ERROR, logger="outboxkit"), TestClient(app) as client:
        assert client.get("/health").json() == {"status": "ok", "election": "off"}
    assert "the scheduler could not start; the API starts without it" in caplog.text


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class HolderSampler(threading.Thread):
    """Counts lock holders every 100 ms until stopped; remembers the largest count it saw."""

    def __init__(self, engine) -> None:
        super().__init__(daemon=True)
        self.engine = engine
        self.most = 0
        self.samples = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        with self.engine.connect() as connection:
            while not self.stopping.wait(0.1):
                self.most = max(self.most, len(lock_holders(connection)))
                connection.rollback()  # a fresh snapshot of pg_locks each time
                self.samples += 1


def test_two_uvicorn_workers_elect_one_leader_and_fail_over_after_kill_9(engine, database_url, tmp_path):
    log_path = tmp_path / "uvicorn.log"
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'admin'}",
        "DATABASE_URL": database_url,
        "OUTBOXKIT_ENVIRONMENT": "test",
        "OUTBOXKIT_LEADER_TICK_SECONDS": str(FAST["leader_tick_seconds"]),
        "OUTBOXKIT_STANDBY_PROBE_SECONDS": str(FAST["standby_probe_seconds"]),
    }
    command = [sys.executable, "-m", "uvicorn", "exampleapp.app:app", "--workers", "2"]
    command += ["--host", "127.0.0.1", "--port", str(_free_port()), "--log-level", "warning"]
    sampler = HolderSampler(engine)
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    supervisor = psutil.Process(server.pid)
    try:

        def log_count(text: str) -> int:
            return log_path.read_text(errors="replace").count(text)

        wait_until(
            lambda: log_count("acquired leadership") and log_count("standby: another process holds the leader lock"),
            timeout=60,
            message="one worker leading and one standing by",
        )
        assert log_count("acquired leadership") == 1
        assert log_count("standby: another process holds the leader lock") == 1
        sampler.start()
        wait_until(lambda: sampler.samples >= 2, message="the sampler seeing the first leader")
        [leader] = _holders(engine)
        workers = {child.pid for child in supervisor.children(recursive=True)}
        assert leader.pid in workers, "the holder is not one of our uvicorn workers"
        os.kill(leader.pid, signal.SIGKILL)
        # A new holder within a few probe intervals, not the 60 s + 15 s of the defaults.
        wait_until(
            lambda: [holder.pid for holder in _holders(engine)] not in ([], [leader.pid]),
            timeout=10,
            message="a new leader",
        )
        wait_until(lambda: log_count("acquired leadership") == 2, timeout=10, message="the new leader's log line")
        after_failover = sampler.samples
        wait_until(lambda: sampler.samples >= after_failover + 3, message="samples under the new leader")
        sampler.stopping.set()
        sampler.join()
        assert sampler.samples > 0 and sampler.most == 1
    finally:
        sampler.stopping.set()
        _stop(server, supervisor)


def _holders(engine):
    with engine.connect() as connection:
        return lock_holders(connection)


def _stop(server: subprocess.Popen, supervisor: psutil.Process) -> None:
    try:
        children = supervisor.children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    server.send_signal(signal.SIGINT)
    try:
        server.wait(15)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    for child in children:  # only the workers this test's uvicorn started
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
