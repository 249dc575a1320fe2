"""A PostgreSQL cluster of the test's own, which it may kill: the shared server is never touched.

``PrivateServer`` runs ``initdb`` into a temporary folder and ``pg_ctl start``
on a free port of 127.0.0.1 (trust authentication), using the binaries of
the installed PostgreSQL (``/usr/lib/postgresql/<version>/bin``, or
``OUTBOXKIT_FAULT_PG_BIN``).  PostgreSQL refuses to run as root, so as root the
cluster belongs to the ``postgres`` system user and each command runs
through ``runuser``.  ``crash()`` kills the postmaster and every process it
started with SIGKILL, by their pids, as a power cut or an OOM kill would: the
WAL still in shared memory is gone, and ``start()`` again runs crash recovery.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import psutil

__all__ = ["PrivateServer", "postgres_binaries"]

SERVER_USER = "postgres"


def postgres_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``, or None when PostgreSQL is not installed here."""
    configured = os.environ.get("OUTBOXKIT_FAULT_PG_BIN")
    candidates = [configured] if configured else sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateServer:
    """One throwaway cluster; ``url`` is a libpq URL of its ``postgres`` database."""

    def __init__(self, binaries: Path) -> None:
        self.binaries = binaries
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="outboxkit-crash-"))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            account = pwd.getpwnam(SERVER_USER)
            os.chown(self.folder, account.pw_uid, account.pw_gid)
        self.user = SERVER_USER if self._as_root else pwd.getpwuid(os.geteuid()).pw_name
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "--no-sync", "-E", "UTF8")

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def database_url(self, name: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{name}"

    def _run(self, program: str, *arguments: str) -> None:
        command = [str(self.binaries / program), *arguments]
        if self._as_root:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        finished = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.folder)
        if finished.returncode != 0:
            raise RuntimeError(f"{program} failed ({finished.returncode}): {finished.stderr.strip() or finished.stdout.strip()}")

    def start(self) -> None:
        """Start the server (after a crash: recover first) and return once it accepts connections."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=on -c synchronous_commit=on"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "120", "start")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def crash(self) -> None:
        """SIGKILL the postmaster and each of its processes, and wait until every one is gone."""
        postmaster = psutil.Process(self.postmaster_pid())
        processes = [postmaster, *postmaster.children(recursive=True)]
        for process in processes:
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, alive = psutil.wait_procs(processes, timeout=60)
        if alive:
            raise RuntimeError(f"server processes survived SIGKILL: {[process.pid for process in alive]}")

    def stop_immediately(self) -> None:
        """``pg_ctl stop -m immediate``: every process quits without a checkpoint; ``start()`` then recovers."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")

    def stop(self) -> None:
        """A fast shutdown if it runs, then the folder is removed."""
        if (self.data / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
            except RuntimeError:
                self.crash()
        shutil.rmtree(self.folder, ignore_errors=True)
