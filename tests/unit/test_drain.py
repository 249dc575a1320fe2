"""The claim statement's shape and the lease rule, read without a database.

The drain's invariants (DESIGN.md section 3) against real PostgreSQL are in tests/integration/test_drain.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from outboxkit import ConfigurationError
from outboxkit.model import LEASE_MARGIN_SECONDS
from outboxkit.storage import drain_queries as queries
from tests.support.models import SampleEvent

# -- claim ------------------------------------------------------------------------


def test_claim_statement_skips_locked_rows_takes_oldest_first_and_stamps_the_claim():
    statement = " ".join(queries.claim_sql("{table}").split())
    assert "FOR UPDATE SKIP LOCKED" in statement
    assert "WHERE status = 'pending' AND destination = wants.destination AND next_attempt_at <= :now" in statement
    assert "CASE WHEN shares.found > 1 THEN least(shares.rows," in statement  # a share of the batch each
    assert "ORDER BY destination, next_attempt_at, id LIMIT least(wants.take, COALESCE(grants.granted, wants.take))" in (
        statement  # within the destination's rate-limit tokens
    )
    assert "greatest(0, :cap - (SELECT count(*) FROM {table} WHERE claimed_until > :now" in statement  # room under the cap
    assert "ORDER BY turn, next_attempt_at, id LIMIT :limit" in statement  # in turns across destinations
    assert "claim_token = :token" in statement
    assert "claimed_until = :lease_until" in statement
    assert "next_attempt_at = :lease_until" in statement
    assert "attempts = outbox.attempts + 1" in statement


def test_the_lease_must_outlast_the_slowest_batch():
    options = SampleEvent.__outbox__
    # Every round of sends timing out, plus a margin: a live worker's rows are never claimed twice.
    assert options.lease_seconds == options.minimum_lease
    rounds = math.ceil(options.batch_size / options.concurrency)
    assert options.minimum_lease == rounds * options.timeout + LEASE_MARGIN_SECONDS
    with pytest.raises(ConfigurationError, match="lease"):
        dataclasses.replace(options, lease=options.minimum_lease - 1)
    assert dataclasses.replace(options, lease=options.minimum_lease + 60).lease_seconds == options.minimum_lease + 60
