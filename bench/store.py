"""Trajectory store benchmark: what the console's store costs the live processor, and how fast
the console's queries are on a big store.

    python bench/store.py                 # both parts
    python bench/store.py --rows 1000000  # the query part on a million stored trajectories

1. Throughput: the same requests (traces of 11 OTel GenAI spans, whole traces per request) sent
   to an in-process processor over OTLP/HTTP with the store off and on, alternately, ``--pairs``
   times each in this run; spans/s end to end, and the store's cost: the median over the pairs of
   1 - on/off, each pair run back to back so that a slower spell of a shared machine falls on
   both halves (target: under 10%),
   and CPU time per span (on a shared machine the steadier of the two): the processor's process,
   and the store's writer process beside it (what the store costs when no core is spare).
2. Queries: ``--rows`` records written with ``TrajectoryStore.add``, then the console's list
   filters (status, invariant, severity, agent, a page deep in the list via its cursor) timed,
   median of 5 (target: under 200 ms each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_plumb.check import load_policies
from otel_plumb.processor import Processor, load_config
from otel_plumb.store import Filters, TrajectoryStore

TRACES_PER_REQUEST = 50
TOOLS = ["lookup_customer", "check_balance", "issue_refund", "notify", "post_audit_log"]
POLICY = """
policy: bench
invariants:
  - {id: must-lookup, severity: critical, must_call: lookup_customer}
  - {id: lookup-first, severity: high, precedes: {first: lookup_customer, then: issue_refund}}
  - {id: refund-once, severity: high, call_count: {tool: issue_refund, max: 1}}
"""


def _attr(span: Span, key: str, value: str) -> None:
    kv = span.attributes.add()
    kv.key = key
    kv.value.string_value = value


def requests(count: int) -> list[bytes]:
    out = []
    for r in range(count):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        _attr(rs.resource, "service.name", "bench")  # type: ignore[arg-type]
        ss = rs.scope_spans.add()
        for t in range(TRACES_PER_REQUEST):
            trace_id = (r * TRACES_PER_REQUEST + t + 1).to_bytes(16, "big")
            root = ss.spans.add(trace_id=trace_id, span_id=(1).to_bytes(8, "big"), name="invoke_agent bench",
                                start_time_unix_nano=1, end_time_unix_nano=100)  # fmt: skip
            _attr(root, "gen_ai.operation.name", "invoke_agent")
            _attr(root, "gen_ai.agent.name", "bench")
            for i in range(10):
                tool = TOOLS[i % len(TOOLS)] if (r + t) % 7 else "issue_refund"
                span = ss.spans.add(
                    trace_id=trace_id, span_id=(i + 2).to_bytes(8, "big"), parent_span_id=root.span_id,
                    name=f"execute_tool {tool}", start_time_unix_nano=2 + i, end_time_unix_nano=3 + i,
                )  # fmt: skip
                _attr(span, "gen_ai.operation.name", "execute_tool")
                _attr(span, "gen_ai.tool.name", tool)
                _attr(span, "gen_ai.tool.call.arguments", json.dumps({"id": f"C-{t}", "amount": i}))
        out.append(req.SerializeToString())
    return out


async def throughput(bodies: list[bytes], store: Path | None, policy: Path) -> tuple[float, float]:
    """Spans/s end to end, and CPU seconds per span: this process's, and the store writer's
    (a child process, counted once it has exited)."""
    data = {"receivers": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}},
            "metrics": {"endpoint": ""}, "assembly": {"idle_timeout": 0.2, "tick": 0.05}}  # fmt: skip
    if store is not None:
        data["store"] = {"path": str(store)}
    processor = Processor(load_config(None, data), load_policies([policy]))
    decided = 0

    def count(_: object) -> None:
        nonlocal decided
        decided += 1

    processor.on_decided(count)
    await processor.start()
    url = f"http://127.0.0.1:{processor.http_port}/v1/traces"
    want = len(bodies) * TRACES_PER_REQUEST
    children = _children_cpu()
    started, cpu = time.perf_counter(), time.process_time()
    async with aiohttp.ClientSession() as session:
        queue = list(bodies)

        async def worker() -> None:
            while queue:
                body = queue.pop()
                while True:
                    async with session.post(url, data=body, headers={"Content-Type": "application/x-protobuf"}) as r:
                        await r.read()
                        if r.status == 200:
                            break
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(worker() for _ in range(4)))
    while decided < want:
        await asyncio.sleep(0.01)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    await processor.stop()
    spans = want * 11
    return spans / elapsed, cpu / spans, (_children_cpu() - children) / spans


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def queries(rows: int, path: Path) -> None:
    store = TrajectoryStore(path)
    started = time.perf_counter()
    batch = []
    now = time.time()
    for i in range(rows):
        failed = i % 11 == 0
        batch.append({
            "trace_id": f"{i:032x}", "key": f"ORD-{i}", "agent": f"agent-{i % 20}", "service": "svc",
            "status": "violating" if failed else ("indeterminate" if i % 17 == 0 else "conformant"),
            "steps": [], "verdicts": [
                {"policy": "bench", "invariant": "must-lookup", "verdict": "pass", "severity": "critical"},
                {"policy": "bench", "invariant": "lookup-first", "verdict": "fail" if failed else "pass",
                 "severity": "high"},
                {"policy": "bench", "invariant": "refund-once", "verdict": "pass", "severity": "high"}],
        })  # fmt: skip
        if len(batch) == 5000:
            store.add(batch, "live", decided_at=now - (rows - i))
            batch = []
    if batch:
        store.add(batch, "live", decided_at=now)
    print(f"queries: wrote {rows:,} trajectories in {time.perf_counter() - started:.1f} s "
          f"({store.bytes_used() / 1e6:.0f} MB)")  # fmt: skip
    _, deep = store.find(Filters(), limit=500)
    for _ in range(40):
        _, deep = store.find(Filters(), limit=500, cursor=deep)
    cases = {
        "newest page": (Filters(), None),
        "status=violating": (Filters(status="violating"), None),
        "invariant=lookup-first": (Filters(invariant="lookup-first"), None),
        "severity>=high": (Filters(severity="high"), None),
        "agent=agent-7, violating": (Filters(agent="agent-7", status="violating"), None),
        "page 41 (cursor)": (Filters(), deep),
        "key=ORD-123": (Filters(key="ORD-123"), None),
    }
    for name, (f, cursor) in cases.items():
        times = []
        for _ in range(5):
            t = time.perf_counter()
            store.find(f, limit=50, cursor=cursor)
            times.append((time.perf_counter() - t) * 1000)
        median = statistics.median(times)
        print(f"  {name:<28} {median:7.2f} ms  ({'ok' if median < 200 else 'OVER'} against 200 ms)")
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=120, help="requests of 50 traces per throughput phase")
    parser.add_argument("--pairs", type=int, default=5, help="store off and on, back to back, this many times")
    parser.add_argument("--rows", type=int, default=1_000_000, help="stored trajectories for the query part")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "bench.yaml"
        policy.write_text(POLICY)
        bodies = requests(args.requests)
        off, on = [], []
        for run in range(args.pairs):
            off.append(asyncio.run(throughput(bodies, None, policy)))
            on.append(asyncio.run(throughput(bodies, Path(tmp) / f"store-{run}.sqlite", policy)))
        m_off, m_on = statistics.median(r for r, _, _ in off), statistics.median(r for r, _, _ in on)
        cpu_off, cpu_on = statistics.median(c for _, c, _ in off), statistics.median(c for _, c, _ in on)
        cpu_writer = statistics.median(w for _, _, w in on)
        cost = statistics.median(1 - a[0] / b[0] for a, b in zip(on, off, strict=True))
        print(f"throughput: store off {m_off:,.0f} spans/s, on {m_on:,.0f} spans/s (median of {args.pairs} each); "
              f"the store costs {cost:.1%} ({'ok' if cost < 0.10 else 'OVER'} against 10%)")  # fmt: skip
        runs = "; ".join(f"{name} " + ", ".join(f"{r:,.0f}" for r, _, _ in rs) for name, rs in (("off", off),
                                                                                               ("on", on)))
        print(f"  CPU per span: processor off {cpu_off * 1e6:.1f} µs, on {cpu_on * 1e6:.1f} µs "
              f"(+{cpu_on / cpu_off - 1:.1%}), and the store's writer process {cpu_writer * 1e6:.1f} µs "
              f"(+{(cpu_on + cpu_writer) / cpu_off - 1:.1%} in all); spans/s per run: {runs}")
        queries(args.rows, Path(tmp) / "big.sqlite")


if __name__ == "__main__":
    sys.exit(main())
