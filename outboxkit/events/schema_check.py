"""JSON Schema checks of event payloads, with the ``jsonschema`` package (the ``events`` extra).

The one module that imports ``jsonschema``; without it, publishing an event
whose type carries a schema fails with the install hint, and types without a
schema need nothing.  A validator is built once per schema text and kept
(a bounded number), so a publish pays for the check only.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from outboxkit.errors import ConfigurationError, InvalidEventError

__all__ = ["check_payload", "check_schema"]

INSTALL_HINT = "event types with a JSON Schema need the jsonschema package: pip install 'outboxkit[events]'"


def _jsonschema() -> Any:
    try:
        import jsonschema
    except ImportError:
        raise ConfigurationError(INSTALL_HINT) from None
    return jsonschema


@lru_cache(maxsize=256)
def _validator(schema_text: str) -> Any:
    jsonschema = _jsonschema()
    schema = json.loads(schema_text)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def check_schema(schema: dict[str, Any]) -> None:
    """Refuse a schema that is not a valid JSON Schema (``InvalidEventError`` on ``schema``)."""
    jsonschema = _jsonschema()
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise InvalidEventError("schema", f"not a valid JSON Schema: {exc.message}") from None


def check_payload(event_type: str, schema: dict[str, Any], payload: object) -> None:
    """Refuse ``payload`` if ``schema`` does not accept it; the error names the first field at fault."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    error = next(iter(sorted(validator.iter_errors(payload), key=lambda found: list(found.absolute_path))), None)
    if error is None:
        return
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
    raise InvalidEventError(f"payload{path}", f"{event_type}: {error.message}")
