"""Event types in the catalog may carry a JSON Schema, checked at publish in the caller's transaction; a strict
publish refuses a type the catalog does not list."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from outboxkit import InvalidEventError, publish
from tests.support.events import definition, events_kit  # noqa: F401  (fixture)

INVOICE = {
    "type": "object",
    "required": ["invoice", "amount"],
    "properties": {
        "invoice": {"type": "string"},
        "amount": {"type": "integer", "minimum": 0},
        "lines": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}}}},
    },
}


@pytest.fixture
def catalog(events_kit):
    events_kit.events.catalog.define("invoice.paid", schema=INVOICE, description="An invoice was paid", actor="a")
    events_kit.events.subscriptions.create(definition("http://127.0.0.1:9/", "invoice.*"), actor="a")
    return events_kit


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        ({"invoice": "in_1"}, "payload", "'amount' is a required property"),
        ({"invoice": "in_1", "amount": -5}, "payload.amount", "-5 is less than the minimum of 0"),
        ({"invoice": "in_1", "amount": 1, "lines": [{"sku": "a"}, {"sku": 7}]}, "payload.lines[1].sku", "7 is not of type"),
    ],
)
def test_a_payload_against_its_schema_is_refused_naming_the_field_and_nothing_is_written(catalog, payload, field, message):
    with Session(catalog.engine) as session, session.begin():
        with pytest.raises(InvalidEventError, match=message) as refused:
            publish(session, "invoice.paid", payload)
        assert refused.value.field == field
    assert catalog.counts()["events"] == 0 and catalog.deliveries() == []


def test_a_valid_payload_is_published(catalog):
    with Session(catalog.engine) as session, session.begin():
        assert publish(session, "invoice.paid", {"invoice": "in_1", "amount": 3}).deliveries == 1


def test_a_strict_publish_refuses_a_type_the_catalog_does_not_list(catalog):
    with Session(catalog.engine) as session, session.begin():
        with pytest.raises(InvalidEventError, match="'invoice.voided' is not in the catalog") as refused:
            publish(session, "invoice.voided", {}, strict=True)
        assert refused.value.field == "event_type"
        assert publish(session, "invoice.voided", {}).deliveries == 1  # not strict: types need no definition
    assert catalog.counts()["events"] == 1


def test_an_invalid_schema_is_refused_when_defined(events_kit):
    with pytest.raises(InvalidEventError, match="^schema: not a valid JSON Schema"):
        events_kit.events.catalog.define("invoice.paid", schema={"type": "no-such-type"}, actor="a")
    assert events_kit.events.catalog.list() == []


def test_a_definition_is_replaced_and_listed(events_kit):
    catalog = events_kit.events.catalog
    catalog.define("invoice.paid", actor="a")
    catalog.define("invoice.paid", schema=INVOICE, description="paid", actor="b")
    [entry] = catalog.list()
    assert (entry["name"], entry["schema"], entry["description"], entry["changed_by"]) == ("invoice.paid", INVOICE, "paid", "b")
    catalog.remove("invoice.paid")
    assert catalog.list() == []
