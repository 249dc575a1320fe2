"""Test helpers: databases, a real HTTP receiver, worker processes."""
