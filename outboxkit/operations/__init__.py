"""What an operator does, without a web framework.

The overview (counts, oldest due, last drain run, the leader), keyset pages
of rows, one row's detail, reset and retry-now (audited, and waking the
drain), and the jobs table.  ``AdminService`` is shared by the admin's JSON
API and pages (``outboxkit.admin``, which needs FastAPI) and by the CLI
(which does not): the same rules, written once, on top of the query
functions the drain uses (``outboxkit.queries``).
"""
