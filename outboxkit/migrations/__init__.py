"""The kit's Alembic migration branch (label ``outboxkit``).

Add ``outboxkit:migrations/versions`` to your ``version_locations``::

    # alembic.ini
    version_locations = %(here)s/versions outboxkit:migrations/versions

then ``alembic upgrade heads``.  ``VERSIONS`` is the folder's path, for
applications that configure Alembic from Python.

Modules: ``helpers`` (for an application's ``env.py`` and revisions: the kit's
tables left out of autogenerate, NOTIFY triggers, destinations backfilled),
``partitioned_tables`` (a partitioned outbox created, a plain one converted
online, storage settings) and ``revision_ops`` (what the helpers share).
"""

from pathlib import Path

VERSIONS = Path(__file__).parent / "versions"
