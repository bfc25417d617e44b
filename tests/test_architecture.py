"""docs/architecture.md's import table is the rule: every import between otel_plumb's packages
must be listed there, and every package must have a row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "otel_plumb"


def _rules() -> dict[str, set[str] | None]:
    """package -> what it may import (None: anything), from the doc's table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rules: dict[str, set[str] | None] = {}
    for name, allowed in re.findall(r"^\| `([\w.]+)` \|([^|\n]*)\|$", text, flags=re.M):
        rules[name] = None if allowed.strip() == "anything" else set(re.findall(r"`([\w.]+)`", allowed))
    return rules


def _imports(path: Path) -> set[str]:
    """The otel_plumb packages a module imports (``processor.config`` kept apart from ``processor``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        modules: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module] if node.module != "otel_plumb" else [f"otel_plumb.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        for module in modules:
            parts = module.split(".")
            if parts[0] != "otel_plumb":
                continue
            if len(parts) == 1 or not ((PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").exists()):
                out.add("otel_plumb")  # the package root (its version)
            elif parts[1] == "processor" and len(parts) > 2 and parts[2] == "config":
                out.add("processor.config")
            else:
                out.add(parts[1])
    return out


def _package_of(path: Path) -> str:
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py")


def test_every_package_has_a_row_in_the_table() -> None:
    rules = _rules()
    packages = {_package_of(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert packages - set(rules) == set(), "packages missing from docs/architecture.md's import table"


def test_every_import_between_packages_is_allowed_by_the_table() -> None:
    rules = _rules()
    broken = []
    for path in sorted(PACKAGE.rglob("*.py")):
        package = _package_of(path)
        allowed = rules.get(package, set())
        if allowed is None:
            continue
        for target in sorted(_imports(path) - {package}):
            if target.startswith("processor.") and package == "processor":
                continue
            if target not in allowed and not (target == "processor.config" and "processor" in allowed):
                broken.append(f"{path.relative_to(ROOT)} imports {target}")
    assert broken == []


def test_the_core_imports_no_edge_package() -> None:
    """The doc's table could be edited to allow it; this rule is the architecture itself."""
    core = {
        "model", "normalise", "assemble", "intake", "check", "stats", "redact", "consistency", "yamlfile", "suggest"
    }  # fmt: skip
    rules = _rules()
    for package in core:
        allowed = rules[package]
        assert allowed is not None and allowed <= core, f"{package} may import only the core"
