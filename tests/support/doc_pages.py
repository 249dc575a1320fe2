"""Running a documentation page's code: its ``# file:`` blocks become a package in a temporary folder.

Each page that shows complete code marks every block with a ``# file:`` line;
a test writes those files out, points them at the test's receiver and
database, imports them and drives the application, so the page cannot drift
from the library.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path

from sqlalchemy import Engine, MetaData

from outboxkit.model import Outbox
from outboxkit.storage.notify import install_trigger_sql
from outboxkit.storage.tables import kit_metadata

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The receiver URL the pages show; tests replace it with their own receiver's.
PAGE_RECEIVER_URL = "http://127.0.0.1:8765"


def page_files(page: str) -> dict[str, str]:
    """``{"myapp/models.py": code, ...}`` for every ``# file:`` block of ``docs/<page>``."""
    return dict(re.findall(r"```python\n# file: (\S+)\n(.*?)```", (DOCS / page).read_text(), re.S))


def write_package(folder: Path, files: dict[str, str], *, receiver_url: str) -> None:
    for name, code in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(code.replace(PAGE_RECEIVER_URL, receiver_url))


def create_schema(engine: Engine, metadata: MetaData, outboxes: Iterable[type[Outbox]]) -> None:
    """What the page's migrations would create: its tables, the kit's tables and the NOTIFY triggers."""
    metadata.create_all(engine)
    kit_metadata.create_all(engine)
    with engine.begin() as connection:
        for outbox in outboxes:
            for statement in install_trigger_sql(outbox):
                connection.exec_driver_sql(statement)


def forget_package(package: str) -> None:
    """Unimport the page's package, so the next test imports (and builds its kit) afresh."""
    for name in [name for name in sys.modules if name == package or name.startswith(f"{package}.")]:
        del sys.modules[name]
