"""What an operator does, without a web framework.

The overview (counts, oldest due, last drain run, the leader, the last
hour's figures: ``charts``), keyset pages of rows both ways with filters and
search, one row's detail with its attempt history (``history``), reset and
retry-now (audited, and waking the drain), pause, resume and drain now
(``controls``), the jobs table (``jobs_table``) with schedules in words (``schedules``)
and run history, replaying delivered rows (``replay``) and streaming rows as
NDJSON or CSV (``export``).  ``OperationsService`` is shared by the admin's JSON API and
pages (``outboxkit.admin``, which needs FastAPI) and by the CLI (which does
not): the same rules, written once, on top of the query functions the drain
uses (``outboxkit.storage.drain_queries``).
"""
