"""The top-level API is exactly what an application needs, and every error the kit raises has one root."""

from __future__ import annotations

import ast
import builtins
import inspect
from datetime import datetime, timezone
from pathlib import Path

import pytest

import outboxkit
from outboxkit import errors

# Written out on its own, not derived from the package: a name added or dropped there must be a decision here too.
PUBLIC_API = {
    "Outbox", "OutboxOptions", "outbox_table_args",                                     # the model
    "enqueue", "enqueue_async", "enqueue_many",                                         # the enqueue fast path
    "Delivery", "Transport", "HttpTransport", "CallableTransport", "AttemptResult", "FailureKind",  # sending
    "OutboxKit", "OutboxKitSettings", "OutboxOverride", "Drainer", "DrainResult", "DrainWorker", "database_url",  # the kit
    "Clock", "SystemClock", "ManualClock",                                              # time
    "JobContext", "cron", "every", "calendar_interval", "once",                         # scheduled jobs
    "OutboxKitError", "ConfigurationError", "InvalidValueError", "InvalidDeliveryError", "InvalidTypeError",  # errors
    "DeliveryBuildError", "UnknownOutboxError", "UnknownJobError", "LifecycleError", "KitClosedError", "JobFailed",
    "InvalidScheduleError", "UnknownScheduleError",                                     # schedule errors
    "EventDelivery", "KitEvents", "SubscriptionDefinition", "publish",                  # events and subscriptions
    "InvalidSubscriptionError", "InvalidEventError", "UnknownSubscriptionError",        # their errors
}  # fmt: skip

PACKAGE = Path(outboxkit.__file__).resolve().parent


def test_all_is_exactly_the_public_api():
    assert set(outboxkit.__all__) == PUBLIC_API
    assert len(outboxkit.__all__) == len(set(outboxkit.__all__))


def test_every_public_name_imports():
    namespace: dict[str, object] = {}
    exec("from outboxkit import *", namespace)  # noqa: S102  (what `import *` users get)
    assert set(PUBLIC_API) <= set(namespace)
    for name in PUBLIC_API:
        assert getattr(outboxkit, name) is namespace[name]


def test_public_names_have_docstrings():
    for name in PUBLIC_API:
        value = getattr(outboxkit, name)
        assert inspect.getdoc(value), f"outboxkit.{name} has no docstring"


def test_internals_are_not_exported():
    for internal in ("Decision", "RetryPolicy", "drain_once", "OutboxQueries", "JobRunner", "LeaderElection"):
        assert internal not in outboxkit.__all__


# -- one error tree ----------------------------------------------------------------


def test_every_error_class_derives_from_the_root():
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.OutboxKitError), name


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (errors.InvalidValueError, ValueError),
        (errors.InvalidDeliveryError, ValueError),
        (errors.InvalidTypeError, TypeError),
        (errors.DeliveryBuildError, TypeError),
        (errors.UnknownOutboxError, LookupError),
        (errors.UnknownJobError, LookupError),
        (errors.InvalidScheduleError, ValueError),
        (errors.UnknownScheduleError, LookupError),
        (errors.LifecycleError, RuntimeError),
        (errors.KitClosedError, RuntimeError),
    ],
)
def test_an_error_is_also_the_builtin_it_replaces(error, builtin):
    """So ``except LookupError`` and friends, written before the tree existed, keep working."""
    assert issubclass(error, builtin)


def test_the_drawn_tree_names_every_error_class():
    assert errors.__doc__ is not None
    assert "The tree::\n\n    OutboxKitError\n" in errors.__doc__
    for name in set(errors.__all__) - {"OutboxKitError"}:
        assert f"── {name} " in errors.__doc__, name


def builtin_raises(path: Path) -> list[str]:
    """``raise ValueError(...)``-style statements: a builtin exception raised by the kit on purpose."""
    allowed = {"NotImplementedError", "SystemExit", "ImportError"}  # abstract methods, the CLI's exit, an install hint
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = target.id if isinstance(target, ast.Name) else None
            if name and name not in allowed and isinstance(getattr(builtins, name, None), type):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} raise {name}")
    return found


def test_the_kit_raises_no_bare_builtin_exception():
    # outboxkit/admin/ is reported separately (other owners): see the merge notes.
    modules = [*PACKAGE.glob("*.py"), *PACKAGE.glob("testing/*.py")]  # the testing kit is a package
    assert [raise_ for path in modules for raise_ in builtin_raises(path)] == []


def test_bad_values_raise_invalid_value_error():
    clock = outboxkit.ManualClock(datetime(2030, 1, 1, tzinfo=timezone.utc))
    with pytest.raises(errors.InvalidValueError, match="only moves forward"):
        clock.advance(seconds=-1)
    with pytest.raises(errors.InvalidValueError, match="needs an aware datetime"):
        outboxkit.ManualClock(datetime(2030, 1, 1))
    with pytest.raises(errors.InvalidDeliveryError, match="absolute http"):
        outboxkit.Delivery(url="ftp://example.com/")
