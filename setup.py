"""The compiled parts (everything else is in pyproject.toml), both optional: without a C
compiler the install still succeeds and the same code runs as plain Python.

- ``otel_plumb.receive._otlp_native``: the OTLP decoder, in C.
- The core modules in ``COMPILED_CORE``, compiled from their own source by mypyc (the
  compiler of type-annotated Python that ships with mypy), into ``otel_plumb/_core__mypyc``
  and one small module per source file. The .py files stay beside them: ``otel_plumb/__init__``
  imports those instead when ``OTEL_PLUMB_PURE_PYTHON=1``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The per-span stages and the loops that drive them in the live processor, replay, coverage and
# span annotation, and the decided trajectory's record (verdict log, Watch, store): where mypyc
# measured a gain (bench/replay.py, bench/live.py). Modules at the I/O edges (asyncio, gRPC,
# SQLite) stay interpreted.
COMPILED_CORE = [
    "otel_plumb/model/span.py",
    "otel_plumb/model/trajectory.py",
    "otel_plumb/model/verdict.py",
    "otel_plumb/model/decided.py",
    "otel_plumb/model/placeholders.py",
    *sorted(str(p) for p in Path("otel_plumb/normalise").glob("*.py") if p.name != "__init__.py"),
    "otel_plumb/assemble/buffers.py",
    "otel_plumb/assemble/trajectory.py",
    "otel_plumb/intake/intake.py",
    "otel_plumb/processor/spans.py",
    "otel_plumb/check/checks.py",
    "otel_plumb/check/decide.py",
    "otel_plumb/check/early.py",
    "otel_plumb/check/expr.py",
    "otel_plumb/check/policy.py",
    "otel_plumb/check/reference.py",
    "otel_plumb/check/regex.py",
    "otel_plumb/check/values.py",
    "otel_plumb/export/annotate.py",
    "otel_plumb/export/counts.py",
    "otel_plumb/report/coverage.py",
    "otel_plumb/report/records.py",
    "otel_plumb/replay.py",
]
PURE_PYTHON_ENV = "OTEL_PLUMB_PURE_PYTHON"
# Commands that build nothing (pip asks for the metadata first): mypy need not run for them.
METADATA_ONLY = {"egg_info", "dist_info", "sdist"}
CORE_GROUP = "otel_plumb._core"
# Not the project's mypy config: the build runs without the dependencies installed (their types
# are Any there), where the strict checks CI runs would fail on what they cannot see; and
# without site-packages, so that a build in a development environment compiles the same code.
MYPY_OPTIONS = [
    f"--config-file={os.devnull}",
    "--no-site-packages",
    "--ignore-missing-imports",
    "--python-version=3.11",
]


def _compiled_core() -> list[Extension]:
    """The mypyc extensions, or none (no mypy in the build environment, a pure-Python build
    asked for, or mypy refused the source)."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0") or METADATA_ONLY.intersection(sys.argv[1:2]):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("otel-plumb: mypyc not available; the core runs as plain Python")
        return []
    try:
        extensions: list[Extension] = mypycify(
            [*MYPY_OPTIONS, *COMPILED_CORE], group_name=CORE_GROUP, opt_level="3"
        )
    except (Exception, SystemExit) as exc:  # mypy exits on a type error
        print(f"otel-plumb: mypyc could not compile the core ({exc}); it runs as plain Python")
        return []
    return extensions


class BuildExt(build_ext):  # type: ignore[misc]
    """Each compiled part is all or nothing: if one of the core's extensions fails to build,
    none of them is installed (a module compiled without its shared library cannot import)."""

    def build_extensions(self) -> None:
        core = [ext for ext in self.extensions if getattr(ext, "_plumb_core", False)]
        self.extensions = [ext for ext in self.extensions if ext not in core]
        super().build_extensions()
        built: list[str] = []
        for ext in core:
            try:
                self.build_extension(ext)
            except Exception as exc:  # the compiler failed: fall back to the interpreted core
                print(f"otel-plumb: building {ext.name} failed ({exc}); the core runs as plain Python")
                for path in built:
                    Path(path).unlink(missing_ok=True)
                return
            built.append(self.get_ext_fullpath(ext.name))
        self.extensions += core  # what an editable install copies into the source tree


def _mark(extensions: list[Extension]) -> list[Extension]:
    for ext in extensions:
        ext._plumb_core = True  # type: ignore[attr-defined]
    return extensions


ext_modules: list[Any] = [
    Extension(
        "otel_plumb.receive._otlp_native",
        ["otel_plumb/receive/_otlp_native.c"],
        optional=True,
        extra_compile_args=["-O2", "-Wall", "-Wno-missing-field-initializers"],
    ),
    *_mark(_compiled_core()),
]

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExt})
