"""Values built once per outbox class (its compiled statements) and kept for the life of the process.

Compiling an outbox's statements costs more than running most of them, and an outbox class never
changes once mapped, so each statement family is built on first use and shared by every caller.  Two
threads that miss at once may both build; ``setdefault`` keeps the first, so every caller sees one.
"""

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PerOutbox"]

Key = TypeVar("Key")
Value = TypeVar("Value")


class PerOutbox(Generic[Key, Value]):
    """``cache(key)``: the value ``build(key)`` made for ``key`` the first time it was asked for."""

    def __init__(self, build: Callable[[Key], Value]) -> None:
        self._build = build
        self._values: dict[Key, Value] = {}

    def __call__(self, key: Key) -> Value:
        value = self._values.get(key)
        if value is None:
            value = self._values.setdefault(key, self._build(key))
        return value
