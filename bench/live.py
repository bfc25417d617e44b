"""Live processor benchmark: end-to-end spans/s through `otel-plumb run` (10-invariant policy,
annotate export to a sink) against a no-op OTLP/gRPC receiver on the same load, the ratio,
decision latency beyond idle_timeout, and the processor's peak RSS.

    python bench/live.py                       # ~300k spans per phase
    python bench/live.py --requests 1000       # more load
    python bench/live.py --soak 120            # then a 2-minute soak at a fixed rate, RSS over time

The load generator sends pre-built ExportTraceServiceRequests (550 spans: 50 complete traces of
11 OTel GenAI spans) with several requests in flight over one gRPC channel, retrying throttled
requests after the server's RetryInfo. The processor and the no-op receiver each run in their
own process; the load generator and the sink share this one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_plumb.receive.grpc_server import SERVICE

METHOD = f"/{SERVICE}/Export"
TRACES_PER_REQUEST = 50
IDLE_TIMEOUT = 0.5

POLICY = """
policy: bench
invariants:
  - {id: must-lookup, must_call: lookup_customer}
  - {id: never-delete, never_call: delete_account}
  - {id: lookup-before-refund, precedes: {first: lookup_customer, then: issue_refund}}
  - {id: check-before-refund, precedes: {first: check_policy, then: issue_refund}}
  - {id: notify-after-refund, responds: {trigger: issue_refund, then: send_email}}
  - {id: refund-once, call_count: {tool: issue_refund, max: 1}}
  - id: refund-as-quoted
    arg_equals: {tool: issue_refund, arg: amount, step: {tool: check_policy, result: refundable}}
  - {id: mail-domain, arg_matches: {tool: send_email, arg: to, regex: '@example\\.com$'}}
  - {id: budget, budget: {max_steps: 40, max_tool_errors: 3, max_duration_ms: 120000}}
  - {id: has-tools, expr: "size(steps.filter(s, s.kind == 'tool')) > 0"}
"""

TOOLS = (
    ("lookup_customer", {"customer_id": "C-1"}, {"name": "Ada", "tier": "gold"}),
    ("check_policy", {"order_id": "O-9"}, {"refundable": 42.5}),
    ("issue_refund", {"order_id": "O-9", "amount": 42.5}, {"refund_id": "R-7"}),
    ("send_email", {"to": "ada@example.com", "body": "Your refund is on its way."}, {"sent": True}),
    ("close_ticket", {"ticket": "T-3"}, {"closed": True}),
)
SPANS_PER_TRACE = 1 + 2 * len(TOOLS)  # the root, and a model call before each tool call


def build_request(n: int) -> tuple[bytes, list[bytes]]:
    """One request of TRACES_PER_REQUEST complete traces; returns it serialised and its trace ids."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "support-agent"
    ss = rs.scope_spans.add()
    ss.scope.name = "bench"
    trace_ids = []
    t0 = 1_700_000_000_000_000_000
    for t in range(TRACES_PER_REQUEST):
        tid = os.urandom(16)
        trace_ids.append(tid)
        root = ss.spans.add(trace_id=tid, span_id=os.urandom(8), name="invoke_agent support")
        root.kind = Span.SPAN_KIND_INTERNAL
        root.start_time_unix_nano, root.end_time_unix_nano = t0, t0 + 10_000_000
        for key, value in (("gen_ai.operation.name", "invoke_agent"), ("gen_ai.agent.name", "support")):
            root.attributes.add(key=key).value.string_value = value
        for i, (tool, tool_args, result) in enumerate(TOOLS):
            # One trajectory in ten mails outside the allowed domain: a violation to report.
            args = {**tool_args, "to": "ada@elsewhere.org"} if tool == "send_email" and t % 10 == 0 else tool_args
            chat = ss.spans.add(trace_id=tid, span_id=os.urandom(8), parent_span_id=root.span_id, name="chat m")
            chat.start_time_unix_nano, chat.end_time_unix_nano = t0 + 2 * i * 1000, t0 + (2 * i + 1) * 1000
            for key, value in (("gen_ai.operation.name", "chat"), ("gen_ai.request.model", "m")):
                chat.attributes.add(key=key).value.string_value = value
            chat.attributes.add(key="gen_ai.usage.input_tokens").value.int_value = 100 + i
            span = ss.spans.add(
                trace_id=tid, span_id=os.urandom(8), parent_span_id=root.span_id, name=f"execute_tool {tool}"
            )
            span.start_time_unix_nano, span.end_time_unix_nano = t0 + (2 * i + 1) * 1000, t0 + (2 * i + 2) * 1000
            for key, value in (
                ("gen_ai.operation.name", "execute_tool"),
                ("gen_ai.tool.name", tool),
                ("gen_ai.tool.call.id", f"call_{n}_{t}_{i}"),
                ("gen_ai.tool.call.arguments", json.dumps(args)),
                ("gen_ai.tool.call.result", json.dumps(result)),
            ):
                span.attributes.add(key=key).value.string_value = value
    return request.SerializeToString(), trace_ids


class Sink:
    """The downstream backend: counts spans and notes when each trace's annotated root arrived."""

    def __init__(self) -> None:
        self.spans = 0
        self.root_arrival: dict[bytes, float] = {}
        self.server: grpc.aio.Server | None = None

    async def export(self, raw: bytes, _context: object) -> bytes:
        request = ExportTraceServiceRequest.FromString(raw)
        now = time.monotonic()
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                self.spans += len(ss.spans)
                for span in ss.spans:
                    if not span.parent_span_id:
                        self.root_arrival[span.trace_id] = now
        return ExportTraceServiceResponse().SerializeToString()

    async def start(self) -> int:
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        handler = grpc.unary_unary_rpc_method_handler(self.export)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port


async def send_all(
    port: int, requests: list[tuple[bytes, list[bytes]]], concurrency: int
) -> tuple[float, dict[bytes, float], int]:
    """Send every request with ``concurrency`` in flight; returns seconds, ack time per trace, throttles."""
    acked: dict[bytes, float] = {}
    throttles = 0
    queue: asyncio.Queue[tuple[bytes, list[bytes]]] = asyncio.Queue()
    for r in requests:
        queue.put_nowait(r)
    options = [("grpc.max_send_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as ch:
        export = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)

        async def worker() -> None:
            nonlocal throttles
            while not queue.empty():
                body, trace_ids = queue.get_nowait()
                while True:
                    try:
                        await export(body, timeout=60)
                        break
                    except grpc.aio.AioRpcError as exc:
                        if exc.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                            raise
                        throttles += 1
                        await asyncio.sleep(_retry_delay(exc))
                now = time.monotonic()
                for tid in trace_ids:
                    acked[tid] = now

        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.monotonic() - start, acked, throttles


def _retry_delay(exc: grpc.aio.AioRpcError) -> float:
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return float(info.retry_delay.ToTimedelta().total_seconds())
    return 0.1


def start_process(args: list[str], pattern: str) -> tuple[subprocess.Popen[str], re.Match[str]]:
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(pattern, line)
        if m:
            return proc, m
    raise RuntimeError(f"{args} did not start")


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


async def noop_server() -> None:
    """--role noop: a no-op OTLP/gRPC receiver (decodes and acknowledges), in its own process."""
    from otel_plumb.demo.backend import OtlpBackend

    backend = OtlpBackend(keep=False)
    port = await backend.start(0)
    print(f"noop listening on {port}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await backend.stop()


async def main(args: argparse.Namespace) -> None:
    print(f"building {args.requests} requests of {TRACES_PER_REQUEST * SPANS_PER_TRACE} spans ...", flush=True)
    requests = [build_request(n) for n in range(args.requests)]
    total = args.requests * TRACES_PER_REQUEST * SPANS_PER_TRACE

    # Phase 1: the no-op receiver on the same load.
    noop, m = start_process([sys.executable, __file__, "--role", "noop"], r"noop listening on (\d+)")
    try:
        noop_s, _, _ = await send_all(int(m.group(1)), requests, args.concurrency)
    finally:
        noop.communicate("", timeout=10)
    noop_rate = total / noop_s

    # Phase 2: the processor, annotating and exporting to the sink.
    sink = Sink()
    sink_port = await sink.start()
    tmp = Path(tempfile.mkdtemp(prefix="otel-plumb-bench-"))
    (tmp / "policy.yaml").write_text(POLICY)
    (tmp / "config.yaml").write_text(
        f"assembly: {{idle_timeout: {IDLE_TIMEOUT}, tick: 50ms}}\n"
        f"exporters: {{otlp: {{endpoint: 'grpc://127.0.0.1:{sink_port}', state_dir: '{tmp / 'state'}'}}}}\n"
        "logging: {level: warning}\n"
    )
    grpc_port, metrics_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "otel_plumb", "run", "--config", str(tmp / "config.yaml"),
           "--policy", str(tmp / "policy.yaml"), "--grpc", f"127.0.0.1:{grpc_port}", "--http", "127.0.0.1:0",
           "--metrics", f"127.0.0.1:{metrics_port}"]  # fmt: skip
    proc = subprocess.Popen(cmd)
    try:
        await asyncio.to_thread(wait_ready, metrics_port, 30)
        start = time.monotonic()
        # CPU seconds of the load generator (this process: sender and sink) and of the processor,
        # to show whether the sender, which shares the cores, holds the processor back.
        own_cpu, proc_cpu = time.process_time(), cpu_seconds(proc.pid)
        ingest_s, acked, throttles = await send_all(grpc_port, requests, args.concurrency)
        deadline = time.monotonic() + 120
        while sink.spans < total and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        e2e_s = time.monotonic() - start
        own_cpu, proc_cpu = time.process_time() - own_cpu, cpu_seconds(proc.pid) - proc_cpu
        metrics = await asyncio.to_thread(scrape, metrics_port)
        peak_kib = rss_kib(proc.pid, "VmHWM")
        latencies = [sink.root_arrival[t] - acked[t] - IDLE_TIMEOUT for t in acked if t in sink.root_arrival]
        rate = total / e2e_s
        print()
        print(
            f"load: {total:,} spans ({total // SPANS_PER_TRACE:,} traces of {SPANS_PER_TRACE} GenAI spans), "
            f"{args.concurrency} requests in flight"
        )
        print(f"no-op OTLP/gRPC receiver   {noop_rate:>10,.0f} spans/s")
        print(f"otel-plumb ingest (acked)  {total / ingest_s:>10,.0f} spans/s   throttled requests: {throttles}")
        print(f"otel-plumb end to end      {rate:>10,.0f} spans/s   (10-invariant policy, annotate export; "
              f"includes one idle_timeout of {IDLE_TIMEOUT}s)")
        print(f"ratio end-to-end / no-op   {rate / noop_rate:>10.0%}")
        print(f"spans at the sink          {sink.spans:>10,}   (expected {total:,})")
        print(f"decision latency beyond idle_timeout at full load (ack -> annotated root at the sink): "
              f"p50 {p50(latencies):.3f}s  p99 {p99(latencies):.3f}s  over {len(latencies)} traces")
        print(f"processor peak RSS         {peak_kib / 1024:>10,.0f} MiB")
        print(f"CPU over the end-to-end run ({e2e_s:.1f}s wall, {os.cpu_count()} cores): processor "
              f"{proc_cpu / e2e_s:.0%} of a core, load generator and sink {own_cpu / e2e_s:.0%} of a core")
        print("processor counters: " + ", ".join(
            f"{name}={metric_sum(metrics, name):,.0f}"
            for name in ("plumb_spans_received_total", "plumb_spans_dropped_total", "plumb_violations_total",
                         "plumb_trajectories_total")
        ))  # fmt: skip
        steady = rate * 0.5
        latencies = await paced(grpc_port, proc.pid, 8, steady, sink)
        print(f"decision latency beyond idle_timeout at {steady:,.0f} spans/s (half the measured rate): "
              f"p50 {p50(latencies):.3f}s  p99 {p99(latencies):.3f}s  over {len(latencies)} traces")  # fmt: skip
        if args.soak:
            soak_rate = args.soak_rate or steady
            print(f"soak: {soak_rate:,.0f} spans/s for {args.soak:.0f}s")
            await paced(grpc_port, proc.pid, args.soak, soak_rate, sink, rss_every=5)
            print(f"processor peak RSS after the soak: {rss_kib(proc.pid, 'VmHWM') / 1024:,.0f} MiB")
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 60)
        if sink.server is not None:
            await sink.server.stop(None)


async def paced(
    port: int, pid: int, seconds: float, rate: float, sink: Sink, rss_every: float | None = None
) -> list[float]:
    """Send fresh traces at ``rate`` spans/s for ``seconds`` (optionally printing the processor's
    RSS); returns each trace's decision latency beyond idle_timeout (ack -> root at the sink)."""
    per_request = TRACES_PER_REQUEST * SPANS_PER_TRACE
    interval = per_request / rate
    acked: dict[bytes, float] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        export = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        start = time.monotonic()
        next_print = start
        sent = 0
        while (tick := time.monotonic()) < start + seconds:
            body, trace_ids = build_request(sent)
            try:
                await export(body, timeout=60)
                sent += 1
                now = time.monotonic()
                acked.update((t, now) for t in trace_ids)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                    raise
                await asyncio.sleep(_retry_delay(exc))
            if rss_every is not None and tick >= next_print:
                rss = rss_kib(pid) / 1024
                print(f"  t={tick - start:6.1f}s  sent {sent * per_request:>10,} spans  RSS {rss:8.1f} MiB", flush=True)
                next_print = tick + rss_every
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - tick)))
    deadline = time.monotonic() + 30
    while any(t not in sink.root_arrival for t in acked) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return [sink.root_arrival[t] - a - IDLE_TIMEOUT for t, a in acked.items() if t in sink.root_arrival]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, timeout: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.05)
    raise RuntimeError("otel-plumb run did not become ready")


def scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        body: bytes = resp.read()
    return body.decode()


def metric_sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def p50(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=600, help="requests per phase (550 spans each)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--soak", type=float, default=0, help="then soak for this many seconds, printing RSS")
    parser.add_argument("--soak-rate", type=float, default=0, help="soak spans/s (default: half the measured rate)")
    parser.add_argument("--role", choices=["bench", "noop"], default="bench", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    asyncio.run(noop_server() if ns.role == "noop" else main(ns))
