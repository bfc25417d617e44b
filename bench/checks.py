"""Checking cost against normalising cost, measured in the same run.

    python bench/checks.py [--trajectories 100000]

Generates trajectories of 8 to 20 steps as OTel GenAI spans (an agent span, model calls and
tool calls with JSON arguments, some failing), then times, chunk by chunk:
  - normalising: otel_plumb.normalise.normalise on every span + build_trajectory;
  - checking: a 10-invariant policy without expressions, and one with CEL expressions
    (a ``when`` guard, an ``arg_satisfies`` and an ``expr`` over all steps).
Prints verdicts/s, the checking/normalising ratio (target: below 1), and how many times CEL
compiled (once per expression at load, never per trajectory).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import cel

from otel_plumb.assemble import build_trajectory
from otel_plumb.check import CompiledPolicy, load_policy
from otel_plumb.model import SpanRecord, Trajectory
from otel_plumb.model.span import STATUS_ERROR
from otel_plumb.normalise import normalise

TOOLS = ["fetch_invoice", "match_purchase_order", "check_duplicate", "check_vendor_status", "schedule_payment",
         "flag_exception", "post_audit_log", "lookup_vendor"]  # fmt: skip
CHUNK = 5000

PLAIN = """
policy: bench-plain
invariants:
  - {id: dup-check, severity: critical, must_call: check_duplicate}
  - {id: vendor-check, must_call: [check_vendor_status, lookup_vendor]}
  - {id: no-flag-and-pay, never_call: flag_exception, scope: {after: schedule_payment}}
  - {id: match-before-pay, severity: critical, precedes: {first: match_purchase_order, then: schedule_payment}}
  - {id: audit-after-pay, responds: {trigger: schedule_payment, then: post_audit_log}}
  - {id: pay-once, severity: critical, call_count: {tool: schedule_payment, max: 1}}
  - {id: pay-amount, severity: critical, arg_equals: {tool: schedule_payment, arg: amount_gbp,
                                                       context: expected_amount_gbp}}
  - {id: pay-as-invoiced, arg_equals: {tool: schedule_payment, arg: amount_gbp, step: {tool: fetch_invoice,
                                                                                        result: total}}}
  - {id: invoice-format, arg_matches: {tool: fetch_invoice, arg: invoice_id, regex: '^INV-\\d+$'}}
  - {id: no-runaway, budget: {max_steps: 18, max_tool_errors: 2, max_duration_ms: 120000}}
"""

EXPRESSIONS = """
policy: bench-expr
invariants:
  - {id: dup-check, severity: critical, must_call: check_duplicate, when: "ctx.expected_amount_gbp > 1000.0"}
  - {id: vendor-check, must_call: [check_vendor_status, lookup_vendor]}
  - {id: no-flag-and-pay, never_call: flag_exception, scope: {after: schedule_payment}}
  - {id: match-before-pay, severity: critical, precedes: {first: match_purchase_order, then: schedule_payment}}
  - {id: audit-after-pay, responds: {trigger: schedule_payment, then: post_audit_log}}
  - {id: pay-once, severity: critical, call_count: {tool: schedule_payment, max: 1}}
  - {id: pay-limit, severity: critical, arg_satisfies: {tool: schedule_payment,
                                                        expr: "args.amount_gbp <= ctx.expected_amount_gbp * 1.01"}}
  - {id: pay-as-invoiced, arg_equals: {tool: schedule_payment, arg: amount_gbp, step: {tool: fetch_invoice,
                                                                                        result: total}}}
  - {id: some-tool, expr: "steps.exists(s, s.kind == 'tool' && s.error == null)"}
  - {id: no-runaway, budget: {max_steps: 18, max_tool_errors: 2, max_duration_ms: 120000}}
"""


def spans_for(rng: random.Random, n: int) -> list[SpanRecord]:
    trace = f"{n:032x}"
    steps = rng.randint(8, 20)
    amount = rng.choice([4820.0, 4500.0, 1250.5, 980.0])
    root = SpanRecord(
        trace, f"{1:016x}", None, "invoke_agent invoice-agent", start_ns=0, end_ns=steps * 2_000_000,
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "invoice-agent",
                    "plumb.context.expected_amount_gbp": amount, "invoice.id": f"INV-{n}"},
        resource={"service.name": "ap-agent"},
    )  # fmt: skip
    out = [root]
    for i in range(1, steps):
        sid = f"{i + 1:016x}"
        start, end = i * 2_000_000, i * 2_000_000 + 1_500_000
        if i % 2:
            attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                                     "gen_ai.usage.input_tokens": 300, "gen_ai.usage.output_tokens": 40}  # fmt: skip
            out.append(SpanRecord(trace, sid, root.span_id, "chat m", start_ns=start, end_ns=end, attributes=attrs))
            continue
        tool = TOOLS[(i // 2 - 1 + rng.randint(0, 1)) % len(TOOLS)]
        args = {"invoice_id": f"INV-{n}", "amount_gbp": amount if rng.random() > 0.05 else amount * 10}
        result = {"total": f"{amount:.2f}", "ok": True}
        failed = rng.random() < 0.05
        attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": f"c{i}",
            "gen_ai.tool.call.arguments": json.dumps(args),
            "gen_ai.tool.call.result": json.dumps(result),
        }
        out.append(SpanRecord(trace, sid, root.span_id, f"execute_tool {tool}", start_ns=start, end_ns=end,
                              status_code=STATUS_ERROR if failed else 0, status_message="503" if failed else "",
                              attributes=attrs))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trajectories", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=42)
    opts = ap.parse_args()
    n_total, seed = opts.trajectories, opts.seed

    compiles = 0
    real_compile = cel.compile

    def counting_compile(source: str) -> cel.Program:
        nonlocal compiles
        compiles += 1
        return real_compile(source)

    cel.compile = counting_compile  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        policies: dict[str, CompiledPolicy] = {}
        for name, text in (("plain", PLAIN), ("expressions", EXPRESSIONS)):
            path = Path(tmp) / f"{name}.yaml"
            path.write_text(text)
            policies[name] = load_policy(path)
    compiled_at_load = compiles

    rng = random.Random(seed)
    t_norm = 0.0
    t_check = dict.fromkeys(policies, 0.0)
    verdicts = dict.fromkeys(policies, 0)
    fails = dict.fromkeys(policies, 0)
    spans_total = 0
    gc.disable()  # as replay does: no cyclic garbage here, and collections would add noise
    try:
        done = 0
        while done < n_total:
            batch = [spans_for(rng, done + k) for k in range(min(CHUNK, n_total - done))]
            spans_total += sum(len(b) for b in batch)
            t0 = time.perf_counter()
            trajectories: list[Trajectory] = [build_trajectory(b[0].trace_id, [normalise(s) for s in b]) for b in batch]
            t_norm += time.perf_counter() - t0
            for name, policy in policies.items():
                t0 = time.perf_counter()
                for t in trajectories:
                    vs = policy.evaluate(t)
                    verdicts[name] += len(vs)
                    fails[name] += sum(1 for v in vs if v.verdict == "fail")
                t_check[name] += time.perf_counter() - t0
            done += len(batch)
    finally:
        gc.enable()
    cel.compile = real_compile  # type: ignore[assignment]

    print(f"{n_total} trajectories, {spans_total} spans ({spans_total / n_total:.1f} per trajectory)")
    print(f"normalise + build_trajectory: {t_norm:7.2f} s  {n_total / t_norm:9.0f} trajectories/s  "
          f"{spans_total / t_norm:9.0f} spans/s")  # fmt: skip
    for name in policies:
        t = t_check[name]
        print(f"check, 10 invariants, {name:<11}: {t:7.2f} s  {n_total / t:9.0f} trajectories/s  "
              f"{verdicts[name] / t:9.0f} verdicts/s  ({fails[name]} fails)   "
              f"checking/normalising = {t / t_norm:.2f}")  # fmt: skip
    print(f"CEL compiles: {compiled_at_load} at load (one per expression), {compiles - compiled_at_load} while "
          f"checking {n_total} trajectories")  # fmt: skip


if __name__ == "__main__":
    main()
