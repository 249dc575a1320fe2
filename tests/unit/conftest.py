"""The unit tests: no database at all, so the folder runs in seconds with no server reachable.

Every database a test gets comes from one of two session fixtures (the
suite's ``database_factory`` and the plugin's ``outboxkit_template``); a unit
test that asks for either, directly or through another fixture, fails before
it connects, naming the folder it belongs in.
"""

from __future__ import annotations

import pytest

DATABASE_FIXTURES = {"database_factory", "outboxkit_template"}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    wanted = DATABASE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    if wanted:
        pytest.fail(
            f"{item.nodeid} needs a database (fixture {', '.join(sorted(wanted))}); "
            "tests/unit runs without one: move the test to tests/integration",
            pytrace=False,
        )
