"""The kit's delivery side: engine, registered outboxes, their drainers, transport, clock and telemetry.

``KitCore`` is everything the runtime above it needs to work with a set of
outbox classes: the effective options (class options overlaid with
settings), one cached ``Drainer`` per outbox, the shared transport and the
dedicated lock/LISTEN connections.  The runtime (``outboxkit.drain.worker``,
``outboxkit.leader.scheduler``, ``outboxkit.leader.retention``, ``outboxkit.integration``)
is built on top of it, and ``outboxkit.kit.OutboxKit`` puts the two
together; nothing here imports the runtime.  Nothing is module-level state,
so two kits (or two tests) can live side by side.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from outboxkit.breaker import BreakerOptions
from outboxkit.clock import Clock, SystemClock
from outboxkit.drain.drainer import Drainer
from outboxkit.errors import ConfigurationError, UnknownOutboxError
from outboxkit.model import Outbox, OutboxOptions
from outboxkit.rate_limits import RateLimit
from outboxkit.results import DrainResult
from outboxkit.settings import OutboxKitSettings
from outboxkit.storage.connections import SessionConnector, session_connector
from outboxkit.storage.database import kit_engine
from outboxkit.storage.drain_pool import DrainDatabase, drain_pool_size
from outboxkit.storage.operator_pool import OperatorDatabase
from outboxkit.storage.pooler_verdict import PoolerVerdict
from outboxkit.telemetry.hooks import Telemetry
from outboxkit.transports.base import Transport
from outboxkit.transports.guarded import GuardedTransport
from outboxkit.transports.http import HttpTransport
from outboxkit.url_guard import UrlGuard

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["KitCore"]


class KitCore:
    """Durable delivery for a set of outbox classes on one PostgreSQL database, without the runtime.

    Applications create ``outboxkit.OutboxKit``, which adds the drain loops,
    the scheduler and the ASGI lifespan to this; the arguments and checks
    are documented there.
    """

    def __init__(
        self,
        engine: Engine | AsyncEngine,
        outboxes: Iterable[type[Outbox]],
        *,
        settings: OutboxKitSettings | None = None,
        clock: Clock | None = None,
        transport: Transport | None = None,
        receive_only: bool = False,
    ) -> None:
        self.settings = settings if settings is not None else OutboxKitSettings.from_environment()
        self.engine = kit_engine(engine, prepared_statements=self.settings.prepared_statements)
        self._derived_engine = self.engine if self.engine is not engine else None  # built here, disposed at close
        self.clock = clock or SystemClock()
        self._own_transport = transport is None
        self._transport = transport
        self._lock = threading.Lock()
        self._outboxes: dict[str, type[Outbox]] = {}
        self._options: dict[str, OutboxOptions] = {}
        for outbox in outboxes:
            self._register(outbox)
        self.is_receive_only = receive_only
        if receive_only and self._outboxes:
            raise ConfigurationError(
                "a receive-only kit has no outboxes; a service that also sends builds OutboxKit(engine, outboxes=[MyOutbox])"
            )
        if not self._outboxes and not receive_only:
            raise ConfigurationError(
                "OutboxKit needs at least one outbox class, e.g. OutboxKit(engine, outboxes=[MyOutbox]); "
                "a service that only receives (the inbox) builds OutboxKit.receive_only(engine)"
            )
        unknown = set(self.settings.outboxes) - {options.settings_key for options in self._options.values()}
        if unknown:
            known = ", ".join(sorted(options.settings_key for options in self._options.values()))
            variables = ", ".join(f"OUTBOXKIT_OUTBOXES__{key.upper()}__*" for key in sorted(unknown))
            raise ConfigurationError(
                f"the settings name unknown outbox(es) {sorted(unknown)} ({variables} or keys of OUTBOXKIT_OUTBOXES); "
                f"registered: {known}. The key is an outbox's job_name with '-' written as '_'"
            )
        self._drainers: dict[str, Drainer] = {}
        self._operator_database: OperatorDatabase | None = None
        self._drain_database: DrainDatabase | None = None
        self.telemetry = Telemetry()  # metrics and tracing attach here (outboxkit.metrics, outboxkit.telemetry.tracing)
        # The one guard of URLs that do not come from code: schedules' HTTP targets at save and at send.
        self.url_guard = UrlGuard(allow=self.settings.allow_list)
        # What the pooler checks decided for this kit: once, and a refusal sticks (outboxkit.drain.pooler_checks).
        self.pooler_verdict = PoolerVerdict()

    def _register(self, outbox: type[Outbox]) -> None:
        if not (isinstance(outbox, type) and issubclass(outbox, Outbox) and hasattr(outbox, "__table__")):
            raise ConfigurationError(f"{outbox!r} is not a mapped Outbox subclass")
        options = outbox.__outbox__
        if options.job_name in self._outboxes:
            other = self._outboxes[options.job_name]
            if other is outbox:
                raise ConfigurationError(f"{outbox.__name__} is listed twice in outboxes")
            raise ConfigurationError(
                f"job_name {options.job_name!r} is used by both {other.__name__} and {outbox.__name__}; job names must be unique"
            )
        for registered in self._options.values():
            if registered.settings_key == options.settings_key:
                raise ConfigurationError(
                    f"job names {registered.job_name!r} and {options.job_name!r} share the settings key "
                    f"{options.settings_key!r} ('-' is read as '_'); rename one of them"
                )
        override = self.settings.outboxes.get(options.settings_key)
        if override is not None:
            try:
                values = override.values()
                rate_limit = values.get("rate_limit")
                if isinstance(rate_limit, dict):  # RATE_LIMIT, checked by the settings
                    values["rate_limit"] = RateLimit(**rate_limit)
                breaker = values.get("breaker")
                if isinstance(breaker, dict):  # BREAKER: the fields given replace the class's
                    changes = {name: value for name, value in breaker.items() if value is not None}
                    values["breaker"] = dataclasses.replace(options.breaker or BreakerOptions(), **changes)
                options = dataclasses.replace(options, **values)  # type: ignore[arg-type]
            except (ConfigurationError, ValueError) as exc:
                raise ConfigurationError(f"OUTBOXKIT_OUTBOXES__{options.settings_key.upper()}: {exc}") from None
        options.check_signing()  # an outbox that signs without a secret fails here, at start-up
        self._outboxes[options.job_name] = outbox
        self._options[options.job_name] = options

    # -- lookup --------------------------------------------------------------

    @property
    def outboxes(self) -> list[type[Outbox]]:
        return list(self._outboxes.values())

    @property
    def drained_outboxes(self) -> list[type[Outbox]]:
        """The outboxes the kit delivers: all but those relayed by change data capture (``relay="cdc"``)."""
        return [outbox for outbox in self._outboxes.values() if self._options[outbox.__outbox__.job_name].relay != "cdc"]

    def outbox(self, name_or_class: str | type[Outbox]) -> type[Outbox]:
        """The registered outbox class for a job name (or the class itself)."""
        if self.is_receive_only:
            raise UnknownOutboxError(
                f"this kit only receives (OutboxKit.receive_only) and has no outboxes, so it has none for {name_or_class!r}; "
                "sending needs OutboxKit(engine, outboxes=[MyOutbox])"
            )
        if isinstance(name_or_class, str):
            try:
                return self._outboxes[name_or_class]
            except KeyError:
                known = ", ".join(sorted(self._outboxes))
                raise UnknownOutboxError(f"no outbox named {name_or_class!r}; registered: {known}") from None
        for outbox in self._outboxes.values():
            if outbox is name_or_class:
                return outbox
        raise UnknownOutboxError(f"{name_or_class!r} is not registered with this kit")

    def options(self, name_or_class: str | type[Outbox]) -> OutboxOptions:
        """The effective options (class options with settings applied)."""
        return self._options[self.outbox(name_or_class).__outbox__.job_name]

    @property
    def transport(self) -> Transport:
        with self._lock:
            if self._transport is None:
                self._transport = HttpTransport()
            return self._transport

    # -- draining ------------------------------------------------------------

    def drainer(self, name_or_class: str | type[Outbox]) -> Drainer:
        """The (cached) drainer for one outbox."""
        outbox = self.outbox(name_or_class)
        job_name = outbox.__outbox__.job_name
        with self._lock:
            drainer = self._drainers.get(job_name)
        if drainer is not None:
            return drainer
        options = self._options[job_name]
        transport = self._outbox_transport(outbox, options.transport or self.transport)
        with self._lock:
            drainer = self._drainers.get(job_name)
            if drainer is None:
                drainer = Drainer(
                    self._drain_engine_holder().engine,
                    outbox,
                    transport=transport,
                    clock=self.clock,
                    options=options,
                    synchronous_commit=self.settings.synchronous_commit,
                    telemetry=self.telemetry,
                    attempt_history_days=self.settings.attempt_history_days,
                    attempt_body_bytes=self.settings.attempt_body_bytes,
                    prepared_statements=self.settings.prepared_statements,
                    guard_transport=self._guard_transport if outbox.__runtime_requests__ is not None else None,
                )
                self._drainers[job_name] = drainer
        return drainer

    def _outbox_transport(self, outbox: type[Outbox], transport: Transport) -> Transport:
        """The transport one outbox's drainer sends through, under the URL guard; ``OutboxKit`` signs event deliveries."""
        return transport

    def _guard_transport(self, transport: Transport) -> Transport:
        """Sends of requests typed at run time: each URL checked again and pinned (``outboxkit.transports.guarded``)."""
        return GuardedTransport(
            transport, guard=self.url_guard, error_body_chars=self.settings.schedule_error_body_chars,
            secrets=self.settings.secret_values,
        )

    def _built_drainer(self, job_name: str) -> Drainer | None:
        """The outbox's drainer if this process built one (a gauge read must not build it)."""
        with self._lock:
            return self._drainers.get(job_name)

    def hung_sends(self, job_name: str) -> int:
        """This process's sends of one outbox hung now (``outboxkit.drain.hung_sends``); 0 before its drainer exists."""
        drainer = self._built_drainer(job_name)
        return drainer.pump.hung.count if drainer is not None else 0

    def drain_once(self, name_or_class: str | type[Outbox]) -> DrainResult:
        """Claim, deliver and record one batch of one outbox.  Never raises for delivery or database errors."""
        return self.drainer(name_or_class).drain_once()

    def drain(self, name_or_class: str | type[Outbox], **limits: object) -> DrainResult:
        """Drain one outbox until no due row is left; see ``Drainer.drain`` for limits."""
        return self.drainer(name_or_class).drain(**limits)  # type: ignore[arg-type]

    def session_connector(self, application_name: str, *, keepalive_seconds: float | None = None) -> SessionConnector:
        """Opens the dedicated lock and LISTEN connections (``outboxkit.storage.connections``).

        From ``lock_database_url`` when set (a direct DSN), else from the
        drain's pool, which connects as the engine does (its ``connect_args``,
        ``creator`` and ``do_connect`` hooks apply); detached from that pool, so
        they take none of its slots and none of the application's.
        """
        return session_connector(
            engine=None if self.settings.lock_database_url else self.drain_database.engine,
            dsn=self.lock_dsn if self.settings.lock_database_url else None,
            application_name=application_name,
            keepalive_seconds=keepalive_seconds or self.settings.leader_tick_seconds,
        )

    @property
    def session_source(self) -> str:
        """Where the lock and LISTEN connections come from, as a refusal names it (no password)."""
        if self.settings.lock_database_url:
            shown = make_url(self.settings.lock_database_url).render_as_string(hide_password=True)
            return f"OUTBOXKIT_LOCK_DATABASE_URL={shown}"
        shown = self.engine.url.render_as_string(hide_password=True)
        return f"the engine's URL {shown}, as OUTBOXKIT_LOCK_DATABASE_URL is unset"

    @property
    def operator_database(self) -> OperatorDatabase:
        """The admin's and the CLI's own small pool with its time limit (``outboxkit.storage.operator_pool``).

        Built on first use from the engine's URL; its connections are never the application's.
        """
        with self._lock:
            if self._operator_database is None:
                self._operator_database = OperatorDatabase(self.engine, self.settings)
            return self._operator_database

    @property
    def drain_database(self) -> DrainDatabase:
        """The drain's own pool (``outboxkit.storage.drain_pool``): claims, outcomes, LISTEN and the leader lock.

        Built on first use with the engine's connection factory; the drain never takes one of the
        application's connections.
        """
        with self._lock:
            return self._drain_engine_holder()

    def _drain_engine_holder(self) -> DrainDatabase:
        if self._drain_database is None:
            size = drain_pool_size(self.settings, self._options.values())
            self._drain_database = DrainDatabase(self.engine, self.settings, size=size)
        return self._drain_database

    @property
    def lock_dsn(self) -> str:
        """A libpq URL of the lock database: ``lock_database_url``, else the engine's (the admin's and CLI's view)."""
        # libpq wants "postgresql://"; a SQLAlchemy-style "postgresql+psycopg://" is accepted too.
        url = make_url(self.settings.lock_database_url) if self.settings.lock_database_url else self.engine.url
        return url.set(drivername="postgresql").render_as_string(hide_password=False)

    def close(self) -> None:
        """Close the drainers (sends in flight finish first), the own transport, the kit's pools and a derived engine.

        Like ``Engine.dispose()``, it leaves the kit usable: the next drain
        builds fresh drainers and a fresh transport.
        """
        with self._lock:
            drainers, self._drainers = list(self._drainers.values()), {}
            transport = self._transport if self._own_transport else None
            if self._own_transport:
                self._transport = None
            operator_database = self._operator_database
            drain_database = self._drain_database
        for drainer in drainers:
            drainer.close()
        if transport is not None:
            transport.close()
        if operator_database is not None:
            operator_database.dispose()
        if drain_database is not None:
            drain_database.dispose()
        if self._derived_engine is not None:  # dispose() leaves it usable, like the rest of the kit
            self._derived_engine.dispose()
