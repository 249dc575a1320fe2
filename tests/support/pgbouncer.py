"""A real PgBouncer for the tests, started from a scratch folder on a free port and stopped by pid.

``PgBouncer(server_url, pool_mode="transaction", pool_size=1)`` writes a
configuration that points every database at the test server's host and
port, starts ``pgbouncer`` in the foreground as a child process and waits
until it answers.  PgBouncer refuses to run as root, so under root it runs
as ``nobody`` through ``setpriv`` (util-linux); the scratch folder is made
writable for it.  ``url(database)`` is the libpq URL of a database through
it; ``stop()`` ends exactly the process it started.

Debian's package (``apt-get install pgbouncer``) is what CI installs; the
binary is looked up on PATH and in /usr/sbin.  Without it
``require_pgbouncer()`` skips the test with the reason (fails it when
``OUTBOXKIT_TEST_REQUIRE_PGBOUNCER`` is set, as CI does).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

__all__ = ["PgBouncer", "pgbouncer_binary", "require_pgbouncer", "transaction_and_session_pools"]

STARTUP_TIMEOUT_SECONDS = 20.0
# Set by .ci/run: there a missing pgbouncer is a failure, not a skip.
REQUIRED_VARIABLE = "OUTBOXKIT_TEST_REQUIRE_PGBOUNCER"


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")


def require_pgbouncer() -> str:
    """The pgbouncer binary, or skip the test saying how to get it."""
    binary = pgbouncer_binary()
    missing = None
    if binary is None:
        missing = "pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)"
    elif os.geteuid() == 0 and shutil.which("setpriv") is None:
        missing = "running as root, and setpriv (util-linux) is missing to run pgbouncer as nobody"
    if missing is not None:
        if os.environ.get(REQUIRED_VARIABLE):
            pytest.fail(f"{missing}, and {REQUIRED_VARIABLE} is set (CI)")
        pytest.skip(missing)
    assert binary is not None
    return binary


def _others_can_enter(folder: Path) -> bool:
    """Whether a user other than the owner can reach ``folder`` (every folder on the way lets others pass)."""
    return all(part.stat().st_mode & 0o001 for part in (folder, *folder.parents))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgBouncer:
    """One pgbouncer process in front of the test server."""

    def __init__(self, server_url: str, *, pool_mode: str, pool_size: int) -> None:
        self.binary = require_pgbouncer()
        self.server = make_url(server_url)
        if os.geteuid() == 0 and self.server_host.startswith("/") and not _others_can_enter(Path(self.server_host)):
            # The embedded server listens on a socket in root's cache folder, which pgbouncer, run as nobody,
            # cannot enter.  The pooler tests need a server it can reach; CI runs them against 127.0.0.1:5432.
            pytest.skip(f"pgbouncer (as nobody) cannot reach the server's socket folder {self.server_host}")
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.port = _free_port()
        self.scratch = Path(tempfile.mkdtemp(prefix=f"outboxkit-pgbouncer-{pool_mode}-"))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PgBouncer:
        user = self.server.username or "root"
        (self.scratch / "userlist.txt").write_text(f'"{user}" ""\n')
        config = self.scratch / "pgbouncer.ini"
        config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={self.server_host} port={self.server.port or 5432}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.scratch / 'userlist.txt'}",
                    f"pool_mode = {self.pool_mode}",
                    f"default_pool_size = {self.pool_size}",
                    "min_pool_size = 0",
                    "reserve_pool_size = 0",
                    "max_client_conn = 500",
                    "max_db_connections = 0",
                    # psycopg sends none of these by default; tolerated so a URL option does not break the tests.
                    "ignore_startup_parameters = extra_float_digits,options",
                    f"logfile = {self.scratch / 'pgbouncer.log'}",
                    "",
                ]
            )
        )
        command = [self.binary, str(config)]
        if os.geteuid() == 0:  # pgbouncer will not run as root
            os.chmod(self.scratch, 0o777)
            for path in self.scratch.iterdir():
                os.chmod(path, 0o644)
            command = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while True:
            try:
                with psycopg.connect(self.url(self.server.database or "postgres"), connect_timeout=2) as connection:
                    connection.execute("SELECT 1")
                return self
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not start: {self.log()}") from None
                time.sleep(0.05)

    @property
    def server_host(self) -> str:
        """The server's host, or its socket folder (the embedded server's URL names it as ``?host=``)."""
        host = self.server.host or self.server.query.get("host") or "127.0.0.1"
        return host if isinstance(host, str) else host[0]

    def url(self, database: str) -> str:
        """The libpq URL of ``database`` through this pgbouncer."""
        query = {key: value for key, value in self.server.query.items() if key != "host"}
        through = self.server.set(host="127.0.0.1", port=self.port, database=database, query=query)
        return through.render_as_string(hide_password=False)

    def url_for(self, database_url: str) -> str:
        """The same database as ``database_url`` (a direct URL), through this pgbouncer."""
        return self.url(make_url(database_url).database or "postgres")

    def log(self) -> str:
        path = self.scratch / "pgbouncer.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()  # SIGTERM to the pid we started (setpriv execs pgbouncer in place)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if process is not None and process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextmanager
def transaction_and_session_pools(server_url: str, *, transaction_size: int, session_size: int) -> Iterator[dict[str, PgBouncer]]:
    """Two pgbouncers in front of the server, ``{"transaction": ..., "session": ...}``, stopped on exit."""
    transaction = PgBouncer(server_url, pool_mode="transaction", pool_size=transaction_size)
    session = PgBouncer(server_url, pool_mode="session", pool_size=session_size)
    try:
        yield {"transaction": transaction.start(), "session": session.start()}
    finally:
        transaction.stop()
        session.stop()
