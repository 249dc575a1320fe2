"""One way to turn the example's database URL into an engine.

A plain ``postgresql://`` URL (what ``DATABASE_URL`` usually holds, and what
the embedded server reports) gets the psycopg 3 driver here, once.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url


def psycopg_url(url: str) -> str:
    """``url`` with the ``postgresql+psycopg`` driver, password kept."""
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def create_example_engine(url: str, **pool: Any) -> Engine:
    return create_engine(psycopg_url(url), **pool)
