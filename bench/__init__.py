"""Benchmarks against the real database; each prints one JSON object on its last line."""
