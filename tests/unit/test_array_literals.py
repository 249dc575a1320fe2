"""Array literals for the drain's batched writes: PostgreSQL's array input grammar, every text quoted and escaped.

That the server reads them back exactly is tested against a real database in
tests/integration/test_drain_grouped_outcomes.py.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

from outboxkit.storage.array_literals import integer_array, text_array


def test_integers_and_nulls():
    assert integer_array([1, None, -5, 2**40]) == "{1,NULL,-5,1099511627776}"
    assert integer_array([]) == "{}"
    assert integer_array(iter([200])) == "{200}"


@pytest.mark.parametrize("value", [1.5, "1", b"1"])
def test_an_integer_array_refuses_anything_but_integers(value):
    with pytest.raises(TypeError):
        integer_array([value])


def test_every_text_is_quoted_and_its_backslashes_and_quotes_escaped():
    texts = ['say "no"', "back\\slash", "{a},b", "NULL", "", None]
    assert text_array(texts) == r'{"say \"no\"","back\\slash","{a},b","NULL","",NULL}'


def test_uuids_and_timestamps_are_written_by_their_str():
    token = uuid.UUID("12345678-1234-5678-1234-567812345678")
    at = datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc)
    assert text_array([token, at]) == '{"12345678-1234-5678-1234-567812345678","2030-01-02 03:04:05.000006+00:00"}'
