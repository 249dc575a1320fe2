"""docs/architecture.md against the tree and the import-linter contract, so the map cannot drift."""

import pathlib
import re
import tomllib

import outboxkit

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(outboxkit.__file__).parent
DOC = (ROOT / "docs" / "architecture.md").read_text()
SHIMS = {"notify", "scheduled_jobs", "schedule_runner", "tracing", "webhook_signing"}


def contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return [" ".join(layer.split()) for layer in contract["layers"]]


def documented_layers() -> list[str]:
    block = DOC.split("## The layers", 1)[1].split("```", 2)[1]
    return [" ".join(line.split()) for line in block.strip().splitlines()]


def documented_modules() -> dict[str, set[str]]:
    """Each '### ... `pkg/`' section's modules; the flat section under the key ''."""
    sections: dict[str, set[str]] = {}
    body = DOC.split("## One line per module", 1)[1].split("\n## ", 1)[0]
    for section in body.split("\n### ")[1:]:
        heading, _, items = section.partition("\n")
        folder = re.search(r"`([a-z_]+)/`", heading)
        names: set[str] = set()
        for line in items.splitlines():
            if line.startswith("- "):
                lead = line[2:].split(":", 1)[0]
                names |= {name[:-3] for name in re.findall(r"`([a-z_]+\.py)`", lead)}
        sections[folder.group(1) if folder else ""] = names
    return sections


def test_the_layer_block_is_the_contract() -> None:
    assert documented_layers() == contract_layers()


def test_every_module_has_its_line_and_every_line_its_module() -> None:
    documented = documented_modules()
    tree = {"": {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"} - SHIMS}
    for package in sorted(p.parent for p in PACKAGE.glob("*/__init__.py")):
        modules = {p.stem for p in package.glob("*.py")} - {"__init__", "__main__"}
        if package.name == "cli":
            modules |= {"__init__"}
        tree[package.name] = modules
    assert documented == tree
