"""Storage: the database the kit talks to and every statement it runs on an outbox table.

Connections:
* ``database``: the engine the kit accepts (PostgreSQL through psycopg 3, sync) and ``database_url``;
* ``connections`` and ``sessions``: the long-lived session connections (leader lock, LISTEN) and the
  proof that one is a session of its own, not a transaction pooler's shared server connection;
* ``operator_pool``: the admin's and CLI's own small pool, with a time budget per transaction;
* ``drain_pool``: the drain's own pool (claims, outcomes, LISTEN, the leader lock), never the application's;
* ``embedded``: the embedded PostgreSQL of the demo and of tests without a server;
* ``notify``: NOTIFY on insert and reset, the LISTEN connection of every draining process;
* ``wakeups``: pending wake-ups, so inserts notify only when none is pending (the insert trigger's body);
* ``diagnostics``: a database error turned into the one line that says how to fix it.

Tables and statements:
* ``tables``: the kit's own tables (run history, reset audit, attempts, pauses, destination state,
  schedules, shared secrets), the metadata of its Alembic branch;
* ``drain_queries``: the drain's SQL on one outbox (claim, outcome, park, earliest due), cached per outbox;
* ``database_time``: the database server's clock, which every due time, lease and cool-down is decided by;
* ``ordering``: the statements of an outbox with an ordering key (a key's head, the skip);
* ``row_instances``: a claim's rows as detached model instances, without an ORM Session;
* ``operator_queries`` with ``operator_results`` and ``row_filter``: what an operator reads and resets;
  ``replay_queries`` and ``export_queries`` build on them;
* ``attempts``: the attempt history, written in batches beside the outcomes;
* ``pauses``: paused outboxes, shared by every process;
* ``partitions``: the partitions of a partitioned outbox (create ahead, move out of DEFAULT, drop when all done);
* ``array_literals``: PostgreSQL array literals for batched writes.

Invariants: the claim takes due rows with ``FOR UPDATE SKIP LOCKED`` and counts the attempt before the
send; an outcome is written only under the row's claim token; nothing here deletes a row that is not
``done``.  Start with ``drain_queries``, then ``tables``.
"""
