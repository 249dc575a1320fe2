"""Moved to ``outboxkit.transports.signing``; this path re-exports its names for one release (docs/changelog.md)."""

import warnings

from outboxkit.transports.signing import *  # noqa: F403
from outboxkit.transports.signing import __all__  # noqa: F401

warnings.warn(
    "outboxkit.webhook_signing moved to outboxkit.transports.signing; import from there (this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
