"""Checking cost against normalising cost, measured in the same run.

    python bench/checks.py [--trajectories 100000]

Generates trajectories of 8 to 20 steps as OTel GenAI spans (an agent span, model calls and
tool calls with JSON arguments, some failing), then times, chunk by chunk:
  - normalising: otel_plumb.normalise.normalise on every span + build_trajectory;
  - checking: a 10-invariant policy without expressions, and one with CEL expressions
    (a ``when`` guard, an ``arg_satisfies`` and an ``expr`` over all steps).
Prints verdicts/s, the checking/normalising ratio (target: below 1), and how many times CEL
compiled (once per expression at load, never per trajectory).

    python bench/checks.py --sweep [--repeat 3]

Flat cost, stage by stage, at 10, 100, 1,000 and 5,000 steps (spans) per trace, and 1k, 10k and
50k traces in flight, each point the median of --repeat runs, with the ratios of the largest to
the smallest figure and of the last to the first (flat: near 1, or below where a fixed cost per
request or per trajectory is spread over more steps):
  - ingest with early checks: a live processor (no listeners) takes one trace in requests of 10
    spans, the root last, under a 10-invariant policy whose early invariants never fail:
    microseconds per span (decoding and normalising included, the same at every size); and the
    same with each model call asking for two tool calls at once (parallel calls: the counters
    cannot rule a ``precedes`` out, so it is checked again as the trace grows);
  - CEL: ``size(steps.filter(s, s.kind == 'tool')) > 0`` on the trajectory, per step;
  - arg_equals from an earlier step (every other step a call it checks), per step;
  - building a trajectory whose tool spans record no tool-call id (each matched by name to the
    request of its turn), per span;
  - Assembler.due: milliseconds per tick with that many idle traces waiting for their root.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import cel

from otel_plumb.assemble import Assembler, AssemblyLimits, build_trajectory
from otel_plumb.check import CompiledPolicy, load_policy
from otel_plumb.model import NormalisedSpan, RequestedCall, SpanRecord, Trajectory
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


SWEEP_POLICY = """
policy: sweep
invariants:
  - {id: must-lookup, must_call: lookup_customer}
  - {id: never-delete, never_call: delete_account}
  - {id: lookup-before-refund, precedes: {first: lookup_customer, then: issue_refund}}
  - {id: check-before-refund, precedes: {first: check_policy, then: issue_refund}}
  - {id: notify-after-refund, responds: {trigger: issue_refund, then: send_email}}
  - {id: refund-limit, call_count: {tool: issue_refund, max: 100000}}
  - id: refund-as-quoted
    arg_equals: {tool: issue_refund, arg: amount, step: {tool: check_policy, result: refundable}}
  - {id: mail-domain, arg_matches: {tool: send_email, arg: to, regex: '@example\\.com$'}}
  - {id: budget, budget: {max_steps: 100000, max_tool_errors: 100000, max_duration_ms: 1.0e9}}
  - {id: has-tools, expr: "size(steps.filter(s, s.kind == 'tool')) > 0"}
"""
SWEEP_TOOLS = (
    ("lookup_customer", {"customer_id": "C-1"}, {"name": "Ada"}),
    ("check_policy", {"order_id": "O-9"}, {"refundable": 42.5}),
    ("issue_refund", {"order_id": "O-9", "amount": 42.5}, {"refund_id": "R-7"}),
    ("send_email", {"to": "ada@example.com"}, {"sent": True}),
)


def _load_text(text: str) -> CompiledPolicy:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.yaml"
        path.write_text(text)
        return load_policy(path)


def _ingest_us_per_span(n: int, policy: CompiledPolicy, *, parallel: bool = False) -> float:
    """A live processor taking traces of ``n`` spans in requests of 10, each root last: CPU per
    span (over 5,000 spans at least, one trace after another). ``parallel``: each model call
    asks for two tool calls at once (so the step order is not start order)."""
    import asyncio

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otel_plumb.processor import Processor, load_config
    from otel_plumb.receive.otlp import ReceivedRequest

    requests: list[ExportTraceServiceRequest] = []
    traces = max(1, 5000 // n)
    for _ in range(traces):
        requests.extend(_trace_requests(n, parallel))

    async def run() -> float:
        config = load_config(None, {
            "receivers": {"grpc": {"enabled": False}, "http": {"enabled": False}},
            # confirm_wait 0: each early failure is reported (and its trajectory built) as found.
            "metrics": {"endpoint": ""},
            "assembly": {"idle_timeout": 60, "confirm_wait": 0, "max_spans_per_trace": 20_000},
        })  # fmt: skip
        processor = Processor(config, [policy])
        await processor.start()
        try:
            t0 = time.process_time()
            for request in requests:
                await processor.ingest(ReceivedRequest.of(request), "bench")
            return (time.process_time() - t0) / (n * traces) * 1e6
        finally:
            await processor.stop()

    return asyncio.run(run())


def _trace_requests(n: int, parallel: bool = False) -> list[Any]:
    """One trace of ``n`` spans as requests of 10 spans, the root alone in the last; with
    ``parallel``, each model call asks for the two tool calls after it."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    tid = random.randbytes(16)
    root = random.randbytes(8)
    requests: list[ExportTraceServiceRequest] = []
    for first in range(1, n, 10):
        request = ExportTraceServiceRequest()
        ss = request.resource_spans.add().scope_spans.add()
        for i in range(first, min(n, first + 10)):
            tool, args, result = SWEEP_TOOLS[(i // 2) % len(SWEEP_TOOLS)]
            span = ss.spans.add(trace_id=tid, span_id=random.randbytes(8), parent_span_id=root)
            span.start_time_unix_nano, span.end_time_unix_nano = i * 1000, i * 1000 + 900
            if i % 2:
                span.name = "chat m"
                span.attributes.add(key="gen_ai.operation.name").value.string_value = "chat"
                span.attributes.add(key="gen_ai.usage.input_tokens").value.int_value = 10
                if parallel:
                    calls = [{"type": "tool_call", "id": f"c{i}_{k}", "name": SWEEP_TOOLS[(i // 2 + k) % 4][0],
                              "arguments": {}} for k in (1, 2)]  # fmt: skip
                    output = json.dumps([{"role": "assistant", "parts": calls}])
                    span.attributes.add(key="gen_ai.output.messages").value.string_value = output
                continue
            span.name = f"execute_tool {tool}"
            for key, value in (("gen_ai.operation.name", "execute_tool"), ("gen_ai.tool.name", tool),
                               ("gen_ai.tool.call.arguments", json.dumps(args)),
                               ("gen_ai.tool.call.result", json.dumps(result))):  # fmt: skip
                span.attributes.add(key=key).value.string_value = value
        requests.append(request)
    last = ExportTraceServiceRequest()
    span = last.resource_spans.add().scope_spans.add().spans.add(trace_id=tid, span_id=root, name="invoke_agent a")
    span.start_time_unix_nano, span.end_time_unix_nano = 0, n * 1000 + 1000
    span.attributes.add(key="gen_ai.operation.name").value.string_value = "invoke_agent"
    requests.append(last)
    return requests


def _trajectory(n: int) -> Trajectory:
    spans = [NormalisedSpan(trace_id="t", span_id="r", parent_span_id=None, span_name="a", start_ns=0,
                            end_ns=n * 1000 + 1000, kind="agent", name="a", convention="bench")]  # fmt: skip
    for i in range(1, n):
        tool, args, result = SWEEP_TOOLS[1 + i % 2]  # check_policy, issue_refund, in turn
        spans.append(NormalisedSpan(
            trace_id="t", span_id=f"s{i}", parent_span_id="r", span_name=tool, start_ns=i * 1000,
            end_ns=i * 1000 + 900, kind="tool", name=tool, convention="bench", args=args, args_status="captured",
            result=result, result_status="captured",
        ))  # fmt: skip
    return build_trajectory("t", spans)


def _match_by_name_us_per_span(n: int) -> float:
    """CPU per span of building a trajectory of ``n`` spans in turns of a model call requesting
    one tool call and a tool span that records no tool-call id (matched to its request by name)."""
    spans = [NormalisedSpan(trace_id="t", span_id="r", parent_span_id=None, span_name="a", start_ns=0,
                            end_ns=n * 1000 + 1000, kind="agent", name="a", convention="bench")]  # fmt: skip
    for i in range(1, n, 2):
        call = RequestedCall("issue_refund", {"order_id": f"O-{i}"}, "captured", None)
        spans.append(NormalisedSpan(trace_id="t", span_id=f"m{i}", parent_span_id="r", span_name="chat",
                                    start_ns=i * 1000, end_ns=i * 1000 + 400, kind="llm", name="chat",
                                    convention="bench", requested_calls=(call,)))  # fmt: skip
        spans.append(NormalisedSpan(trace_id="t", span_id=f"s{i}", parent_span_id="r", span_name="issue_refund",
                                    start_ns=i * 1000 + 500, end_ns=i * 1000 + 900, kind="tool",
                                    name="issue_refund", convention="bench"))  # fmt: skip
    times = max(1, 5000 // len(spans))
    t0 = time.process_time()
    for _ in range(times):
        build_trajectory("t", spans)
    return (time.process_time() - t0) / (len(spans) * times) * 1e6


def _evaluate_us_per_step(policy: CompiledPolicy, trajectory: Trajectory) -> float:
    """CPU per step of evaluating ``policy`` (over 5,000 steps at least: repeated on small ones)."""
    times = max(1, 5000 // len(trajectory.steps))
    t0 = time.process_time()
    for _ in range(times):
        policy.evaluate(trajectory)
    return (time.process_time() - t0) / (len(trajectory.steps) * times) * 1e6


def _tick_ms(traces: int) -> float:
    """Assembler.due with ``traces`` idle traces waiting for their root: the median of 20 ticks
    (after the first, which looks at each of them once)."""
    limits = AssemblyLimits(idle_timeout_s=1.0, max_wait_s=1e9, max_traces=traces + 1)
    asm = Assembler(limits)
    for t in range(traces):
        for i in range(10):  # two top spans: waits for the root, whatever the timeout
            span = NormalisedSpan(trace_id=f"t{t}", span_id=f"s{i}", parent_span_id=f"p{i % 2}", span_name="x",
                                  start_ns=i, end_ns=i + 1, kind="other", name="x", convention="bench")  # fmt: skip
            asm.add(span, None, 0.0)
    asm.due(2.0)
    ticks = []
    for k in range(20):
        t0 = time.perf_counter()
        asm.due(3.0 + k)
        ticks.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ticks)


def sweep(repeat: int) -> None:
    policy = _load_text(SWEEP_POLICY)
    cel_only = _load_text(
        "policy: c\ninvariants:\n  - {id: has-tools, expr: \"size(steps.filter(s, s.kind == 'tool')) > 0\"}\n"
    )
    arg_only = _load_text(
        "policy: a\ninvariants:\n  - id: q\n    arg_equals: {tool: issue_refund, arg: amount, "
        "step: {tool: check_policy, result: refundable}}\n"
    )

    def median(fn: Any) -> float:
        return statistics.median(fn() for _ in range(repeat))

    rows: list[tuple[str, str, list[tuple[int, float]]]] = []
    sizes = (10, 100, 1000, 5000)
    gc.disable()
    try:
        rows.append(("ingest with early checks", "us/span",
                     [(n, median(lambda n=n: _ingest_us_per_span(n, policy))) for n in sizes]))  # fmt: skip
        parallel = [(n, median(lambda n=n: _ingest_us_per_span(n, policy, parallel=True))) for n in sizes]
        rows.append(("... with parallel calls", "us/span", parallel))
        trajectories = {n: _trajectory(n) for n in sizes}
        for name, only in (("CEL steps.filter", cel_only), ("arg_equals from a step", arg_only)):
            points = [(n, median(lambda n=n, p=only: _evaluate_us_per_step(p, trajectories[n]))) for n in sizes]
            rows.append((name, "us/step", points))
        rows.append(("tool spans matched by name", "us/span",
                     [(n, median(lambda n=n: _match_by_name_us_per_span(n))) for n in sizes]))  # fmt: skip
    finally:
        gc.enable()
    rows.append(("Assembler tick", "ms/tick", [(n, median(lambda n=n: _tick_ms(n))) for n in (1000, 10_000, 50_000)]))
    print(f"median of {repeat} run(s) per point")
    for name, unit, points in rows:
        figures = "  ".join(f"{n:>6,}: {v:9.3f}" for n, v in points)
        values = [v for _, v in points]
        print(f"{name:<26} {unit:<8} {figures}   largest/smallest {max(values) / min(values):6.2f}x, "
              f"last/first {values[-1] / values[0]:6.2f}x")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trajectories", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--sweep", action="store_true", help="the flat-cost sweep (see above) instead")
    ap.add_argument("--repeat", type=int, default=3, help="--sweep: runs per point, the median printed")
    opts = ap.parse_args()
    if opts.sweep:
        sweep(opts.repeat)
        return
    n_total, seed = opts.trajectories, opts.seed

    compiles = 0
    real_compile = cel.compile

    def counting_compile(source: str) -> cel.Program:
        nonlocal compiles
        compiles += 1
        return real_compile(source)

    cel.compile = counting_compile  # type: ignore[assignment]
    policies = {name: _load_text(text) for name, text in (("plain", PLAIN), ("expressions", EXPRESSIONS))}
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
    print(f"CEL compiles: {compiled_at_load} at load (each expression, and the comprehension bodies evaluated "
          f"per step), {compiles - compiled_at_load} while checking {n_total} trajectories")  # fmt: skip


if __name__ == "__main__":
    main()
