"""The diagnostics describe only missing tables and columns, not other exceptions.

The real schema errors are in tests/integration/test_diagnostics.py.
"""

from __future__ import annotations

from outboxkit.storage.diagnostics import describe_database_error
from tests.support.models import SampleEvent


def test_other_exceptions_are_not_described():
    assert describe_database_error(ValueError("no sqlstate"), SampleEvent) is None
    assert describe_database_error(RuntimeError("wrapped"), None) is None
