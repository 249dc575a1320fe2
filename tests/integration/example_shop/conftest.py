"""Configure outboxkit's pytest plugin for the shop: its models, and the server to create test databases on.

An application sets OUTBOXKIT_TEST_DATABASE_URL instead of overriding
``outboxkit_server_url``; this suite finds its server the way the rest of
the suite does (tests/support/database.py).
"""

from __future__ import annotations

import pytest

from tests.integration.example_shop.models import ShopBase
from tests.support.database import server_url


@pytest.fixture(scope="session")
def outboxkit_metadata():
    return ShopBase.metadata


@pytest.fixture(scope="session")
def outboxkit_server_url() -> str:
    return server_url()
