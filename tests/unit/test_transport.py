"""How ``Delivery.json`` is encoded: a documented set of types, and a named field for anything else.

These tests pin each rule; tests/integration/test_transport.py drives a real
drain, so values read from columns arrive as the documented strings.
"""

from __future__ import annotations

import enum
import json
import uuid
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from outboxkit import Delivery, InvalidDeliveryError

URL = "http://127.0.0.1:1/hook"


class Colour(enum.Enum):
    RED = "red"


class Size(enum.IntEnum):
    LARGE = 3


class Plan(enum.Enum):
    PRO = {"seats": 5}


def body(value: object) -> object:
    encoded = Delivery(url=URL, json=value).body()
    assert encoded is not None
    return json.loads(encoded)


@pytest.mark.parametrize(
    ("value", "sent"),
    [
        (datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc), "2030-01-02T03:04:05+00:00"),
        (datetime(2030, 7, 1, 9, 30, tzinfo=ZoneInfo("Europe/Berlin")), "2030-07-01T09:30:00+02:00"),
        (datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=timezone(timedelta(hours=-5))), "2030-01-02T03:04:05.123456-05:00"),
        (date(2030, 1, 2), "2030-01-02"),
        (time(9, 30), "09:30:00"),
        (time(9, 30, tzinfo=timezone.utc), "09:30:00+00:00"),
        (uuid.UUID("12345678-1234-5678-1234-567812345678"), "12345678-1234-5678-1234-567812345678"),
        (Decimal("10.50"), "10.50"),
        (Decimal("-0.000001"), "-0.000001"),
        (Decimal("1E+3"), "1000"),
        (Decimal("12345678901234567890.123456789"), "12345678901234567890.123456789"),
        (Colour.RED, "red"),
        (Size.LARGE, 3),
        (Plan.PRO, {"seats": 5}),
        ((1, "two"), [1, "two"]),
        ({"nested": [(Decimal("1.10"), Colour.RED)]}, {"nested": [["1.10", "red"]]}),
    ],
)
def test_a_supported_type_is_encoded_as_documented(value, sent):
    assert body({"field": value}) == {"field": sent}


def test_plain_json_is_encoded_compactly_as_before():
    assert Delivery(url=URL, json={"a": [1, 2.5, None, True], "b": "ü"}).body() == b'{"a":[1,2.5,null,true],"b":"\\u00fc"}'


def test_enum_and_number_keys_become_strings():
    assert body({Colour.RED: 1, 2: "two"}) == {"red": 1, "2": "two"}


def test_the_body_is_fixed_when_the_delivery_is_built():
    payload = {"items": [1]}
    delivery = Delivery(url=URL, json=payload)
    payload["items"].append(datetime(2030, 1, 1))  # would be refused; the delivery already holds its body
    assert delivery.body() == b'{"items":[1]}'


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        (
            {"items": [{"price": 1}, {"price": 2}, {"price": datetime(2030, 1, 1, 12)}]},
            r"Delivery.json\['items'\]\[2\]\['price'\] is a naive datetime \(2030-01-01T12:00:00\), "
            r"so its time zone is unknown; give it one \(e.g. tzinfo=timezone.utc\)",
        ),
        ({"tags": {"a", "b"}}, r"Delivery.json\['tags'\] is a set, .*make it a list \(sorted\(...\)\)"),
        ({"raw": b"\x00"}, r"Delivery.json\['raw'\] is a bytes, .*decode or base64 it"),
        ({"wait": timedelta(minutes=5)}, r"Delivery.json\['wait'\] is a timedelta, .*convert it to a JSON type"),
        ({"when": [object()]}, r"Delivery.json\['when'\]\[0\] is a object"),
        ({"amount": Decimal("NaN")}, r"Delivery.json\['amount'\] is Decimal\('NaN'\); JSON has no NaN or infinity"),
        ({"amount": float("inf")}, r"Delivery.json\['amount'\] is inf; JSON has no NaN or infinity"),
        ({(1, 2): "pair"}, r"Delivery.json has a key \(1, 2\) of type tuple"),
        ([{"colour": Colour.RED, "at": datetime(2030, 1, 1)}], r"Delivery.json\[0\]\['at'\] is a naive datetime"),
    ],
)
def test_anything_else_is_refused_naming_the_field(value, complaint):
    with pytest.raises(InvalidDeliveryError, match=rf"^Delivery.json cannot be encoded as JSON: .*{complaint}"):
        Delivery(url=URL, json=value)


def test_a_circular_structure_is_refused():
    loop: dict = {"a": 1}
    loop["self"] = loop
    with pytest.raises(InvalidDeliveryError, match=r"Delivery.json\['self'\] contains itself"):
        Delivery(url=URL, json=loop)


def test_the_refusal_is_a_value_error_for_existing_handlers():
    with pytest.raises(ValueError):
        Delivery(url=URL, json={"at": datetime(2030, 1, 1)})
