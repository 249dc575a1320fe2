"""Settings read from the environment (prefix ``OUTBOXKIT_``).

Everything here has a default; an operator overrides it without a deploy::

    OUTBOXKIT_ENVIRONMENT=production
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__MAX_ATTEMPTS=10
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__BACKOFF=1,5,30
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__RETAIN_DONE_FOR=604800   # or "off"
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__WEBHOOK_SECRETS=whsec_new...,whsec_old...   # sign_webhooks outboxes
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__RATE_LIMIT=20       # requests/s per destination; JSON for more, or "off"
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__HUNG_SEND_SECONDS=2 # a send out longer is hung: no longer counted; or "off"
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__BREAKER='{"failures": 10}'  # BreakerOptions' fields to change, or "off"
    OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__DESTINATION_CONCURRENCY=4   # or "auto"; LEASE and LEASE_MARGIN alike
    # or all at once, as JSON:
    OUTBOXKIT_OUTBOXES='{"credit_grants": {"backoff": [1, 5, 30], "max_attempts": 10}}'

Every ``OutboxOptions`` field but ``job_name``, ``transport`` and ``ordering_key`` (code, not
configuration) has its variable.  The forms merge (the JSON may set one setting of an outbox, a variable of its
own another); one setting given in both is refused, naming both variables.

Per-outbox keys are the outbox's ``job_name`` with ``-`` written as ``_``.
``OutboxKitSettings.from_environment()`` (what the kit uses by default) turns
a bad value into a ``ConfigurationError`` that names its variable.

The admin (see docs/admin.md)::

    OUTBOXKIT_ADMIN_MAX_BODY_BYTES=65536        # larger POST bodies get 413
    OUTBOXKIT_ADMIN_CSRF_TOKEN_SECONDS=7200     # lifetime of a page's form token
    OUTBOXKIT_ADMIN_SECRET=...                 # signs the admin's form tokens; unset: one generated key kept in the database
    OUTBOXKIT_ADMIN_STATEMENT_TIMEOUT_SECONDS=5 # time limit of each admin transaction (then "narrow the filter")
    OUTBOXKIT_ADMIN_POOL_SIZE=1                 # the admin's own connections (none taken from the application's pool)
    OUTBOXKIT_ADMIN_POOL_TIMEOUT_SECONDS=3      # how long a request waits for one of them (then 503)

The election and the scheduler (see docs/election.md)::

    OUTBOXKIT_LOCK_DATABASE_URL=postgresql://app@db-primary:5432/app   # direct, not via a transaction pooler
    OUTBOXKIT_ADVISORY_LOCK_KEY=2710940685875084841
    OUTBOXKIT_LEADER_TICK_SECONDS=15
    OUTBOXKIT_STANDBY_PROBE_SECONDS=60
    OUTBOXKIT_DRAIN_INTERVAL_SECONDS=60

Schedules as rows (see docs/schedules.md)::

    OUTBOXKIT_SCHEDULES_ENABLED=true    # this process syncs the schedules declared in code and fires due rows
    OUTBOXKIT_URL_ALLOW_LIST=10.20.0.0/16,hooks.internal  # non-public networks/hosts a schedule may send to
    OUTBOXKIT_SCHEDULE_ERROR_BODY_CHARS=0                 # characters of an error answer's body kept in last_error
    OUTBOXKIT_SCHEDULE_RUN_NOW_PER_MINUTE=6               # "run now" calls one person may make per minute
    OUTBOXKIT_SECRETS__PARTNER_TOKEN='Bearer ...'         # what a target's header 'secret:partner_token' sends

Drain work (see docs/operations.md, "Drains and workers")::

    OUTBOXKIT_DRAIN_ENABLED=true        # this process drains (NOTIFY, due times), leader or not
    OUTBOXKIT_LISTEN_ENABLED=true
    OUTBOXKIT_SYNCHRONOUS_COMMIT=true   # false: claims and outcomes do not wait for the WAL flush
    OUTBOXKIT_PREPARED_STATEMENTS=false # true: server-side prepared statements (direct, or PgBouncer 1.21+)

A variable that starts with ``OUTBOXKIT_`` but names no setting (a typo such
as ``OUTBOXKIT_LEADER_TICK``, or ``OUTBOXKIT_OUTBOXES__CREDIT_GRANTS__MAX_ATEMPTS``)
is refused with the closest valid name, rather than silently ignored.  The
kit's own tools use a few ``OUTBOXKIT_`` variables that are not settings;
those are allowed (``NON_SETTING_VARIABLES`` and ``NON_SETTING_PREFIXES``):
``OUTBOXKIT_APP`` (the CLI's ``--app``), and ``OUTBOXKIT_TEST_*``,
``OUTBOXKIT_BENCH_*`` and ``OUTBOXKIT_FAULT_*`` (the test suite, the
benchmarks and the fault tests).

The package:

- ``kit_settings``: ``OutboxKitSettings``, one field per setting with its default and meaning, and
  ``from_environment()``, whose errors name their variable.  Start here.
- ``outboxes``: ``OutboxOverride``, the per-outbox values that replace a class's ``OutboxOptions``.
- ``variables``: the names of ``OUTBOXKIT_`` variables, typos and settings given twice refused.
"""

from outboxkit.settings.kit_settings import DEFAULT_ADVISORY_LOCK_KEY, OutboxKitSettings
from outboxkit.settings.outboxes import OutboxOverride, RateLimitOverride
from outboxkit.settings.variables import NON_SETTING_PREFIXES, NON_SETTING_VARIABLES

__all__ = [
    "DEFAULT_ADVISORY_LOCK_KEY",
    "NON_SETTING_PREFIXES",
    "NON_SETTING_VARIABLES",
    "OutboxKitSettings",
    "OutboxOverride",
    "RateLimitOverride",
]
