"""The example service: a small credits app that uses outboxkit.

Its models are what the demo runs, what the browser tests drive and what
the migration environment in ``alembic/`` is generated from.
"""
