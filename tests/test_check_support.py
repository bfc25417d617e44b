"""Trajectories and policies built directly, shared by the check, report and gate tests (no tests here)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from otel_plumb.check import CompiledPolicy, load_policy
from otel_plumb.model import Step, Trajectory


def step(name: str, kind: str = "tool", *, args: Any = None, result: Any = None, error: str | None = None,
         args_status: str | None = None, tokens: int | None = None, ms: int = 10) -> dict[str, Any]:  # fmt: skip
    return {"name": name, "kind": kind, "args": args, "result": result, "error": error, "tokens": tokens, "ms": ms,
            "args_status": args_status or ("captured" if args is not None else "absent")}  # fmt: skip


def trajectory(*specs: dict[str, Any] | str, complete: bool = True, attributes: dict[str, Any] | None = None,
               service: str | None = "ap-agent", agent: str | None = "invoice-agent") -> Trajectory:  # fmt: skip
    steps: list[Step] = []
    t = 0
    for i, sp in enumerate(specs):
        spec = step(sp) if isinstance(sp, str) else sp
        start = t
        t += spec["ms"] * 1_000_000
        steps.append(
            Step(
                index=i, kind=spec["kind"], name=spec["name"], span_id=f"{i + 1:016x}", parent_span_id=None,
                trace_id="0" * 31 + "1", start_ns=start, end_ns=t, convention="test", args=spec["args"],
                args_status=spec["args_status"], result=spec["result"],
                result_status="captured" if spec["result"] is not None else "absent", error=spec["error"],
                tokens=spec["tokens"],
            )
        )  # fmt: skip
    return Trajectory(
        key="0" * 31 + "1", trace_ids=["0" * 31 + "1"], steps=steps, complete=complete,
        incomplete_reason=None if complete else "max_wait", service=service, agent=agent, start_ns=0, end_ns=t,
        span_count=len(steps), attributes=attributes or {},
    )  # fmt: skip


def policy(tmp_path: Path, body: str, name: str = "p.yaml") -> CompiledPolicy:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return load_policy(path)


def one(tmp_path: Path, invariant: str, traj: Trajectory, extra: str = "") -> Any:
    """Evaluate a policy holding one invariant (given as a YAML flow mapping) on ``traj``."""
    p = policy(tmp_path, f"policy: t\n{extra}invariants:\n  - {invariant}\n")
    (v,) = p.evaluate(traj)
    return v
