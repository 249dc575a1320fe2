"""The JSON Schema check of event payloads: the field at fault named, and an install hint without jsonschema."""

from __future__ import annotations

import sys

import pytest

from outboxkit import ConfigurationError, InvalidEventError
from outboxkit.events import schema_check

SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}}}


def test_the_first_field_at_fault_is_named():
    schema_check.check_payload("order.placed", SCHEMA, {"items": [1, 2]})
    with pytest.raises(InvalidEventError, match=r"^payload\.items\[1\]: order\.placed: 'x' is not of type 'integer'"):
        schema_check.check_payload("order.placed", SCHEMA, {"items": [1, "x", "y"]})


def test_without_jsonschema_a_schema_check_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "jsonschema", None)
    schema_check._validator.cache_clear()
    with pytest.raises(ConfigurationError, match=r"pip install 'outboxkit\[events\]'"):
        schema_check.check_payload("order.placed", {"type": "object", "title": "unseen"}, {})
    with pytest.raises(ConfigurationError, match="jsonschema"):
        schema_check.check_schema(SCHEMA)
