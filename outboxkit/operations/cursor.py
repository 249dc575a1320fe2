"""Opaque keyset cursors.

A cursor is the position after the last row of a page, as base64url JSON:
``{"s": <status or scope>, "k": [<key values>]}``: a row id, a time and a row
id, or a name (the schedules, paged in name order).  It is not secret (it only
holds values the page showed), but it is validated strictly on the way in:
anything that does not decode to the expected shape is an ``InvalidCursor``,
which the API answers with 400.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any

from outboxkit.errors import InvalidCursor

__all__ = ["InvalidCursor", "decode_cursor", "decode_name_cursor", "encode_cursor"]

MAX_CURSOR_LENGTH = 512
MAX_ID = 2**63 - 1
MAX_NAME_LENGTH = 200  # a schedule's name


def encode_cursor(scope: str, key: tuple[Any, ...]) -> str:
    values = [value.isoformat() if isinstance(value, datetime) else value for value in key]
    raw = json.dumps({"s": scope, "k": values}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, *, scope: str, with_time: bool) -> tuple[Any, ...]:
    """The key a cursor holds: ``(id,)``, or ``(datetime, id)`` when ``with_time``."""
    key = _key(cursor, scope)
    if len(key) != (2 if with_time else 1) or not _is_id(key[-1]):
        raise InvalidCursor("cursor is malformed")
    if not with_time:
        return (key[0],)
    try:
        moment = datetime.fromisoformat(key[0]) if isinstance(key[0], str) else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise InvalidCursor("cursor is malformed")
    return (moment, key[1])


def decode_name_cursor(cursor: str, *, scope: str) -> str:
    """The name a cursor holds (a listing in name order, such as the schedules)."""
    key = _key(cursor, scope)
    if len(key) != 1 or not isinstance(key[0], str) or not 1 <= len(key[0]) <= MAX_NAME_LENGTH:
        raise InvalidCursor("cursor is malformed")
    return str(key[0])


def _key(cursor: str, scope: str) -> list[Any]:
    """The key values of a cursor of the listing ``scope``, not yet checked for their kind."""
    if len(cursor) > MAX_CURSOR_LENGTH:
        raise InvalidCursor("cursor is too long")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        document = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise InvalidCursor("cursor does not decode; use the next_cursor of a previous page") from None
    if not isinstance(document, dict) or document.get("s") != scope or not isinstance(document.get("k"), list):
        raise InvalidCursor("cursor belongs to another listing")
    return list(document["k"])


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_ID
