"""The package's shape: subsystems as packages, logger names equal to module paths, old paths kept for one release."""

import ast
import importlib
import pathlib
import warnings

import pytest

import outboxkit

PACKAGE = pathlib.Path(outboxkit.__file__).parent

# Old module path -> new one: each re-exports the new module's names and warns, for one release.
MOVED = {
    "outboxkit.notify": "outboxkit.storage.notify",
    "outboxkit.scheduled_jobs": "outboxkit.schedules.jobs",
    "outboxkit.schedule_runner": "outboxkit.schedules.runner",
    "outboxkit.tracing": "outboxkit.telemetry.tracing",
    "outboxkit.webhook_signing": "outboxkit.transports.signing",
}


def library_modules() -> list[pathlib.Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations/versions" not in p.as_posix())


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_a_moved_module_path_still_imports_its_names_and_says_where_they_went(old: str, new: str) -> None:
    moved_to = importlib.import_module(new)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import sys

        sys.modules.pop(old, None)
        kept = importlib.import_module(old)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)
    assert kept.__all__ == moved_to.__all__
    for name in moved_to.__all__:
        assert getattr(kept, name) is getattr(moved_to, name)


def test_every_logger_is_named_after_its_module() -> None:
    """Logger names equal module paths: filtering on ``outboxkit.drain`` takes every line of the drain."""
    wrong = []
    for path in library_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and node.args
                # __package__ names the package's own logger: the one a handler for every kit line goes on.
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("__name__", "__package__"))
            ):
                wrong.append(f"{module_name(path)}:{node.lineno}")
    assert wrong == []


def test_the_top_level_holds_only_the_public_face_and_the_moved_paths() -> None:
    """Subsystems live in packages; the flat modules are the public face, the rules below the row, and old paths."""
    flat = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    face = {"kit", "model", "enqueue", "integration", "pytest_plugin", "errors", "results", "version",
            "clock", "policy", "breaker", "rate_limits", "url_guard", "target_secrets"}
    assert flat == face | {name.split(".")[1] for name in MOVED}


def test_every_package_opens_with_a_map() -> None:
    for init in sorted(PACKAGE.rglob("__init__.py")):
        if "migrations/versions" in init.as_posix():
            continue
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(docstring.splitlines()) >= 3, f"{module_name(init)} has no map in its docstring"
