"""The kit's Alembic migration branch (label ``outboxkit``).

Add ``outboxkit:migrations/versions`` to your ``version_locations``::

    # alembic.ini
    version_locations = %(here)s/versions outboxkit:migrations/versions

then ``alembic upgrade heads``.  ``VERSIONS`` is the folder's path, for
applications that configure Alembic from Python.
"""

from pathlib import Path

VERSIONS = Path(__file__).parent / "versions"
