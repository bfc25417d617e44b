"""The compiled core (setup.py: the per-span modules compiled by mypyc) against the same source
interpreted (OTEL_PLUMB_PURE_PYTHON=1): every captured fixture, and generated hostile spans,
give the same normalised spans, trajectories, early failures and verdicts in both.

Each core runs in a child process (tests/compiled_core_worker.py): one process cannot hold
both, since the modules import each other by name."""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from test_normalise_hostile import CASES, spans_for

import otel_plumb
from otel_plumb.model.span import SpanRecord
from otel_plumb.receive.files import read_batches

TESTS = Path(__file__).parent
FIXTURES = sorted((TESTS / "fixtures").rglob("*.jsonl"))
# Modules setup.py compiles (COMPILED_CORE), by import name.
COMPILED = [
    "otel_plumb.model.trajectory", "otel_plumb.normalise.dispatch", "otel_plumb.normalise.messages",
    "otel_plumb.assemble.buffers", "otel_plumb.assemble.trajectory", "otel_plumb.intake.intake",
    "otel_plumb.check.checks", "otel_plumb.check.early", "otel_plumb.check.expr", "otel_plumb.check.policy",
    "otel_plumb.check.reference",
]  # fmt: skip


def _core_in_child(pure: str) -> str:
    code = f"import importlib, otel_plumb; ms = [importlib.import_module(m) for m in {COMPILED!r}]; " + (
        "print(otel_plumb.core(), sorted({m.__file__.rpartition('.')[2] for m in ms}))"
    )
    env = {**os.environ, otel_plumb.PURE_PYTHON_ENV: pure}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _built() -> bool:
    return any(Path(otel_plumb.__file__).parent.rglob("*__mypyc*.so"))


def test_the_compiled_core_runs_when_built_and_its_source_when_forced() -> None:
    assert _core_in_child("1") == "pure-python ['py']"
    assert _core_in_child("0") == ("compiled ['so']" if _built() else "pure-python ['py']")


class Worker:
    def __init__(self, pure: bool) -> None:
        env = {**os.environ, otel_plumb.PURE_PYTHON_ENV: "1" if pure else "0", "PYTHONHASHSEED": "0"}
        self.proc = subprocess.Popen(
            [sys.executable, str(TESTS / "compiled_core_worker.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env,
        )  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.core = self.stdout.read(16).decode().strip()

    def run(self, spans: list[SpanRecord]) -> str:
        body = pickle.dumps(spans)
        self.stdin.write(len(body).to_bytes(8, "big") + body)
        self.stdin.flush()
        n = int.from_bytes(self.stdout.read(8), "big")
        return self.stdout.read(n).decode()

    def stop(self) -> None:
        self.stdin.close()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def cores() -> Iterator[tuple[Worker, Worker]]:
    if not _built():
        pytest.skip("the compiled core is not built (no C compiler at install): nothing to compare")
    compiled, pure = Worker(pure=False), Worker(pure=True)
    try:
        assert (compiled.core, pure.core) == ("compiled", "pure-python")
        yield compiled, pure
    finally:
        compiled.stop()
        pure.stop()


def _traces(path: Path) -> list[list[SpanRecord]]:
    by_trace: dict[str, list[SpanRecord]] = {}
    for batch in read_batches(path):
        for item in batch:
            if isinstance(item, SpanRecord):
                by_trace.setdefault(item.trace_id, []).append(item)
    return list(by_trace.values())


def test_every_captured_fixture_gives_the_same_in_both(cores: tuple[Worker, Worker]) -> None:
    compiled, pure = cores
    compared = 0
    for path in FIXTURES:
        for spans in _traces(path):
            for order in (spans, spans[::-1]):
                assert compiled.run(order) == pure.run(order), f"{path.relative_to(TESTS)}: trace {spans[0].trace_id}"
                compared += 1
    assert compared > 200  # every framework's fixtures were read


@pytest.mark.parametrize("reader", sorted(CASES))
def test_generated_hostile_spans_give_the_same_in_both(cores: tuple[Worker, Worker], reader: str) -> None:
    compiled, pure = cores

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(spans_for(CASES[reader], True, 3))
    def run(spans: list[SpanRecord]) -> None:
        assert compiled.run(spans) == pure.run(spans)

    run()


def test_type_checks_take_a_tuple_of_types_not_a_union() -> None:
    """Compiled, ``isinstance(x, (A, B))`` is a C type check per type, while ``isinstance(x, A | B)``
    builds the union and goes through its ``__instancecheck__`` on every call (about 500
    instructions, on paths that run per step of every trajectory): the package keeps to tuples."""
    package = Path(otel_plumb.__file__).parent
    unions = [
        f"{path.relative_to(package.parent)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        if "proto_gen" not in path.parts
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2
        and isinstance(node.args[1], ast.BinOp) and isinstance(node.args[1].op, ast.BitOr)
    ]  # fmt: skip
    assert unions == []


def test_tuple_constants_say_their_tuple_type() -> None:
    """A constant tuple declared ``Final`` alone is inferred fixed-length (``tuple[str, str]``),
    which compiled code holds unboxed and builds again as a tuple object wherever it is used as
    one (iterated, ``in``, passed on): for 14 floats, 14 float objects per call. ``tuple[T, ...]``
    is one object made once; a fixed-length type is for a constant used by position only."""
    package = Path(otel_plumb.__file__).parent
    implicit = [
        f"{path.relative_to(package.parent)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        if "proto_gen" not in path.parts
        for node in ast.parse(path.read_text(), str(path)).body
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Tuple)
        and isinstance(node.annotation, ast.Name) and node.annotation.id == "Final"
    ]  # fmt: skip
    assert implicit == []
