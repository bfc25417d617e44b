"""otel-plumb: check LLM agent trajectories, built from OpenTelemetry traces, against declared invariants.

The per-span core may be installed compiled (setup.py: mypyc builds an extension module beside
each of those .py files, which Python then imports first). ``OTEL_PLUMB_PURE_PYTHON=1`` runs
the .py files instead (and the pure-Python OTLP decoder); ``core()`` says which runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

__version__ = "0.1.0"

PURE_PYTHON_ENV = "OTEL_PLUMB_PURE_PYTHON"


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds an otel_plumb module's .py file even where a compiled module of that name sits
    beside it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("otel_plumb.") or path is None:
            return None
        for directory in path:
            source = importlib.machinery.FileFinder(directory, (importlib.machinery.SourceFileLoader, [".py"]))
            spec = source.find_spec(fullname)
            if spec is not None:
                return spec
        return None


def pure_python() -> bool:
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


# Decided once, when the package is imported: the modules imported then are the ones that run.
_PURE = pure_python()
if _PURE:
    sys.meta_path.insert(0, _SourceFirst())


def core() -> str:
    """The per-span core in use: "compiled" (mypyc's shared library was built, and
    ``OTEL_PLUMB_PURE_PYTHON`` was not set when the package was imported) or "pure-python"."""
    here = os.path.dirname(__file__)
    built = any(os.path.exists(os.path.join(here, f"_core__mypyc{s}")) for s in importlib.machinery.EXTENSION_SUFFIXES)
    return "compiled" if built and not _PURE else "pure-python"
