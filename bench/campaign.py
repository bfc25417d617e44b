"""Campaign harness overhead and analysis time, measured in the same run.

    python bench/campaign.py [--trials 2000] [--stored 100000]

1. Harness overhead: a campaign over an instant agent (a Python coroutine that posts one
   prebuilt OTLP/HTTP request of 7 GenAI spans to the embedded processor and answers at
   once). Per trial the harness builds the request and trace context, calls the agent,
   receives, normalises and assembles the trace, checks an 8-invariant policy, and commits
   the trial, trajectory, verdicts and answer-cache row to SQLite. Printed: trials/s and CPU
   ms per trial (target: below 5 ms), next to the agent's own cost (the POST alone).
2. Analysis: 100,000 synthetic stored trials (2 arms, 6 perturbations, 500 cases, paths of
   6 tool steps with some omissions, substitutions and argument drift), timed from the store
   to the finished report (target: below 30 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import aiohttp
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_plumb.campaign.analysis import arg_key, state_key
from otel_plumb.campaign.config import load_campaign
from otel_plumb.campaign.engine import CampaignRun
from otel_plumb.campaign.perturb import Variant
from otel_plumb.campaign.reports import build_report
from otel_plumb.campaign.store import Store
from otel_plumb.receive.otlp import to_key_values

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "accounts_payable"
TOOLS = ["fetch_invoice", "match_purchase_order", "check_duplicate", "check_vendor_status", "schedule_payment",
         "post_audit_log"]  # fmt: skip

AGENT = '''
import asyncio, os
import aiohttp
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

TEMPLATE = ExportTraceServiceRequest.FromString(bytes.fromhex(os.environ["BENCH_TEMPLATE"]))
_session = None

async def run(request):
    global _session
    if _session is None:
        _session = aiohttp.ClientSession()
    trace_id = bytes.fromhex(request["traceparent"].split("-")[1])
    message = ExportTraceServiceRequest()
    message.CopyFrom(TEMPLATE)
    for span in message.resource_spans[0].scope_spans[0].spans:
        span.trace_id = trace_id
    async with _session.post(request["otlp_http_endpoint"] + "/v1/traces", data=message.SerializeToString(),
                             headers={"Content-Type": "application/x-protobuf"}) as resp:
        await resp.read()
    return {"output": "paid", "state": {"action": "pay", "paid_gbp": 4500.0}}


async def close():
    if _session is not None:
        await _session.close()
'''


def template() -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(to_key_values({"service.name": "bench-agent"}))
    spans = rs.scope_spans.add().spans
    root = spans.add()
    root.trace_id, root.span_id, root.name = b"\x01" * 16, (1).to_bytes(8, "big"), "invoke_agent ap"
    root.start_time_unix_nano, root.end_time_unix_nano = 1_000, 100_000
    root.attributes.extend(to_key_values({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "ap"}))
    for i, tool in enumerate(TOOLS):
        s = spans.add()
        s.trace_id, s.span_id, s.parent_span_id = b"\x01" * 16, (i + 2).to_bytes(8, "big"), root.span_id
        s.name, s.start_time_unix_nano, s.end_time_unix_nano = f"execute_tool {tool}", 2_000 + i * 10, 2_005 + i * 10
        args = {"invoice_id": "INV-7001", "amount_gbp": 4500.0} if tool == "schedule_payment" else {"invoice_id":
                                                                                                      "INV-7001"}
        s.attributes.extend(to_key_values({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                                           "gen_ai.tool.call.arguments": json.dumps(args)}))
    return req


async def harness(trials: int, folder: Path) -> None:
    import os

    os.environ["BENCH_TEMPLATE"] = template().SerializeToString().hex()
    (folder / "bench_agent.py").write_text(AGENT)
    (folder / "ap.yaml").write_text((EXAMPLE / "ap.yaml").read_text())
    (folder / "cases.jsonl").write_text(json.dumps({"id": "INV-7001", "input": "Pay INV-7001 for £4,500.00.",
                                                    "context": {"expected_action": "pay",
                                                                "expected_amount_gbp": 4500.0}}) + "\n")
    (folder / "c.yaml").write_text(
        "campaign: bench\nseed: 1\ndataset: cases.jsonl\npolicies: [ap.yaml]\n"
        "arms:\n  instant: {python: {callable: 'bench_agent:run'}}\n"
        f"traces: {{receiver: embedded, deadline_s: 10}}\nperturbations:\n  baseline: {{repeats: {trials}}}\n"
        "limits: {concurrency: 64}\n")
    store = Store(folder / "runs.db")
    runner = CampaignRun(load_campaign(folder / "c.yaml"), store)
    run_id = runner.start()
    wall, cpu = time.perf_counter(), time.process_time()
    outcome = await runner.execute(run_id)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    import bench_agent  # type: ignore[import-not-found]

    await bench_agent.close()
    ok = sum(1 for t in store.trials(run_id) if t.status == "ok")
    # The agent's own cost: the same POST to a bare processor, timed alone.
    from otel_plumb.campaign.collect import EmbeddedReceiver

    receiver = EmbeddedReceiver()
    await receiver.start()
    body = template()
    async with aiohttp.ClientSession() as session:
        posts = min(trials, 1000)
        agent_cpu = time.process_time()
        for i in range(posts):
            for span in body.resource_spans[0].scope_spans[0].spans:
                span.trace_id = i.to_bytes(16, "big")
            async with session.post(f"{receiver.endpoints.http}/v1/traces", data=body.SerializeToString(),
                                    headers={"Content-Type": "application/x-protobuf"}) as resp:
                await resp.read()
        agent_cpu = (time.process_time() - agent_cpu) / posts
    await receiver.stop()
    per_trial = cpu / outcome.ran * 1000
    print(f"harness: {outcome.ran} trials ({ok} with a trajectory) in {wall:.2f} s wall = "
          f"{outcome.ran / wall:.0f} trials/s at concurrency 64")
    print(f"harness: {per_trial:.2f} ms CPU per trial (target < 5 ms), of which the agent's own OTLP POST "
          f"(client and receiver, timed alone) is {agent_cpu * 1000:.2f} ms; harness alone "
          f"{per_trial - agent_cpu * 1000:.2f} ms")


def stored_trials(store: Store, n: int) -> tuple[str, float]:
    rng = random.Random(7)
    arms = ["naive", "retry"]
    perts = ["baseline", "paraphrase", "distractor", "decoy_tools", "tool_fault", "sampling"]
    cases = [f"INV-{i:05d}" for i in range(500)]
    run_id = store.create_run("bench", "c.yaml", {"gates": {"min_certified_bound": 0.9}}, 1, arms)
    store.save_variants(run_id, [Variant(f"{c}/{p}-0", c, p, [{"op": "repeat", "n": 0}]) for c in cases
                                 for p in perts], [])
    started = time.perf_counter()
    rows = []
    for i in range(n):
        arm, pert, case = arms[i % 2], perts[(i // 2) % 6], cases[(i // 12) % 500]
        path = [[tool, k + 2, {"invoice_id": case, "amount_gbp": 4500.0} if tool == "schedule_payment" else
                 {"invoice_id": case}] for k, tool in enumerate(TOOLS)]
        roll = rng.random()
        if pert != "baseline" and roll < 0.05:
            del path[2]  # an omission
        elif pert != "baseline" and roll < 0.08:
            path[4][0] = "flag_exception"  # a substitution
        elif pert != "baseline" and roll < 0.10:
            path[4][2] = {"invoice_id": case, "amount_gbp": 45000.0}  # argument drift
        steps = [[name, idx, args, arg_key(args)] for name, idx, args in path]
        good = roll >= 0.08 or pert == "baseline"
        state = {"action": "pay" if good else "hold"}
        rows.append((run_id, f"t{i}", f"id{i}", arm, case, f"{case}/{pert}-0", pert, i // 12 // 500, f"{i:032x}",
                     "ok", None, json.dumps({"output": None, "state": state}), "conformant" if good else "violating",
                     int(good), json.dumps({"path": steps, "violations": [], "state_key": state_key(state)}), 0, 1.0))
    with store.db:
        store.db.execute("BEGIN")
        store.db.executemany("INSERT INTO trials VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
    return run_id, time.perf_counter() - started


def analysis(n: int, folder: Path) -> None:
    store = Store(folder / "analysis.db")
    run_id, made = stored_trials(store, n)
    started = time.perf_counter()
    report = build_report(store, store.run(run_id))
    took = time.perf_counter() - started
    cert = report["arms"]["naive"]["certificate"]
    print(f"analysis: {n} stored trials -> report in {took:.2f} s (target < 30 s); "
          f"{n / took:,.0f} trials/s; certificate {cert['bound']:.4f} set by {cert['perturbation']} "
          f"(writing them took {made:.1f} s)")
    assert isinstance(report["arms"]["naive"]["perturbations"]["tool_fault"]["divergences"], list)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--stored", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        import sys

        sys.path.insert(0, str(folder))
        asyncio.run(harness(args.trials, folder))
        analysis(args.stored, folder)



if __name__ == "__main__":
    main()
