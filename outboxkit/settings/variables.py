"""The names of the environment's ``OUTBOXKIT_`` variables: typos and settings given twice are refused.

A variable that starts with ``OUTBOXKIT_`` but names no setting is refused with the closest valid
name, rather than silently ignored.  The kit's own tools use a few ``OUTBOXKIT_`` variables that
are not settings; those are allowed (``NON_SETTING_VARIABLES`` and ``NON_SETTING_PREFIXES``).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping, Sequence

from outboxkit.errors import ConfigurationError
from outboxkit.settings.outboxes import OutboxOverride, outbox_key

__all__ = ["ENV_PREFIX", "NON_SETTING_PREFIXES", "NON_SETTING_VARIABLES", "check_variable_names", "unknown_variable"]

ENV_PREFIX = "OUTBOXKIT_"
# OUTBOXKIT_ variables that are not settings: outboxkit's CLI reads the first;
# its test suite, benchmarks and fault tests own the prefixes.
NON_SETTING_VARIABLES = frozenset({"OUTBOXKIT_APP"})
NON_SETTING_PREFIXES = ("OUTBOXKIT_TEST_", "OUTBOXKIT_BENCH_", "OUTBOXKIT_FAULT_")


def check_variable_names(environment: Mapping[str, str], settings: Iterable[str]) -> None:
    """Refuse ``OUTBOXKIT_*`` variables that name no setting (suggesting the closest valid name),
    and a per-outbox setting given both as its own variable and inside a JSON value."""
    problems = [problem for name in sorted(environment) if (problem := unknown_variable(name.upper(), settings))]
    problems += _set_twice(environment)
    if problems:
        raise ConfigurationError(f"invalid outboxkit setting: {'; '.join(problems)}")


def _set_twice(environment: Mapping[str, str]) -> list[str]:
    """Per-outbox settings the environment gives more than once.

    A setting can come from ``OUTBOXKIT_OUTBOXES__<KEY>__<SETTING>``, from
    ``OUTBOXKIT_OUTBOXES__<KEY>`` as JSON and from ``OUTBOXKIT_OUTBOXES`` as
    JSON (under any spelling of the key: ``credit-grants``, ``credit_grants``).
    The forms merge, so each may set different things; one setting in two
    places would leave its value to precedence nobody reads, so it is
    refused.  A JSON value that does not parse is left to the settings' own
    error.
    """
    places: dict[tuple[str, str], list[str]] = {}  # (outbox key, setting) -> where it is set
    for name in sorted(environment):
        parts = name.upper().split("__")
        if parts[0] != f"{ENV_PREFIX}OUTBOXES" or len(parts) > 3:
            continue
        if len(parts) == 3:
            places.setdefault((outbox_key(parts[1]), parts[2].lower()), []).append(name)
            continue
        try:
            document = json.loads(environment[name])
        except ValueError:
            continue
        tables = document if len(parts) == 1 else {parts[1]: document}
        if not isinstance(tables, dict):
            continue
        for key, table in tables.items():
            if isinstance(table, dict):
                for setting in table:
                    where = name if len(parts) == 2 else f"{name} (as {str(key)!r})"
                    places.setdefault((outbox_key(str(key)), str(setting).lower()), []).append(where)
    return [
        f"{' and '.join(where)} {'both' if len(where) == 2 else 'all'} set {key}.{setting}; set it in one place"
        for (key, setting), where in sorted(places.items())
        if len(where) > 1
    ]


def unknown_variable(name: str, settings: Iterable[str]) -> str | None:
    """What is wrong with one variable's name, or None when it names a setting (or is not outboxkit's)."""
    if not name.startswith(ENV_PREFIX) or name in NON_SETTING_VARIABLES or name.startswith(NON_SETTING_PREFIXES):
        return None
    parts = name[len(ENV_PREFIX) :].split("__")
    settings = [field.upper() for field in settings]
    if parts[0] not in settings:
        suggestion = _closest(parts[0], settings, ENV_PREFIX)
        return f"{name}: no such setting{suggestion}; the settings are {ENV_PREFIX}<one of {', '.join(settings)}>"
    if parts[0] == "SECRETS":  # OUTBOXKIT_SECRETS (JSON) or OUTBOXKIT_SECRETS__<NAME>
        example = f"{ENV_PREFIX}SECRETS__PARTNER_TOKEN"
        return f"{name}: secrets look like {ENV_PREFIX}SECRETS__<NAME>, e.g. {example}" if len(parts) > 2 else None
    if parts[0] != "OUTBOXES":
        return f"{name}: {ENV_PREFIX}{parts[0]} takes no nested keys" if len(parts) > 1 else None
    if len(parts) <= 2:  # OUTBOXKIT_OUTBOXES or OUTBOXKIT_OUTBOXES__<KEY>, as JSON
        return None
    fields = [field.upper() for field in OutboxOverride.model_fields]
    outbox = f"{ENV_PREFIX}OUTBOXES__{parts[1]}__"
    if len(parts) > 3 or not parts[1]:
        return f"{name}: per-outbox variables look like {ENV_PREFIX}OUTBOXES__<KEY>__<SETTING>, e.g. {outbox}MAX_ATTEMPTS"
    if parts[2] not in fields:
        return (
            f"{name}: no such per-outbox setting{_closest(parts[2], fields, outbox)}; "
            f"per-outbox settings are {', '.join(field.lower() for field in fields)}"
        )
    return None


def _closest(word: str, candidates: Sequence[str], prefix: str) -> str:
    match = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f" (did you mean {prefix}{match[0]}?)" if match else ""
