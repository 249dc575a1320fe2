"""An unknown job name raises the kit's own error, on a kit over a real database.

The public API itself (``__all__``, docstrings, the error tree) is pinned in tests/unit/test_public_api.py.
"""

from __future__ import annotations

import pytest

import outboxkit
from outboxkit import errors


def test_an_unknown_job_raises_unknown_job_error(engine):
    from tests.support.models import SampleEvent

    with outboxkit.OutboxKit(engine, [SampleEvent], transport=outboxkit.CallableTransport(lambda d, k: 200)) as kit:
        with pytest.raises(errors.UnknownJobError, match="no job 'nightly'; registered: outboxkit.drain.sample-events"):
            kit.scheduler.job("nightly")
        with pytest.raises(LookupError):
            kit.scheduler.remove_job("nightly")
