"""PostgreSQL array literals for the drain's batched writes, written in one pass.

The grouped outcome write (``outboxkit.storage.drain_queries``) and the attempt history
(``outboxkit.storage.attempts``) pass their rows as arrays that the statement
``unnest``s.  Given a list, psycopg dumps it element by element in Python (it
first looks for the element type, then calls a dumper for each element);
in a drain without network that was the largest share of the pump thread's
CPU (docs/performance.md).  These functions write the array's text form at
once instead, by PostgreSQL's grammar for array input: the elements between
braces, separated by commas, ``NULL`` for ``None``.  A text element is
always double-quoted, with each backslash and double quote inside it
escaped by a backslash, so no text can end its element or the array early,
whatever it holds.  The statement casts the parameter to its array type
(``%(ids)s::bigint[]``), and the server parses each element with that type's
own input function.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

__all__ = ["integer_array", "text_array"]


def integer_array(values: Iterable[int | None]) -> str:
    """``{1,NULL,3}``; anything but an integer or None is a ``TypeError`` (a float is not rounded)."""
    return "{" + ",".join("NULL" if value is None else str(operator.index(value)) for value in values) + "}"


def text_array(values: Iterable[object | None]) -> str:
    """``{"a","b \\"c\\"",NULL}``: each element's ``str()``, quoted and escaped (text, UUIDs, timestamps)."""
    return "{" + ",".join("NULL" if value is None else _quoted(str(value)) for value in values) + "}"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
