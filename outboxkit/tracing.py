"""Moved to ``outboxkit.telemetry.tracing``; this path re-exports its names for one release (docs/changelog.md)."""

import warnings

from outboxkit.telemetry.tracing import *  # noqa: F403
from outboxkit.telemetry.tracing import __all__  # noqa: F401

warnings.warn(
    "outboxkit.tracing moved to outboxkit.telemetry.tracing; import from there (this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
