"""The settings reference table of docs/operations.md, built from the code so it cannot drift.

One row per setting: its name in code, its default (read from ``OutboxOptions`` and
``OutboxKitSettings``), its environment variable, and what it does (the field's description in
``outboxkit/settings``).  ``tests/unit/test_settings_reference.py`` compares the page with this;
``python -m tests.support.settings_reference`` rewrites the page's table after a change.
"""

from __future__ import annotations

import dataclasses
import pathlib

from pydantic.fields import FieldInfo

from outboxkit.breaker import BreakerOptions
from outboxkit.model import OutboxOptions
from outboxkit.settings import OutboxKitSettings, OutboxOverride

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "operations.md"
BEGIN = "<!-- settings table: built by tests/support/settings_reference.py from outboxkit/settings; do not edit -->"
END = "<!-- end of the settings table -->"

# OutboxOptions fields that are code, not configuration, and why.
CODE_ONLY = {
    "job_name": "the outbox's stable name: the settings key, the job's name, what monitors and the admin key on",
    "transport": "the transport object this outbox sends through (default: the kit's)",
    "partition_by": "the table's shape (one plain table, or partitions by day or week): made by a migration, so "
    "declared with the class (see [partitioning](partitioning.md))",
    "relay": "who reads the rows: the kit's drain (`drain`) or a change data capture connector (`cdc`); the "
    "connector is set up outside the application (see [change data capture](cdc.md))",
    "ordering_key": "the column whose value orders delivery; the mixin builds its indexes when the class is defined "
    "(see [ordered delivery](destinations.md#ordered-delivery))",
}
# What a per-outbox default of None means.
UNSET_MEANS = {
    "lease": "the slowest batch: `ceil(batch_size / concurrency) * timeout + lease_margin`",
    "retain_done_for": "off: delivered rows are kept",
    "destination_concurrency": "`max(1, concurrency // 4)`",
    "hung_send_limit": "`4 * concurrency`",
    "rate_limit": "off",
    "webhook_secrets": "unset",
    "transport": "the kit's",
    "ordering_key": "unset: unordered",
    "partition_by": "unset: one plain table",
}


def _value(value: object) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, tuple) and all(isinstance(item, (int, float)) for item in value) and value:
        return "`" + ",".join(f"{item:g}" for item in value) + "`"
    if isinstance(value, BreakerOptions):
        fields = ", ".join(f"`{field.name}` {getattr(value, field.name):g}" for field in dataclasses.fields(value))
        return f"on: {fields}"
    if value in ((), {}):
        return "empty"
    if value is None:
        return "unset"
    return f"`{value}`"


def _kit_default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return _value(field.default_factory())  # type: ignore[call-arg]
    return _value(field.default)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def rows() -> list[tuple[str, str, str, str]]:
    """(setting, default, variable, meaning), per-outbox settings first."""
    table = []
    for option in dataclasses.fields(OutboxOptions):
        name = option.name
        if option.default is dataclasses.MISSING:
            default = "required"
        else:
            default = UNSET_MEANS.get(name, "unset") if option.default is None else _value(option.default)
        if name in CODE_ONLY:
            table.append((f"`OutboxOptions.{name}`", default, "none: code only", CODE_ONLY[name]))
            continue
        description = OutboxOverride.model_fields[name].description or ""
        variable = f"`OUTBOXKIT_OUTBOXES__<KEY>__{name.upper()}`"
        table.append((f"`OutboxOptions.{name}`", default, variable, description))
    for name, field in OutboxKitSettings.model_fields.items():
        variable = "`OUTBOXKIT_SECRETS__<NAME>`" if name == "secrets" else f"`OUTBOXKIT_{name.upper()}`"
        table.append((f"`{name}`", _kit_default(field), variable, field.description or ""))
    return table


def reference_table() -> str:
    lines = [BEGIN, "| setting | default | variable | what it does |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(_escape(cell) for cell in row) + " |" for row in rows()]
    return "\n".join([*lines, END])


def documented_table(page: str) -> str:
    start, end = page.index(BEGIN), page.index(END) + len(END)
    return page[start:end]


def main() -> None:
    page = PAGE.read_text()
    PAGE.write_text(page.replace(documented_table(page), reference_table()))


if __name__ == "__main__":
    main()
