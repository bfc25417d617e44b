"""Live processor benchmark: end-to-end spans/s through `otel-plumb run` (10-invariant policy,
annotate export to a sink) against a no-op OTLP/gRPC receiver on the same load, the ratio,
decision latency beyond idle_timeout, and the processor's peak RSS.

    python bench/live.py                       # ~300k spans per phase
    python bench/live.py --requests 1000       # more load
    python bench/live.py --soak 120            # then a 2-minute soak at a fixed rate, RSS over time

    python bench/live.py --realistic                       # the SDK's delivery shape (below)
    python bench/live.py --realistic --sweep spans         # 10, 100, 1,000, 5,000 spans per trace
    python bench/live.py --realistic --sweep traces        # 1k, 10k, 50k traces in flight
    python bench/live.py --realistic --sweep payload       # 0, 1 KB, 100 KB per model call
    python bench/live.py --realistic --sweep non-agent     # 0%, 20%, 100% HTTP/DB spans
    python bench/live.py --realistic --sweep spans --repeat 3   # three rounds over the points; medians
    python bench/live.py --realistic --payload 102400 --warm-up 3   # three waves first: a working set
    python bench/live.py --realistic --verdict-log         # the processor writes a verdict log too (production config)

The load generator sends pre-built ExportTraceServiceRequests with several requests in flight
over one gRPC channel, retrying throttled requests after the server's RetryInfo. The processor
and the no-op receiver each run in their own process; the load generator and the sink share
this one. Today's mode: 550-span requests of 50 complete traces of 11 OTel GenAI spans, roots
in the same request (early checks never run). Realistic mode, as an SDK BatchSpanProcessor
sends: requests of up to 512 spans across the traces in flight, each span when it ends (so a
trace's root, which ends last, comes in a later request than its other spans), 20% of the spans
HTTP and database client spans no convention reads, and ``--payload`` bytes of message content
on each model call. Each run first sends ``--warm-up`` waves (one by default) of other traces
of the same shape, waiting for each wave's export, then measures: a long-running processor's
heap has grown to its working set already (without a wave, a run at 100 KB per model call
spends half its CPU in the kernel zeroing the pages of a heap growing to 2 GB). A sweep prints,
per point, spans/s end to end, the processor's CPU microseconds per span, the ratio to the no-op
receiver on the same requests (measured in the same run), how busy the processor's main thread
was (its CPU time over the run's wall time: near 100%, the thread that runs the Python pipeline
is what bounds the rate; the run's last idle_timeout, when nothing arrives, is in the wall time),
requests throttled, the processor's peak RSS and its growth over the RSS at start per
span buffered at once (meaningful once those dominate: many traces in flight), and the ratio of
the largest to the smallest CPU per span (flat cost: near 1). Without a sweep, the realistic
mode then sends fresh traces of the same shape paced at 50% and 80% of the rate it measured, and
prints the decision latency beyond idle_timeout (the ack of the request carrying a trace's root
to that root, annotated, at the sink; p99 within 1 s at 80% is the target), as the default mode
does for its whole traces.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

import otel_plumb
from otel_plumb.receive import otlp
from otel_plumb.receive.grpc_server import SERVICE

METHOD = f"/{SERVICE}/Export"
TRACES_PER_REQUEST = 50
IDLE_TIMEOUT = 0.5
# The realistic traces all fail refund-once and lookup-before-refund (each tool is called twice):
# with a confirm_wait every one would wait for late spans, where production traffic is mostly
# conformant and waits for nothing. So the figures measure throughput and latency without it.
ASSEMBLY = f"idle_timeout: {IDLE_TIMEOUT}, confirm_wait: 0, tick: 50ms"

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


# Decision latency is measured at half the rate a processor is usually run at, and at 80%, the
# target (p99 within 1 s beyond idle_timeout).
LATENCY_SHARES = (0.5, 0.8)
REALISTIC_BATCH = 512  # the SDK BatchSpanProcessor's max_export_batch_size
SWEEPS = {
    "spans": [10, 100, 1000, 5000],  # spans per trace
    "traces": [1000, 10_000, 50_000],  # traces in flight
    "payload": [0, 1024, 100 * 1024],  # bytes of message content per model call
    "non-agent": [0, 20, 100],  # percentage of HTTP and database spans (100: no agent at all)
}


def realistic_requests(
    traces: int, per_trace: int, in_flight: int, payload: int, seed: int = 0, non_agent: int = 20
) -> list[tuple[bytes, list[bytes]]]:
    """``traces`` traces of ``per_trace`` spans, ``in_flight`` at a time, as a BatchSpanProcessor
    sends them: in the order the spans end (a turn at a time across the traces running), cut
    into requests of REALISTIC_BATCH spans; the roots end last, so they go in later requests.
    ``non_agent``: the percentage of HTTP and database client spans (0, 20: one span in five,
    or 100: a service that is no agent, its root an HTTP server span).
    Returns each request serialised with the trace ids whose roots it carries."""
    out: list[tuple[bytes, list[bytes]]] = []
    content = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "x" * payload}]}]) if payload else ""
    t0 = 1_700_000_000_000_000_000
    rng_ids = iter(range(seed * 10**9, 10**18))

    def ident(n: int) -> bytes:
        return next(rng_ids).to_bytes(n, "big")

    class Batch:
        def __init__(self) -> None:
            self.request = ExportTraceServiceRequest()
            rs = self.request.resource_spans.add()
            rs.resource.attributes.add(key="service.name").value.string_value = "support-agent"
            self.spans = rs.scope_spans.add()
            self.spans.scope.name = "bench"
            self.roots: list[bytes] = []
            self.count = 0

    batch = Batch()

    def flush() -> None:
        nonlocal batch
        if batch.count:
            out.append((batch.request.SerializeToString(), batch.roots))
        batch = Batch()

    def add(tid: bytes, sid: bytes, parent: bytes | None, name: str, start: int, end: int) -> Span:
        if batch.count >= REALISTIC_BATCH:
            flush()
        batch.count += 1
        span = batch.spans.spans.add(trace_id=tid, span_id=sid, name=name)
        if parent is not None:
            span.parent_span_id = parent
        span.start_time_unix_nano, span.end_time_unix_nano = start, end
        return span

    for wave_start in range(0, traces, in_flight):
        wave = range(wave_start, min(traces, wave_start + in_flight))
        ids = {t: (ident(16), ident(8)) for t in wave}
        last_tool: dict[int, bytes] = {}
        # A turn (a model call and the tool call after it) of every trace running at a time, as
        # the spans end. (So a trace's first request holds two spans under its root: it is not
        # taken for a whole trace under a remote parent while the other traces' turns go by.)
        turns = [range(i, min(i + 2, per_trace)) for i in range(1, per_trace, 2)]
        for turn in turns:
            for t, i in ((t, i) for t in wave for i in turn):
                start, end = t0 + i * 1000, t0 + i * 1000 + 900
                tid, root = ids[t]
                if non_agent >= 100 or (non_agent and i % (100 // non_agent) == 0):  # HTTP, database
                    http = i % 10 == 0
                    span = add(tid, ident(8), last_tool.get(t, root), "GET /orders" if http else "SELECT orders",
                               start, end)  # fmt: skip
                    span.kind = Span.SPAN_KIND_CLIENT
                    for key, value in (
                        (("http.request.method", "GET"), ("url.full", "https://orders.internal/orders/9"))
                        if http else (("db.system", "postgresql"), ("db.statement", "SELECT * FROM orders WHERE id=$1"))
                    ):  # fmt: skip
                        span.attributes.add(key=key).value.string_value = value
                elif i % 2:
                    span = add(tid, ident(8), root, "chat m", start, end)
                    for key, value in (("gen_ai.operation.name", "chat"), ("gen_ai.request.model", "m")):
                        span.attributes.add(key=key).value.string_value = value
                    span.attributes.add(key="gen_ai.usage.input_tokens").value.int_value = 100
                    if content:
                        span.attributes.add(key="gen_ai.input.messages").value.string_value = content
                else:
                    tool, tool_args, result = TOOLS[(i // 2) % len(TOOLS)]
                    elsewhere = tool == "send_email" and t % 10 == 0  # a violation to report
                    args = {**tool_args, "to": "ada@elsewhere.org"} if elsewhere else tool_args
                    sid = ident(8)
                    last_tool[t] = sid
                    span = add(tid, sid, root, f"execute_tool {tool}", start, end)
                    for key, value in (
                        ("gen_ai.operation.name", "execute_tool"),
                        ("gen_ai.tool.name", tool),
                        ("gen_ai.tool.call.id", f"call_{t}_{i}"),
                        ("gen_ai.tool.call.arguments", json.dumps(args)),
                        ("gen_ai.tool.call.result", json.dumps(result)),
                    ):
                        span.attributes.add(key=key).value.string_value = value
        flush()  # the roots end last: in a later request than the rest of their traces
        for t in wave:
            tid, root = ids[t]
            batch.roots.append(tid)
            if non_agent >= 100:
                span = add(tid, root, None, "POST /refunds", t0, t0 + per_trace * 1000 + 1000)
                span.kind = Span.SPAN_KIND_SERVER
                for key, value in (("http.request.method", "POST"), ("http.route", "/refunds")):
                    span.attributes.add(key=key).value.string_value = value
                continue
            span = add(tid, root, None, "invoke_agent support", t0, t0 + per_trace * 1000 + 1000)
            for key, value in (("gen_ai.operation.name", "invoke_agent"), ("gen_ai.agent.name", "support")):
                span.attributes.add(key=key).value.string_value = value
        flush()
    return out


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

    async def wait_for(self, spans: int, timeout: float) -> None:
        """Until ``spans`` spans have arrived, or ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        while self.spans < spans and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

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


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User and system CPU time of a process, from /proc/PID/stat (of one of its threads, from
    /proc/PID/task/TID/stat: the main thread's id is the process's)."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
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


async def noop_seconds(requests: list[tuple[bytes, list[bytes]]], concurrency: int) -> float:
    """Seconds the no-op receiver, in a process of its own, takes to accept ``requests``."""
    noop, m = start_process([sys.executable, __file__, "--role", "noop"], r"noop listening on (\d+)")
    try:
        seconds, _, _ = await send_all(int(m.group(1)), requests, concurrency)
    finally:
        noop.communicate("", timeout=10)
    return seconds


def start_processor(tmp: Path, config: str, timeout: float = 60) -> tuple[subprocess.Popen[bytes], int, int]:
    """``otel-plumb run`` on POLICY and ``config`` (both written to ``tmp``), once ready: the
    process, its OTLP/gRPC port and its metrics port. A port picked free can be taken before the
    process binds it (the machine is shared): then it exits, and is started on other ports."""
    (tmp / "policy.yaml").write_text(POLICY)
    (tmp / "config.yaml").write_text(config)
    for attempt in range(3):
        grpc_port, metrics_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "otel_plumb", "run", "--config", str(tmp / "config.yaml"),
               "--policy", str(tmp / "policy.yaml"), "--grpc", f"127.0.0.1:{grpc_port}", "--http", "127.0.0.1:0",
               "--metrics", f"127.0.0.1:{metrics_port}"]  # fmt: skip
        proc = subprocess.Popen(cmd)
        if wait_ready(metrics_port, timeout, proc):
            return proc, grpc_port, metrics_port
        if attempt == 2 or proc.returncode is None:
            proc.kill()
            raise RuntimeError("otel-plumb run did not become ready")
    raise AssertionError("unreachable")


async def stop_processor(proc: subprocess.Popen[bytes], sink: Sink) -> None:
    proc.terminate()
    await asyncio.to_thread(proc.wait, 60)
    if sink.server is not None:
        await sink.server.stop(None)


async def main(args: argparse.Namespace) -> None:
    print(f"processor: {builds()}")
    print(f"building {args.requests} requests of {TRACES_PER_REQUEST * SPANS_PER_TRACE} spans ...", flush=True)
    requests = [build_request(n) for n in range(args.requests)]
    total = args.requests * TRACES_PER_REQUEST * SPANS_PER_TRACE

    # Phase 1: the no-op receiver on the same load.
    noop_rate = total / await noop_seconds(requests, args.concurrency)

    # Phase 2: the processor, annotating and exporting to the sink.
    sink = Sink()
    sink_port = await sink.start()
    tmp = Path(tempfile.mkdtemp(prefix="otel-plumb-bench-"))
    proc, grpc_port, metrics_port = await asyncio.to_thread(start_processor, tmp, (
        f"assembly: {{{ASSEMBLY}}}\n"
        f"exporters: {{otlp: {{endpoint: 'grpc://127.0.0.1:{sink_port}', state_dir: '{tmp / 'state'}'}}}}\n"
        "logging: {level: warning}\n"
    ), 30)
    try:
        start = time.monotonic()
        # CPU seconds of the load generator (this process: sender and sink) and of the processor,
        # to show whether the sender, which shares the cores, holds the processor back.
        own_cpu, proc_cpu = time.process_time(), cpu_seconds(proc.pid)
        ingest_s, acked, throttles = await send_all(grpc_port, requests, args.concurrency)
        await sink.wait_for(total, 120)
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
        for share in LATENCY_SHARES:
            latencies = await paced(grpc_port, proc.pid, 8, rate * share, sink, whole_trace_requests())
            print(latency_line(p50(latencies), p99(latencies), len(latencies), rate, share))
        steady = rate * 0.5
        if args.soak:
            soak_rate = args.soak_rate or steady
            print(f"soak: {soak_rate:,.0f} spans/s for {args.soak:.0f}s")
            await paced(grpc_port, proc.pid, args.soak, soak_rate, sink, whole_trace_requests(), rss_every=5)
            print(f"processor peak RSS after the soak: {rss_kib(proc.pid, 'VmHWM') / 1024:,.0f} MiB")
    finally:
        await stop_processor(proc, sink)
        shutil.rmtree(tmp, ignore_errors=True)  # its queue: GBs at 100 KB per model call


def count_spans(requests: list[tuple[bytes, list[bytes]]]) -> int:
    return sum(
        len(ss.spans)
        for body, _ in requests
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans
        for ss in rs.scope_spans
    )


async def run_point(
    requests: list[tuple[bytes, list[bytes]]], total: int, buffered_max: int, args: argparse.Namespace,
    warm_up: list[list[tuple[bytes, list[bytes]]]], paced_requests: list[tuple[bytes, list[bytes], int]] | None = None,
) -> dict[str, float]:
    """One measurement: the no-op receiver on ``requests``, then the processor (annotate export to
    a sink) on the same; spans/s end to end, the processor's CPU per span, its peak RSS over its
    RSS once ready, per span buffered at most at once (``buffered_max``). ``warm_up``: waves of
    requests of other traces sent first, each exported in full before the next, before the
    measurement starts (so that it measures a processor whose heap and state files have grown to
    their working set, as a long-running one has). ``paced_requests`` (body, root trace ids,
    spans): then sent at each of LATENCY_SHARES of the rate measured, for the decision latency at
    that load (p50, p99, traces)."""
    noop_s = await noop_seconds(requests, args.concurrency)
    sink = Sink()
    sink_port = await sink.start()
    tmp = Path(tempfile.mkdtemp(prefix="otel-plumb-bench-"))
    proc, grpc_port, metrics_port = await asyncio.to_thread(start_processor, tmp, (
        "receivers: {max_message_mib: 256, max_buffered_spans: 10000000}\n"
        f"assembly: {{{ASSEMBLY}, max_traces: 200000, max_spans_per_trace: 20000, "
        "max_buffered_bytes: 16GiB}\n"
        f"exporters: {{otlp: {{endpoint: 'grpc://127.0.0.1:{sink_port}', state_dir: '{tmp / 'state'}', "
        "queue: {max_spans: 10000000, max_bytes: 16GiB}}}\n"
        "logging: {level: warning}\n"
        + (f"verdict_log: {{path: '{tmp / 'verdicts.jsonl'}'}}\n" if args.verdict_log else "")
    ), 60)
    try:
        ready_kib = rss_kib(proc.pid)
        for wave in warm_up:
            await send_all(grpc_port, wave, args.concurrency)
            await sink.wait_for(count_spans(wave), 600)
            sink.spans = 0
        start = time.monotonic()
        proc_cpu, main_cpu = cpu_seconds(proc.pid), cpu_seconds(proc.pid, proc.pid)
        _, _, throttles = await send_all(grpc_port, requests, args.concurrency)
        await sink.wait_for(total, 600)
        e2e_s = time.monotonic() - start
        proc_cpu, main_cpu = cpu_seconds(proc.pid) - proc_cpu, cpu_seconds(proc.pid, proc.pid) - main_cpu
        peak_kib = rss_kib(proc.pid, "VmHWM")
        metrics = await asyncio.to_thread(scrape, metrics_port)
        latency: dict[str, float] = {}
        if paced_requests is not None:
            # One stream across the shares: a wave cut off by one share's end goes on in the next.
            stream = iter(paced_requests)
            for share in LATENCY_SHARES:
                latencies = await paced(grpc_port, proc.pid, 8, total / e2e_s * share, sink, stream)
                latency |= {f"p50@{share}": p50(latencies), f"p99@{share}": p99(latencies),
                            f"traces@{share}": len(latencies)}  # fmt: skip
    finally:
        await stop_processor(proc, sink)
        shutil.rmtree(tmp, ignore_errors=True)  # its queue: GBs at 100 KB per model call
    return {
        "rate": total / e2e_s, "noop": total / noop_s, "cpu_us": proc_cpu / total * 1e6, "main": main_cpu / e2e_s,
        "at_sink": sink.spans,
        "throttles": throttles, "peak_mib": peak_kib / 1024,
        "evicted": metric_sum(metrics, "plumb_traces_evicted_total"),
        "unchecked": metric_sum(metrics, "plumb_spans_unchecked_total"),
        "bytes_per_buffered": (peak_kib - ready_kib) * 1024 / max(1, buffered_max),
        **latency,
    }  # fmt: skip


def realistic_shape(point: str | None, value: int, args: argparse.Namespace) -> tuple[int, int, int, int]:
    """(traces, spans per trace, traces in flight, payload) for a sweep point (or the flags)."""
    per_trace, in_flight, payload = args.spans_per_trace, args.traces_in_flight, args.payload
    if point == "spans":
        # Enough traces at once that requests are full (512 spans across them), at least 8.
        per_trace, in_flight = value, max(8, -(-2 * REALISTIC_BATCH // value))
    elif point == "traces":
        per_trace, in_flight = 11, value
    elif point == "payload":
        payload = value
    total = args.spans
    if point == "payload" and payload:
        total = min(total, (256 << 20) // payload)  # a few hundred MB of content per run at most
    traces = max(in_flight, total // per_trace)
    return traces, per_trace, in_flight, payload


def builds() -> str:
    """The compiled parts the processor runs (``OTEL_PLUMB_PURE_PYTHON=1`` in this environment
    reaches it too)."""
    return f"decoder {otlp.DECODER}, core {otel_plumb.core()}"


async def realistic_main(args: argparse.Namespace) -> None:
    points: list[tuple[str | None, int]] = [(args.sweep, v) for v in SWEEPS[args.sweep]] if args.sweep else [(None, 0)]
    print(f"processor: {builds()}")
    print(f"realistic delivery: requests of up to {REALISTIC_BATCH} spans across the traces in flight, roots in a "
          f"later request, 20% HTTP/DB spans; policy of 10 invariants (one CEL), annotate export to a sink"
          f"{', verdict log on' if args.verdict_log else ''}; measured after {args.warm_up} warm-up wave(s) of other "
          f"traces; median of {args.repeat} round(s) over "
          "the points",
          flush=True)  # fmt: skip
    header = (f"{'point':>22} {'spans':>9} {'spans/s':>9} {'CPU us/span':>12} {'no-op spans/s':>14} "
              f"{'ratio':>6} {'main thread':>11} {'throttled':>9} {'peak MiB':>9} {'B/buffered span':>16}")  # fmt: skip
    print(header)
    # Rounds interleave the points (each point once per round), so that a drift in the machine's
    # speed over the sweep weighs on every point alike; a point's figures are its median run.
    shapes = []
    for point, value in points:
        traces, per_trace, in_flight, payload = realistic_shape(point, value, args)
        non_agent = value if point == "non-agent" else 20
        requests = realistic_requests(traces, per_trace, in_flight, payload, non_agent=non_agent)
        # Waves of other traces first (ids from other seeds), as a long-running processor has seen.
        warm_up = [
            realistic_requests(in_flight, per_trace, in_flight, payload, seed=seed, non_agent=non_agent)
            for seed in range(1, args.warm_up + 1)
        ]
        # Without a sweep, the decision latency at LATENCY_SHARES of the rate too, on fresh traces:
        # 672,000 spans, enough for 8 s at each share of 52,000 spans/s (a faster processor runs
        # out of them sooner).
        paced_requests = None if point else [
            (body, roots, count_spans([(body, roots)])) for body, roots in realistic_requests(
                672_000 // per_trace, per_trace, in_flight, payload, seed=args.warm_up + 1, non_agent=non_agent
            )
        ]  # fmt: skip
        label = {"spans": f"{value} spans/trace", "traces": f"{value:,} in flight", "payload": f"{value:,} B payload",
                 "non-agent": f"{value}% non-agent", None: f"{per_trace}x{in_flight:,}/{payload} B"}[point]  # fmt: skip
        shapes.append((label, requests, count_spans(requests), in_flight * (per_trace - 1), warm_up, paced_requests))
    runs: list[list[dict[str, float]]] = [[] for _ in shapes]
    for _ in range(args.repeat):
        for point_runs, (_, requests, total, buffered_max, warm_up, paced_requests) in zip(runs, shapes, strict=True):
            point_runs.append(await run_point(requests, total, buffered_max, args, warm_up, paced_requests))
    cpu_by_point: list[float] = []
    for point_runs, (label, _, total, _, _, _) in zip(runs, shapes, strict=True):
        med = {k: statistics.median(r[k] for r in point_runs) for k in point_runs[0]}
        cpu_by_point.append(med["cpu_us"])
        print(f"{label:>22} {total:>9,} {med['rate']:>9,.0f} {med['cpu_us']:>12.1f} {med['noop']:>14,.0f} "
              f"{med['rate'] / med['noop']:>6.1%} {med['main']:>11.0%} {med['throttles']:>9,.0f} "
              f"{med['peak_mib']:>9,.0f} {med['bytes_per_buffered']:>16,.0f}", flush=True)  # fmt: skip
        if med["at_sink"] < total or med["evicted"] or med["unchecked"]:
            print(f"  note: {med['at_sink']:,.0f} of {total:,} spans reached the sink; traces evicted "
                  f"{med['evicted']:,.0f}, spans unchecked (late, over a limit) {med['unchecked']:,.0f}")  # fmt: skip
        for share in LATENCY_SHARES:
            if f"p99@{share}" in med:  # measured without a sweep
                print("  " + latency_line(med[f"p50@{share}"], med[f"p99@{share}"], med[f"traces@{share}"],
                                          med["rate"], share))  # fmt: skip
    if args.sweep == "non-agent":
        # Per round (the two points measured minutes apart at most), then the median.
        ratios = [agent["cpu_us"] / service["cpu_us"] for agent, service in zip(runs[0], runs[-1], strict=True)]
        print(f"CPU per span, agent traces / service traces (no agent span): {statistics.median(ratios):.2f}x "
              f"(per round: {', '.join(f'{r:.2f}' for r in ratios)}; target: >= 3x)")  # fmt: skip
    elif len(cpu_by_point) > 1:
        print(f"CPU per span, largest / smallest over the sweep: {max(cpu_by_point) / min(cpu_by_point):.2f}x; "
              f"last / first: {cpu_by_point[-1] / cpu_by_point[0]:.2f}x (target for spans and traces: <= 1.5x)")


async def paced(
    port: int, pid: int, seconds: float, rate: float, sink: Sink, requests: Iterator[tuple[bytes, list[bytes], int]],
    rss_every: float | None = None,
) -> list[float]:
    """Send ``requests`` (body, the trace ids whose roots it carries, its spans) at ``rate``
    spans/s for ``seconds`` or until none is left (optionally printing the processor's RSS);
    returns each trace's decision latency beyond idle_timeout (its root's ack -> the annotated
    root at the sink)."""
    acked: dict[bytes, float] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        export = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        start = time.monotonic()
        next_print = start
        sent = 0
        request = next(requests, None)
        while request is not None and (tick := time.monotonic()) < start + seconds:
            body, root_ids, spans = request
            try:
                await export(body, timeout=60)
                sent += spans
                now = time.monotonic()
                acked.update((t, now) for t in root_ids)
                request = next(requests, None)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                    raise
                await asyncio.sleep(_retry_delay(exc))
            if rss_every is not None and tick >= next_print:
                rss = rss_kib(pid) / 1024
                print(f"  t={tick - start:6.1f}s  sent {sent:>10,} spans  RSS {rss:8.1f} MiB", flush=True)
                next_print = tick + rss_every
            await asyncio.sleep(max(0.0, spans / rate - (time.monotonic() - tick)))
    deadline = time.monotonic() + 30
    while any(t not in sink.root_arrival for t in acked) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return [sink.root_arrival[t] - a - IDLE_TIMEOUT for t, a in acked.items() if t in sink.root_arrival]


def whole_trace_requests() -> Iterator[tuple[bytes, list[bytes], int]]:
    """Fresh requests of complete traces (today's mode), without end."""
    for n in itertools.count():
        body, trace_ids = build_request(n)
        yield body, trace_ids, TRACES_PER_REQUEST * SPANS_PER_TRACE


def latency_line(p50_s: float, p99_s: float, traces: float, rate: float, share: float) -> str:
    verdict = "ok" if p99_s <= 1.0 else "MISSED"
    return (f"decision latency beyond idle_timeout at {rate * share:,.0f} spans/s ({share:.0%} of the measured "
            f"rate): p50 {p50_s:.3f}s  p99 {p99_s:.3f}s  over {traces:,.0f} traces  [{verdict}: p99 <= 1 s]")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, timeout: float, proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``proc`` answers ready on ``port`` within ``timeout`` (False once it has exited)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.05)
    return False


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
    parser.add_argument("--realistic", action="store_true", help="the SDK's delivery shape (see above)")
    parser.add_argument("--sweep", choices=sorted(SWEEPS), help="realistic mode at each point of one dimension")
    parser.add_argument("--repeat", type=int, default=1, help="rounds over the points; medians are printed")
    parser.add_argument("--warm-up", type=int, default=1, help="realistic mode: waves of other traces sent first")
    parser.add_argument("--spans", type=int, default=60_000, help="realistic mode: spans per run, about")
    parser.add_argument("--spans-per-trace", type=int, default=21, help="realistic mode: spans per trace")
    parser.add_argument("--traces-in-flight", type=int, default=1000, help="realistic mode: traces at once")
    parser.add_argument("--payload", type=int, default=1024, help="realistic mode: content bytes per model call")
    parser.add_argument("--verdict-log", action="store_true", help="realistic mode: the processor writes a verdict log")
    parser.add_argument("--role", choices=["bench", "noop"], default="bench", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.role == "noop":
        asyncio.run(noop_server())
    else:
        asyncio.run(realistic_main(ns) if ns.realistic or ns.sweep else main(ns))
