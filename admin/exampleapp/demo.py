"""The demo: the example service on a real (embedded) PostgreSQL, end to end.

``outboxkit demo`` runs this.  It

1. uses ``DATABASE_URL`` or starts an embedded PostgreSQL in
   ``~/.cache/outboxkit/demo-pgdata`` (kept for the next run);
2. runs the migrations (``alembic upgrade heads``);
3. starts the unreliable receiver and the example service under uvicorn
   with two workers, so the leader election is real;
4. seeds grants (each with its outbox row, in one transaction) and keeps a
   trickle going;
5. prints the admin URL with generated credentials, and a line per notable
   event, until Ctrl-C, which stops every process it started.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from exampleapp.database import create_example_engine, psycopg_url
from exampleapp.models import CreditGrantOutbox, Grant, WebhookOutbox

ADMIN_FOLDER = Path(__file__).resolve().parents[1]
REPOSITORY = ADMIN_FOLDER.parent
ALEMBIC_INI = REPOSITORY / "alembic" / "alembic.ini"
WORKSPACES = ("acme", "globex", "initech", "umbrella", "hooli", "stark")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def migrate(database_url: str) -> None:
    from alembic.config import Config

    from alembic import command

    config = Config(str(ALEMBIC_INI))
    config.cmd_opts = argparse.Namespace(x=[f"url={psycopg_url(database_url)}"])
    config.attributes["configure_logging"] = False
    command.upgrade(config, "heads")


def create_grant(session: Session, workspace: str, amount: int) -> None:
    """The application's business change and its outbox row, in the caller's transaction."""
    grant = Grant(workspace=workspace, amount=amount)
    session.add(grant)
    session.flush()
    session.add(CreditGrantOutbox(grant_id=grant.id, workspace=workspace, amount=amount))


def seed(engine: Engine, count: int, *, progress: Callable[[int, int], None]) -> None:
    for number in range(1, count + 1):
        with Session(engine) as session, session.begin():
            create_grant(session, WORKSPACES[number % len(WORKSPACES)], 10 * (number % 50 + 1))
        progress(number, count)


def progress_bar(done: int, total: int) -> None:
    """A bar redrawn in place on a terminal; into a file or a pipe, a plain line at each quarter instead.

    Carriage-return frames only make sense on a terminal: in a log they pile up as one unreadable line.
    """
    width = 30
    filled = width * done // total
    if sys.stdout.isatty():
        end = "\n" if done == total else ""
        print(f"\r[demo] seeding grants {done:>5}/{total} |{'#' * filled}{'.' * (width - filled)}|", end=end, flush=True)
    elif done == total or 4 * done // total != 4 * (done - 1) // total:
        print(f"[demo] seeding grants {done}/{total}", flush=True)


class Watcher:
    """Polls the database and prints what changed: leader, deliveries, stuck rows."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.leader: str | None = None
        self.counts: dict[tuple[str, str], int] = {}

    def poll(self) -> None:
        with self.engine.connect() as connection:
            leader = connection.execute(text(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND a.application_name LIKE 'outboxkit-leader:%'"
            )).scalar()
            counts = {}
            for outbox in (CreditGrantOutbox, WebhookOutbox):
                name = outbox.__outbox__.job_name
                for status, number in connection.execute(
                    select(outbox.status, func.count()).group_by(outbox.status)
                ):
                    counts[(name, status)] = number
        if leader != self.leader:
            say(f"leader: {leader.split(':', 1)[1] if leader else 'none (election in progress)'}")
            self.leader = leader
        for (name, status), number in sorted(counts.items()):
            before = self.counts.get((name, status), 0)
            if status in ("done", "stuck") and number > before:
                verb = "delivered" if status == "done" else "stuck"
                say(f"{name}: {number - before} {verb} (total {verb}: {number})")
        self.counts = counts


def start_process(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    handle = log.open("ab")
    return subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)


def stop_process(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the process group we started, then SIGKILL what is left after the grace period."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def wait_for_http(url: str, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout:g}s")


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def interrupt(*_: object) -> None:
        # Installed explicitly: a shell that starts the demo in the background
        # hands it SIGINT ignored, and Ctrl-C or SIGTERM must still clean up.
        stop.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    embedded = None
    processes: list[subprocess.Popen[bytes]] = []
    database_url = args.database_url or os.environ.get("DATABASE_URL")
    try:
        if not database_url:
            from outboxkit.storage.embedded import EmbeddedPostgres, default_data_dir

            data_dir = default_data_dir("demo-pgdata")
            say(f"starting an embedded PostgreSQL in {data_dir}")
            embedded = EmbeddedPostgres(data_dir)
            database_url = embedded.start()
        say("running migrations (alembic upgrade heads)")
        migrate(database_url)
        engine = create_example_engine(database_url, pool_size=2)

        logs = Path(args.log_dir) if args.log_dir else Path.cwd() / ".demo-logs"
        logs.mkdir(parents=True, exist_ok=True)
        port = args.port or free_port()
        receiver_port = args.receiver_port or free_port()
        token = args.admin_token or secrets.token_urlsafe(16)
        env = {
            **os.environ,
            "DATABASE_URL": psycopg_url(database_url),
            "EXAMPLE_RECEIVER_URL": f"http://127.0.0.1:{receiver_port}",
            "EXAMPLE_ADMIN_PASSWORD": token,
            # The demo runs on one machine, often against an embedded PostgreSQL: fail open
            # (a failed election still drains) rather than the service's own production default.
            "OUTBOXKIT_ENVIRONMENT": "development",
            # Retries come due within seconds in the demo; NOTIFY wakes the drain for new rows.
            "OUTBOXKIT_DRAIN_INTERVAL_SECONDS": os.environ.get("OUTBOXKIT_DRAIN_INTERVAL_SECONDS", "5"),
            "PYTHONPATH": os.pathsep.join([str(ADMIN_FOLDER), str(REPOSITORY), os.environ.get("PYTHONPATH", "")]),
        }
        env.update(args.extra_env or {})
        say(f"starting the receiver on 127.0.0.1:{receiver_port} (logs: {logs / 'receiver.log'})")
        processes.append(start_process(
            [sys.executable, "-m", "exampleapp.receiver", "--port", str(receiver_port), "--reject", str(args.reject),
             "--fail", str(args.fail), "--hang", str(args.hang)], env, logs / "receiver.log"))
        say(f"receiver pid {processes[-1].pid}")
        say(f"starting the example service with {args.workers} workers on 127.0.0.1:{port} (logs: {logs / 'app.log'})")
        processes.append(start_process(
            [sys.executable, "-m", "uvicorn", "exampleapp.app:app", "--host", "127.0.0.1", "--port", str(port),
             "--workers", str(args.workers)], env, logs / "app.log"))
        say(f"service pid {processes[-1].pid}")
        wait_for_http(f"http://127.0.0.1:{port}/health")
        say(f"admin: http://127.0.0.1:{port}/admin/  (user: admin, password: {token})")

        seed(engine, args.seed, progress=progress_bar)
        watcher = Watcher(engine)
        started = time.monotonic()
        next_trickle = started
        while not stop.is_set():
            if args.duration and time.monotonic() - started >= args.duration:
                break
            if args.trickle and time.monotonic() >= next_trickle:
                with Session(engine) as session, session.begin():
                    create_grant(session, WORKSPACES[int(time.time()) % len(WORKSPACES)], 25)
                next_trickle = time.monotonic() + 1.0 / args.trickle
            watcher.poll()
            stop.wait(1.0)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        # A second Ctrl-C must not cut the clean-up short and leave processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        say("stopping")
        for process in reversed(processes):
            stop_process(process)
        if embedded is not None:
            embedded.stop()
        say("stopped; every process the demo started has exited")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="outboxkit demo", description="Run the example service end to end.")
    parser.add_argument("--database-url", help="PostgreSQL URL (default: $DATABASE_URL, else an embedded server)")
    parser.add_argument("--port", type=int, default=8000, help="the service's port (0: a free one)")
    parser.add_argument("--receiver-port", type=int, default=8765, help="the receiver's port (0: a free one)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=150, help="grants to create at start")
    parser.add_argument("--trickle", type=float, default=0.5, help="grants per second after seeding (0: none)")
    parser.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: until Ctrl-C)")
    parser.add_argument("--reject", type=float, default=0.08, help="share of requests the receiver rejects (400)")
    parser.add_argument("--fail", type=float, default=0.12, help="share it answers with 503")
    parser.add_argument("--hang", type=float, default=0.02, help="share it hangs on past the timeout")
    parser.add_argument("--admin-token", help="the admin password (default: generated)")
    parser.add_argument("--log-dir", help="where the service and receiver logs go (default: ./.demo-logs)")
    args = parser.parse_args(argv)
    args.extra_env = {}
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
