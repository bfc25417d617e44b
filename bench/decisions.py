"""Backend calls per second: the same 3,000-case contract (mock backend, golden gates and
properties) run through DecGuard 0.1.1 and through ``otel_plumb.decision`` in one process.

    python bench/decisions.py [--cases 3000]

Calls are counted at each implementation's mock ``predict``; the rate is calls divided by the
wall time of the whole run (golden cases, transformations, minimisation, report). Both must
give the same gate statuses; the script says so, or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CONTRACT = """\
schema_version: "0.1"
decision:
  type: choice
  name: ticket_route
  options: [billing, technical, account]
backend: {provider: mock, seed: 11, position_bias: 0.2}
dataset: cases.jsonl
evaluation: {confidence_threshold: 0.5}
requirements: {min_accuracy: 0.3}
properties:
  option_order: {samples: 2, max_tv_distance: 0.05, max_flip_rate: 0.2}
  label_format: {styles: [upper, quoted], max_tv_distance: 0.01}
  whitespace: {edits: 2, samples: 1, max_tv_distance: 0.3}
fuzz: {seed: 1, max_minimize_calls: 4}
"""
TEXTS = ("My invoice is wrong.", "The app crashes. Please help!", "Change my email.", "Refund order {n} now.")


def write_contract(folder: Path, n: int) -> Path:
    labels = ("billing", "technical", "account")
    with (folder / "cases.jsonl").open("w") as out:
        for i in range(n):
            text = TEXTS[i % len(TEXTS)].format(n=i) + f" Ticket {i}."
            out.write(json.dumps({"id": f"c{i}", "input": text, "expected": labels[i % 3]}) + "\n")
    path = folder / "contract.yaml"
    path.write_text(CONTRACT)
    return path


@contextlib.contextmanager
def counting(cls: Any, method: str) -> Iterator[list[int]]:
    """Count calls of ``cls.method`` (the backend's answer) while the block runs."""
    calls = [0]
    original = getattr(cls, method)

    def counted(self, request):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return original(self, request)

    setattr(cls, method, counted)
    try:
        yield calls
    finally:
        setattr(cls, method, original)


def run_decguard(path: Path) -> tuple[int, float, float, list[str]]:
    from decguard.backends.mock import MockBackend
    from decguard.engine import run_test

    with counting(MockBackend, "predict") as calls:
        start, cpu = time.perf_counter(), time.process_time()
        report = run_test(path, mode="all")
        report.model_dump_json()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return calls[0], elapsed, cpu, [c.status.value for c in report.checks]


def run_ours(path: Path) -> tuple[int, float, float, list[str]]:
    from otel_plumb.decision.backends.mock import MockBackend
    from otel_plumb.decision.contract import load_contract
    from otel_plumb.decision.report import dumps, run_and_report

    with counting(MockBackend, "answer") as calls:
        start, cpu = time.perf_counter(), time.process_time()
        report = asyncio.run(run_and_report(load_contract(path), mode="all"))
        dumps(report, indent=False)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return calls[0], elapsed, cpu, [c["status"] for c in report["checks"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = write_contract(Path(folder), args.cases)
        dg_calls, dg_time, dg_cpu, dg_checks = run_decguard(path)
        op_calls, op_time, op_cpu, op_checks = run_ours(path)
    print(f"cases: {args.cases} (wall clock, and CPU time of this process, which a busy machine disturbs less)")
    for name, calls, wall, cpu in (
        ("decguard 0.1.1", dg_calls, dg_time, dg_cpu),
        ("otel-plumb", op_calls, op_time, op_cpu),
    ):
        print(
            f"{name:<16} {calls:>7} calls  wall {wall:6.2f} s = {calls / wall:>7.0f} calls/s"
            f"  cpu {cpu:6.2f} s = {calls / cpu:>7.0f} calls/s"
        )
    print(
        f"ratio            wall {dg_time / op_time * op_calls / dg_calls:.1f}x"
        f"  cpu {dg_cpu / op_cpu * op_calls / dg_calls:.1f}x (target >= 3x)"
    )
    if dg_checks != op_checks:
        raise SystemExit(f"gate statuses differ: decguard {dg_checks} vs otel-plumb {op_checks}")
    print(f"gate statuses    identical ({len(op_checks)} checks)")


if __name__ == "__main__":
    main()
