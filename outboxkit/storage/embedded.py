"""An embedded PostgreSQL for the demo and for tests on a machine without one.

Uses the ``pgserver`` wheel, which ships PostgreSQL binaries, and is the
only module that imports it (install with ``pip install 'outboxkit[demo]'``).
The data folder is kept between runs, so the second start is fast and the
demo's rows are still there.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from outboxkit.errors import ConfigurationError, LifecycleError

__all__ = ["EmbeddedPostgres", "default_data_dir"]


def default_data_dir(name: str) -> Path:
    """``$XDG_CACHE_HOME/outboxkit/<name>`` (``~/.cache/outboxkit/<name>`` by default)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "outboxkit" / name


class EmbeddedPostgres:
    """A PostgreSQL server running from a data folder; a context manager.

    ``url`` is a libpq URL (Unix socket).  Leaving the context stops the
    server cleanly (a fast shutdown, so the data folder stays consistent).
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self._server: Any = None

    def start(self) -> str:
        with warnings.catch_warnings():
            # pgserver asks platformdirs for a runtime dir (on import and on
            # start) it does not need; the fallback warning is noise here.
            warnings.simplefilter("ignore")
            try:
                import pgserver
            except ImportError:
                raise ConfigurationError(
                    "no DATABASE_URL is set and the embedded PostgreSQL is not installed: "
                    "pip install 'outboxkit[demo]', or set DATABASE_URL=postgresql://user@host/db"
                ) from None
            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            self._server = pgserver.get_server(self.data_dir, cleanup_mode="stop")  # type: ignore[attr-defined]
        return self.url

    @property
    def url(self) -> str:
        if self._server is None:
            raise LifecycleError("EmbeddedPostgres is not started")
        return str(self._server.get_uri())

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
