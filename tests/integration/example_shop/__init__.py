"""A small shop that uses outboxkit, tested with nothing but the public testing kit (outboxkit.testing)."""
