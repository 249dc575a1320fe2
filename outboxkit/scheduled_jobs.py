"""Moved to ``outboxkit.schedules.jobs``; this path re-exports its names for one release (docs/changelog.md)."""

import warnings

from outboxkit.schedules.jobs import *  # noqa: F403
from outboxkit.schedules.jobs import __all__  # noqa: F401

warnings.warn(
    "outboxkit.scheduled_jobs moved to outboxkit.schedules.jobs; import from there (this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
