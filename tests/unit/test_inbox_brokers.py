"""The broker consumers' pieces that need no broker and no database: the message, headers, refusals at start."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from outboxkit.errors import ConfigurationError
from outboxkit.inbox.brokers import BrokerMessage, text_headers
from outboxkit.inbox.redis_streams import RedisStreamsInbox


def test_a_message_parses_its_json_body_and_says_when_it_is_not_json():
    assert BrokerMessage(message_id="m", body=b'{"amount": 5}').json() == {"amount": 5}
    with pytest.raises(ValueError):
        BrokerMessage(message_id="m", body=b"not json").json()


def test_headers_are_text_whatever_the_broker_gave():
    assert text_headers({"a": b"x", "b": 3, "c": "y"}) == {"a": "x", "b": "3", "c": "y"}
    assert text_headers(None) == {}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": ""}, "stream must be a non-empty name"),
        ({"group": None}, "group must be a non-empty name"),
        ({"max_deliveries": 0}, "max_deliveries must be a positive integer"),
        ({"max_deliveries": True}, "max_deliveries must be a positive integer"),
        ({"retry_after_seconds": 0}, "retry_after_seconds must be positive"),
    ],
)
def test_a_redis_consumer_with_a_bad_option_is_refused_at_start(options, message):
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    arguments = {"stream": "orders", "group": "billing", "consumer": "one", **options}
    with pytest.raises(ConfigurationError, match=message):
        RedisStreamsInbox(engine, source="orders", handler=lambda session, message: None, client=object(), **arguments)
