"""CEL expressions (``when``, ``arg_satisfies``, ``expr``), compiled once per policy.

Backed by ``common-expression-language`` (``import cel``: Rust bindings). Compilation
checks syntax, and also the names an expression uses: an unknown variable or function is
refused when the policy loads, not discovered on the first trajectory.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

import cel

# Functions of the CEL standard library this binding implements (macros such as has, all,
# exists, exists_one, map and filter are expanded by the parser and never listed).
_FUNCTIONS = frozenset(
    {
        "size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double", "string",
        "bytes", "type", "timestamp", "duration", "dyn", "getFullYear", "getMonth", "getDate",
        "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getHours", "getMinutes", "getSeconds",
        "getMilliseconds",
    }
)  # fmt: skip
_MACRO_VARIABLE = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ExpressionError(ValueError):
    """An expression that does not compile, or names something that does not exist."""


class Expression:
    """One compiled expression and the variables it reads, so callers build only those."""

    __slots__ = ("program", "source", "variables", "words")

    def __init__(self, source: str, allowed: Collection[str]) -> None:
        try:
            self.program = cel.compile(source)
        except ValueError as exc:
            first = str(exc).splitlines()
            detail = next(
                (ln.strip() for ln in first if "Syntax error" in ln or "ERROR" in ln), first[0] if first else ""
            )
            raise ExpressionError(f"CEL expression {source!r} does not compile: {detail}") from None
        self.source = source
        bound = set(_MACRO_VARIABLE.findall(source))
        names = set(self.program.variables())
        unknown = sorted(names - bound - set(allowed))
        if unknown:
            raise ExpressionError(
                f"CEL expression {source!r} uses unknown variable {unknown[0]!r} (here: {', '.join(sorted(allowed))})"
            )
        bad = sorted(f for f in self.program.functions() if f[:1].isalpha() and f not in _FUNCTIONS)
        if bad:
            raise ExpressionError(f"CEL expression {source!r} calls unknown function {bad[0]!r}")
        self.variables = frozenset(names & set(allowed))
        # Every identifier in the source: step and trajectory maps are built with only these fields.
        self.words = frozenset(_WORD.findall(source))

    def run(self, activation: Mapping[str, Any]) -> Any:
        """Evaluate; raises ``EvaluationError`` with the library's message on any failure."""
        try:
            return self.program.execute(dict(activation))
        except KeyError as exc:
            raise EvaluationError(f"no such key {exc.args[0] if exc.args else ''!r}") from None
        except Exception as exc:  # the binding raises ValueError, TypeError and RuntimeError too
            text = str(exc).splitlines()
            raise EvaluationError(f"{type(exc).__name__}: {text[0] if text else repr(exc)}") from None

    def test(self, activation: Mapping[str, Any]) -> bool:
        """Evaluate to a boolean; anything else is an ``EvaluationError``."""
        value = self.run(activation)
        if not isinstance(value, bool):
            raise EvaluationError(f"expected true or false, got {value!r}")
        return value


class EvaluationError(Exception):
    """An expression failed at run time (missing key, type mismatch): the verdict is indeterminate."""
