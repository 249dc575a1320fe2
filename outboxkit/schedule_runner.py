"""Moved to ``outboxkit.schedules.runner``; this path re-exports its names for one release (docs/changelog.md)."""

import warnings

from outboxkit.schedules.runner import *  # noqa: F403
from outboxkit.schedules.runner import __all__  # noqa: F401

warnings.warn(
    "outboxkit.schedule_runner moved to outboxkit.schedules.runner; import from there (this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
