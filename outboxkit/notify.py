"""Moved to ``outboxkit.storage.notify``; this path re-exports its names for one release (docs/changelog.md)."""

import warnings

from outboxkit.storage.notify import *  # noqa: F403
from outboxkit.storage.notify import __all__  # noqa: F401

warnings.warn(
    "outboxkit.notify moved to outboxkit.storage.notify; import from there (this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
