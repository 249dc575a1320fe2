"""Leader election: exactly one process runs the schedule.

Many processes run the application (uvicorn ``--workers N``, several hosts);
each runs one ``LeaderElection``.  The one that holds a PostgreSQL session
advisory lock leads and runs the scheduler; the others stand by.  The state
machine, and the invariant each step protects:

``STANDBY`` -- campaign.  Open a *new* connection in AUTOCOMMIT, name it
    ``outboxkit-leader:<host>:<pid>`` (so ``pg_stat_activity`` and the admin
    show who leads), prove it is a session of its own (``outboxkit.storage.sessions``:
    behind a transaction-mode pooler the lock would stay on a shared server
    connection and could be granted twice; a failed proof is a failed
    campaign, see ``UNELECTED``) and ``SELECT pg_try_advisory_lock(KEY)`` on
    the proven backend only.  False: close it
    and probe again after ``standby_probe_seconds``.  True: keep the connection
    for the whole leadership and remember its ``pg_backend_pid()``.  A session
    lock lives exactly as long as its server session, so holding the
    connection *is* holding the leadership.  Each campaign uses a fresh
    connection and runs only while no lock connection is held: session
    advisory locks stack, so a second acquire on the same session would need
    two unlocks and would make "who holds it" lie.

``PROMOTING`` -- wait one ``leader_tick_seconds`` before starting anything.
    An old leader whose session was terminated, or whose server restarted,
    fails its next tick at once, at most one tick later, and stops its
    scheduler.  Waiting one tick here means the new leader's first job then
    fires after the old one has stopped.  An old leader that cannot hear
    from its server at all (a failover to another host, a network
    partition) can take longer to notice (see Timing), and the two
    schedulers may overlap meanwhile; the run-history fence keeps each
    occurrence from running twice.  Then check the lock is still ours and
    start the scheduler.

``LEADER`` -- tick.  Every ``leader_tick_seconds``, on the lock connection,
    ask ``pg_locks`` whether this backend still holds the key *in this
    database* (advisory keys are per database, ``pg_locks`` is cluster-wide,
    so every query carries the database predicate), and whether the
    statement still runs on the backend that took the lock.  An error or no
    row means the lock is gone (server restart, failover, ``pg_terminate_backend``,
    an idle timeout) or out of reach (a pooler moved the connection): stop
    the scheduler at once without waiting for running jobs, release what is
    still ours (an unlock on the backend that took it, or ending that backend
    if a pooler stranded it there), close the connection, become ``STANDBY``.  The run-history fence
    (``outboxkit_job_runs``) covers the short window in which a job already
    running finishes after the demotion.  Then ``recheck()``, when given
    (the kit re-checks its engine against poolers): False stops the
    scheduler the same way and ends the election for good (``STOPPED``).

``UNELECTED`` -- the campaign itself failed (no connection, an SQL error)
    and the kit is not in production (``fail_open``): the scheduler runs
    without the lock, with a warning, so a developer's laptop still drains.
    Campaigns go on; winning one makes this process a normal leader, losing
    one (someone else holds the lock) stops the scheduler.  In production a
    failed campaign starts nothing: fail closed, stay ``STANDBY``, retry.

``STOPPED`` -- ``stop()``: stop the scheduler (waiting for running jobs),
    ``pg_advisory_unlock``, close the connection.  A standby then takes over
    within one probe interval plus one tick.

Timing: with the defaults (15 s tick, 60 s probe) a standby takes over
within 60 s + 15 s of the server freeing the lock.  A leader that lost its
lock stops at its next tick that gets an answer: within one tick (15 s) when
the server answers (a terminated session, a restart).  The tick query has no
timeout of its own, so when the server or the path to it vanished without a
word, the tick waits for the connection to fail: the TCP keepalives set from
the tick interval notice a silent peer of an idle connection in about two
ticks, and a tick already sent into the silence waits until the kernel gives
up retransmitting it (many minutes with Linux defaults).

Nothing here raises into the application: callbacks that fail are logged,
and a scheduler that cannot start gives the lock back so another process can
lead.

One module: the campaign, the tick, the demotion and the hand-over share one state machine, and
the prose above says which invariant each step protects; the lock's statements are ``leader.lock``.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable

import psycopg

from outboxkit.errors import InvalidValueError, LifecycleError
from outboxkit.leader.lock import (
    APPLICATION_NAME_PREFIX,
    LockHolder,
    current_leader,
    key_predicate,
    leader_application_name,
    lock_holders,
    still_held_query,
    try_acquire_query,
    unlock_query,
)
from outboxkit.settings import DEFAULT_ADVISORY_LOCK_KEY
from outboxkit.storage.connections import SessionConnector, session_connector
from outboxkit.storage.sessions import (
    LOCK_SETTING,
    NotASessionError,
    SessionIdentity,
    end_stranded_backend,
    not_a_session,
    prove_session,
)
from outboxkit.telemetry.hooks import Telemetry, log_fields

__all__ = [
    "DEFAULT_ADVISORY_LOCK_KEY",
    "ElectionState",
    "LeaderElection",
    "LockHolder",
    "current_leader",
    "leader_application_name",
    "lock_holders",
]

logger = logging.getLogger(__name__)


class ElectionState(enum.Enum):
    STANDBY = "standby"
    PROMOTING = "promoting"
    LEADER = "leader"
    UNELECTED = "unelected"
    STOPPED = "stopped"


def wait_on_event(seconds: float, stopping: threading.Event) -> bool:
    """The default sleep: wait ``seconds`` or until ``stopping`` is set; True if it was set."""
    return stopping.wait(seconds)


Sleep = Callable[[float, threading.Event], bool]


class LeaderElection:
    """Campaigns for the leader lock in a background thread and runs callbacks on changes.

    ``on_elected()`` starts the scheduler; ``on_demoted(wait)`` stops it
    (``wait=False`` when the lock was lost, so no job outlives the
    leadership; ``wait=True`` on a clean shutdown).  ``sleep(seconds,
    stopping)`` is injectable so tests can hold the machine between steps.
    """

    def __init__(
        self,
        *,
        dsn: str | None = None,
        connect: SessionConnector | None = None,
        on_elected: Callable[[], None],
        on_demoted: Callable[[bool], None],
        key: int = DEFAULT_ADVISORY_LOCK_KEY,
        leader_tick_seconds: float = 15.0,
        standby_probe_seconds: float = 60.0,
        fail_open: bool = False,
        connect_timeout: float = 5.0,
        sleep: Sleep = wait_on_event,
        telemetry: Telemetry | None = None,
        source: str | None = None,
        recheck: Callable[[], bool] | None = None,
    ) -> None:
        if leader_tick_seconds <= 0 or standby_probe_seconds <= 0:
            raise InvalidValueError("leader_tick_seconds and standby_probe_seconds must be positive")
        if not -(2**63) <= key < 2**63:
            raise InvalidValueError(f"advisory key {key} does not fit a signed 64-bit integer")
        if (dsn is None) == (connect is None):
            raise InvalidValueError("LeaderElection needs exactly one of dsn= or connect= (outboxkit.storage.connections)")
        self.dsn = dsn
        # Where the lock connection comes from, for a refusal's message (the kit names its setting).
        self.source = source or ("the dsn= given to LeaderElection" if dsn is not None else "its connect= function")
        self.key = key
        self.leader_tick_seconds = leader_tick_seconds
        self.standby_probe_seconds = standby_probe_seconds
        self.fail_open = fail_open
        self.connect_timeout = connect_timeout
        self.application_name = leader_application_name()
        self.identity = self.application_name[len(APPLICATION_NAME_PREFIX) :]
        # The lock connection: from the engine (its connect_args, creator and hooks) or a direct DSN;
        # keepalives at the tick, so a vanished server is noticed within about two ticks.
        self._connect = connect or session_connector(
            engine=None,
            dsn=dsn,
            application_name=self.application_name,
            keepalive_seconds=leader_tick_seconds,
            connect_timeout=connect_timeout,
        )
        self._on_elected = on_elected
        self._on_demoted = on_demoted
        self._recheck = recheck
        self._sleep = sleep
        self._state = ElectionState.STANDBY
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._connection: psycopg.Connection | None = None
        self._backend_pid: int | None = None
        self._identity: SessionIdentity | None = None  # the proven backend the lock was taken on
        self.refusal: NotASessionError | None = None  # the last campaign's refusal of a non-session connection
        self._announced: str | None = None  # the last standby/error message logged, to log changes only
        self._thread: threading.Thread | None = None
        self.campaigns = 0  # campaigns finished so far (won, lost or failed); for monitoring and tests
        self.telemetry = telemetry if telemetry is not None else Telemetry()  # the leader gauge; no-op unless attached

    # -- public --------------------------------------------------------------

    @property
    def state(self) -> ElectionState:
        with self._changed:
            return self._state

    @property
    def backend_pid(self) -> int | None:
        """``pg_backend_pid()`` of the lock connection while this process holds the lock."""
        return self._backend_pid

    def start(self) -> None:
        """Start campaigning in a daemon thread.  Returns at once."""
        if self._thread is not None:
            raise LifecycleError("this LeaderElection was already started; build a new one")
        self._thread = threading.Thread(target=self._run, name="outboxkit-election", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the scheduler if leading, release the lock, close the connection."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        elif self.state is not ElectionState.STOPPED:
            self._set_state(ElectionState.STOPPED)

    def wait_for(self, *states: ElectionState, timeout: float, campaigns: int = 0) -> bool:
        """Block until the state is one of ``states`` (and ``campaigns`` campaigns are done); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._state in states and self.campaigns >= campaigns, timeout)

    # -- the state machine -----------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._campaign()
                if self.state is ElectionState.PROMOTING:
                    if self._sleep(self.leader_tick_seconds, self._stopping):
                        break
                    if self._still_held():
                        self._promote()
                    else:
                        self._demote("the lock was lost while waiting to start")
                while self.state is ElectionState.LEADER:
                    if self._sleep(self.leader_tick_seconds, self._stopping):
                        break
                    if not self._still_held():
                        self._demote("the leader lock is gone or out of reach (connection lost, terminated or moved)")
                    elif not self._rechecked():
                        self._demote("the kit refused its connections on this tick's re-check")
                        self._stopping.set()  # a refusal is final: no more campaigns
                if self.state in (ElectionState.STANDBY, ElectionState.UNELECTED):
                    if self._sleep(self.standby_probe_seconds, self._stopping):
                        break
        except Exception:  # a bug here must not kill the thread silently with the lock held
            logger.exception("leader election failed unexpectedly; resigning",
                             extra=log_fields("election.failed", leader=self.identity))
        finally:
            self._resign()

    def _campaign(self) -> None:
        if self._connection is not None:
            return  # already holding: never acquire twice on one session (locks stack)
        try:
            self._try_acquire()
        finally:
            with self._changed:
                self.campaigns += 1
                self._changed.notify_all()

    def _try_acquire(self) -> None:
        try:
            connection = self._connect()
        except Exception as exc:
            self._campaign_failed(exc)
            return
        try:
            identity = prove_session(connection, self._connect, purpose="the leader lock connection", source=self.source)
            answer = connection.execute(try_acquire_query(identity.predicate()), [self.key]).fetchone()
            assert answer is not None  # a SELECT without FROM returns exactly one row
            acquired, backend_pid = answer
            if acquired is None:  # not on the proven backend: nothing was taken
                raise not_a_session("the leader lock connection", self.source, "it moved to another server backend")
        except Exception as exc:
            connection.close()
            self._campaign_failed(exc)
            return
        self.refusal = None
        if not acquired:
            connection.close()
            self._campaign_lost()
            return
        self._connection, self._backend_pid, self._identity = connection, backend_pid, identity
        self._announced = None
        if self.state is ElectionState.UNELECTED:
            logger.info("acquired leadership as %s (backend %s); the scheduler already runs", self.identity, backend_pid,
                        extra=log_fields("election.acquired", leader=self.identity))
            self._set_state(ElectionState.LEADER)
        else:
            logger.info(
                "acquired leadership as %s (backend %s); starting the scheduler in %gs",
                self.identity,
                backend_pid,
                self.leader_tick_seconds,
                extra=log_fields("election.acquired", leader=self.identity),
            )
            self._set_state(ElectionState.PROMOTING)

    def _campaign_lost(self) -> None:
        if self.state is ElectionState.UNELECTED:
            logger.warning("another process holds the leader lock; stopping the unelected scheduler",
                           extra=log_fields("election.unelected_stopped", leader=self.identity))
            self._call_demoted(wait=False)
            self._set_state(ElectionState.STANDBY)
        self._announce(logging.INFO, "standby: another process holds the leader lock", "election.standby")

    def _campaign_failed(self, exc: Exception) -> None:
        self.refusal = exc if isinstance(exc, NotASessionError) else None
        reason = f"{type(exc).__name__}: {str(exc).strip()}"
        if self.state is ElectionState.UNELECTED:
            return
        if self.fail_open:
            logger.warning(
                "leader election failed (%s); not in production, so the scheduler starts without the lock", reason,
                extra=log_fields("election.failed_open", leader=self.identity),
            )
            if self._call_elected():
                self._set_state(ElectionState.UNELECTED)
            return
        self._announce(
            logging.ERROR,
            f"leader election failed ({reason}); production fails closed: no scheduler in this process, "
            f"retrying every {self.standby_probe_seconds:g}s",
            "election.failed",
        )

    def _promote(self) -> None:
        if self._call_elected():
            self._set_state(ElectionState.LEADER)
            return
        logger.error("the scheduler failed to start; giving the leader lock back so another process can lead",
                     extra=log_fields("election.promotion_failed", leader=self.identity))
        self._release()
        self._set_state(ElectionState.STANDBY)

    def _demote(self, reason: str) -> None:
        logger.warning("lost leadership: %s; stopping the scheduler", reason,
                       extra=log_fields("election.lost", leader=self.identity))
        if self.state is ElectionState.LEADER:
            self._call_demoted(wait=False)
        self._release()
        self._set_state(ElectionState.STANDBY)

    def _resign(self) -> None:
        if self.state in (ElectionState.LEADER, ElectionState.UNELECTED):
            self._call_demoted(wait=True)
        was_leading = self._connection is not None
        self._release()
        if was_leading:
            logger.info("released leadership (%s)", self.identity, extra=log_fields("election.released", leader=self.identity))
        self._set_state(ElectionState.STOPPED)

    # -- helpers -------------------------------------------------------------

    def _still_held(self) -> bool:
        if self._connection is None or self._identity is None:
            return False
        try:
            query = still_held_query(self.key, self._identity.predicate())
            return self._connection.execute(query).fetchone() is not None
        except Exception as exc:
            logger.debug("leader tick failed: %s", exc)
            return False

    def _rechecked(self) -> bool:
        if self._recheck is None:
            return True
        try:
            return self._recheck()
        except Exception:
            logger.exception("the leader's re-check failed; it is tried again on the next tick",
                             extra=log_fields("election.recheck_failed", leader=self.identity))
            return True

    def _release(self) -> None:
        connection, identity = self._connection, self._identity
        if connection is not None and not connection.closed and identity is not None:
            try:
                # Unlock only on the backend that took the lock: elsewhere it could pop another holder's lock.
                row = connection.execute(unlock_query(identity.predicate()), [self.key]).fetchone()
                if row is not None and row[0] is None:
                    self._end_stranded(connection, identity)
            except Exception as exc:  # the lock dies with the session anyway
                logger.debug("advisory unlock failed (the session is gone): %s", exc)
        self._close_connection()

    def _end_stranded(self, connection: psycopg.Connection, identity: SessionIdentity) -> None:
        ended = end_stranded_backend(connection, identity, lock_predicate=key_predicate(self.key))
        logger.error(
            "the leader lock connection (%s) moved off backend %s, which holds the lock; %s. "
            "A transaction-mode pooler does this: point %s at a direct connection or a session-mode pool",
            self.source,
            identity.backend_pid,
            "ended that backend to release it" if ended else "it could not be ended now (busy, or gone already)",
            LOCK_SETTING,
            extra=log_fields("election.stranded", leader=self.identity),
        )

    def _close_connection(self) -> None:
        connection, self._connection, self._backend_pid, self._identity = self._connection, None, None, None
        if connection is not None:
            try:
                connection.close()
            except Exception:
                pass

    def _call_elected(self) -> bool:
        try:
            self._on_elected()
            return True
        except Exception:
            logger.exception("starting the scheduler failed",
                             extra=log_fields("election.scheduler_start_failed", leader=self.identity))
            return False

    def _call_demoted(self, *, wait: bool) -> None:
        try:
            self._on_demoted(wait)
        except Exception:
            logger.exception("stopping the scheduler failed",
                             extra=log_fields("election.scheduler_stop_failed", leader=self.identity))

    def _announce(self, level: int, message: str, event: str) -> None:
        if message != self._announced:  # log changes, not every probe
            self._announced = message
            logger.log(level, message, extra=log_fields(event, leader=self.identity))

    def _set_state(self, state: ElectionState) -> None:
        with self._changed:
            self._state = state
            self._changed.notify_all()
        self.telemetry.leadership(self.identity, state.value)

    def __repr__(self) -> str:
        return f"LeaderElection({self.identity}, key={self.key}, state={self.state.value})"
