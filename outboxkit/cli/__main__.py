"""``python -m outboxkit.cli``: the same as the ``outboxkit`` command."""

from outboxkit.cli import main

raise SystemExit(main())
