"""Secrets the kit's processes share without anyone configuring them.

The admin signs its form tokens and notices; with several workers or hosts, a form rendered by one
process must be accepted by any other, so they need one key.  ``shared_secret`` returns the key stored
under a name in ``outboxkit_secrets``, generating it first if no process has: one
``INSERT ... ON CONFLICT DO NOTHING`` of a fresh random key and a read, in one transaction, so processes
that start together all read the first one written.
"""

from __future__ import annotations

import logging
import secrets

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import ProgrammingError

from outboxkit.errors import MigrationRequired
from outboxkit.kit import OutboxKit
from outboxkit.storage.tables import kit_secrets

__all__ = ["ADMIN_SIGNING_KEY", "shared_secret"]

logger = logging.getLogger(__name__)

ADMIN_SIGNING_KEY = "admin-signing"
KEY_BYTES = 32


def shared_secret(kit: OutboxKit, name: str) -> bytes:
    """The key stored under ``name``, written first by whichever process asks first.

    Raises ``MigrationRequired`` when the kit's table is missing (migration ``outboxkit_0011``).
    """
    try:
        with kit.operator_database.begin() as connection:
            connection.execute(
                insert(kit_secrets).values(name=name, value=secrets.token_bytes(KEY_BYTES)).on_conflict_do_nothing()
            )
            value = connection.execute(select(kit_secrets.c.value).where(kit_secrets.c.name == name)).scalar_one()
    except ProgrammingError as exc:
        if "outboxkit_secrets" not in str(exc):
            raise
        raise MigrationRequired(
            "the kit's table outboxkit_secrets is missing (migration outboxkit_0011): run `alembic upgrade heads`, "
            "or set OUTBOXKIT_ADMIN_SECRET"
        ) from None
    return bytes(value)
