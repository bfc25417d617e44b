"""Assembly limits over real sockets: memory bounded in bytes (retryable refusals past the
budget), evictions counted and logged at a rate limit, and evictions that cannot hide a
violation (tombstones for late spans, fairness between services). During each flood the
process stays responsive: /healthz answers within a second."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from test_live_support import config, metric, scrape, wait_until

from otel_plumb.model import Decided
from otel_plumb.processor import Processor

MiB = 1 << 20
POLICY = """
policy: limits
invariants:
  - {id: no-wire, never_call: wire_funds}
  - {id: one-refund, call_count: {tool: refund, max: 1}}
"""


def request(
    *traces: tuple[bytes, str, list[str]], payload: int = 0, root: bytes | None = None
) -> ExportTraceServiceRequest:
    """One request: per (trace id, service, tool names) an execute_tool span per tool whose
    parent was never sent (so the trace has no root and waits), optionally with ``payload``
    bytes of arguments each; ``root``: also send the root of that trace (the spans' parent)."""
    out = ExportTraceServiceRequest()
    for trace_id, service, tools in traces:
        rs = out.resource_spans.add()
        rs.resource.attributes.add(key="service.name").value.string_value = service
        ss = rs.scope_spans.add()
        parent = _parent(trace_id)
        if root == trace_id:
            span = ss.spans.add(trace_id=trace_id, span_id=parent, name="invoke_agent a")
            span.start_time_unix_nano, span.end_time_unix_nano = 1, 10_000
            span.attributes.add(key="gen_ai.operation.name").value.string_value = "invoke_agent"
        for tool in tools:
            span = ss.spans.add(
                trace_id=trace_id, span_id=os.urandom(8), parent_span_id=parent, name=f"execute_tool {tool}"
            )
            span.start_time_unix_nano = time.time_ns()
            span.end_time_unix_nano = span.start_time_unix_nano + 1000
            for key, value in (("gen_ai.operation.name", "execute_tool"), ("gen_ai.tool.name", tool)):
                span.attributes.add(key=key).value.string_value = value
            if payload:
                arguments = '{"q": "' + "x" * payload + '"}'
                span.attributes.add(key="gen_ai.tool.call.arguments").value.string_value = arguments
    return out


def _parent(trace_id: bytes) -> bytes:
    return trace_id[:8]


def rss() -> int:
    """This process's resident memory, after handing freed memory back to the system (glibc
    otherwise keeps the memory of requests already answered for reuse: noise for this test)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@asynccontextmanager
async def healthz_probe(port: int) -> AsyncIterator[list[float]]:
    """Probes /healthz every 50 ms for as long as the block runs; yields the latencies."""
    latencies: list[float] = []
    stop = asyncio.Event()

    async def probe() -> None:
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                started = time.monotonic()
                async with session.get(f"http://127.0.0.1:{port}/healthz", timeout=aiohttp.ClientTimeout(5)) as r:
                    assert r.status == 200
                latencies.append(time.monotonic() - started)
                await asyncio.sleep(0.05)

    task = asyncio.create_task(probe())
    try:
        yield latencies
    finally:
        stop.set()
        await task
    assert latencies and max(latencies) < 1.0, f"/healthz took {max(latencies):.2f}s"


def policy_file(tmp_path: Path) -> str:
    path = tmp_path / "limits.yaml"
    path.write_text(POLICY)
    return str(path)


async def _text(processor: Processor) -> str:
    return await asyncio.to_thread(scrape, processor.metrics_port or 0)


async def test_the_byte_budget_refuses_retryably_and_memory_stays_bounded(tmp_path: Path) -> None:
    budget = 64 * MiB
    processor = Processor(config(
        tmp_path, assembly={"idle_timeout": 60, "max_wait": 60, "max_buffered_bytes": budget},
        receivers={"retry_after": 0.25},
    ))  # fmt: skip
    await processor.start()
    accepted = refused = 0
    peak_gauge = 0.0
    sizes: list[int] = []
    try:
        base = rss()
        async with healthz_probe(processor.metrics_port or 0), grpc.aio.insecure_channel(
            f"127.0.0.1:{processor.grpc_port}", options=[("grpc.max_send_message_length", 64 * MiB)]
        ) as channel:
            stub = TraceServiceStub(channel)
            # 60 traces that never get a root, 8 MiB each (one span of 8 MiB of arguments).
            for _ in range(60):
                try:
                    await stub.Export(request((os.urandom(16), "big", ["lookup"]), payload=8 * MiB), timeout=10)
                    accepted += 1
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
                    assert status is not None
                    info = error_details_pb2.RetryInfo()
                    assert status.details[0].Unpack(info)
                    assert info.retry_delay.ToTimedelta().total_seconds() == 0.25
                    assert "memory limit" in exc.details()
                    refused += 1
                peak_gauge = max(peak_gauge, metric(await _text(processor), "plumb_buffered_bytes"))
                if (accepted + refused) % 5 == 0:
                    sizes.append(rss())
        async with aiohttp.ClientSession() as session:
            body = request((os.urandom(16), "big", ["lookup"])).SerializeToString()
            headers = {"Content-Type": "application/x-protobuf"}
            url = f"http://127.0.0.1:{processor.http_port}/v1/traces"
            async with session.post(url, data=body, headers=headers) as r:
                assert r.status == 429 and "Retry-After" in r.headers
        buffered = processor.intake.bytes_buffered
    finally:
        await processor.stop()
    # Each 8 MiB span is estimated at about 24 MiB held: three fit under 64 MiB.
    assert 2 <= accepted <= 4 and accepted + refused == 60
    one_request = 25 * MiB
    assert peak_gauge <= budget + one_request and buffered <= budget + one_request
    # Without the limiter every one of them stays (about 23 MiB of RSS each: 60 of them took
    # 1.2 GiB); with it what the process holds stays near the budget.
    grown = max(sizes) - base
    assert grown < 3 * budget, f"RSS grew by {grown / MiB:.0f} MiB"
    assert processor.intake.bytes_buffered == 0  # drained: every byte counted was released


async def test_the_budget_frees_up_when_traces_are_decided(tmp_path: Path) -> None:
    processor = Processor(config(tmp_path, assembly={"idle_timeout": 60, "max_wait": 1, "max_buffered_bytes": MiB}))
    await processor.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}") as channel:
            stub = TraceServiceStub(channel)
            await stub.Export(request((os.urandom(16), "s", ["lookup"]), payload=MiB), timeout=5)
            assert metric(await _text(processor), "plumb_buffered_bytes") > MiB
            try:
                await stub.Export(request((os.urandom(16), "s", ["lookup"])), timeout=5)
                raise AssertionError("a request past the budget was taken")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # At max_wait the trace is decided (and counted as evicted): the budget is free again.
            await wait_until(lambda: processor.intake.bytes_buffered == 0, 10, "the rootless trace to be decided")
            await stub.Export(request((os.urandom(16), "s", ["lookup"])), timeout=5)
        text = await _text(processor)
    finally:
        await processor.stop()
    assert metric(text, "plumb_traces_evicted_total", reason="max_wait") == 1
    assert metric(text, "plumb_buffered_bytes") < MiB


async def test_evictions_are_counted_and_logged_at_a_rate_limit(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING, logger="otel_plumb.processor")
    processor = Processor(config(tmp_path, assembly={"idle_timeout": 60, "max_wait": 60, "max_traces": 100}))
    await processor.start()
    try:
        async with healthz_probe(processor.metrics_port or 0), grpc.aio.insecure_channel(
            f"127.0.0.1:{processor.grpc_port}"
        ) as channel:
            stub = TraceServiceStub(channel)
            for _ in range(10):  # 1,000 traces that never get a root, 100 per request
                await stub.Export(request(*((os.urandom(16), "junk", ["lookup"]) for _ in range(100))), timeout=10)
        text = await _text(processor)
    finally:
        await processor.stop()
    assert metric(text, "plumb_traces_evicted_total", reason="max_traces") == 900
    assert metric(text, "plumb_traces_in_flight") == 100
    lines = [r.getMessage() for r in caplog.records if "let go before they completed" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("100 traces") and "max_traces: 100" in lines[0]


async def test_a_flood_cannot_hide_a_violation_of_an_evicted_trace(tmp_path: Path) -> None:
    # confirm_wait 0: early failures are reported as their span arrives, so they can be counted here.
    processor = Processor(config(
        tmp_path, policies=[policy_file(tmp_path)],
        assembly={"idle_timeout": 60, "max_wait": 60, "max_traces": 100, "confirm_wait": 0},
    ))  # fmt: skip
    await processor.start()
    v, w = os.urandom(16), os.urandom(16)
    try:
        async with healthz_probe(processor.metrics_port or 0), grpc.aio.insecure_channel(
            f"127.0.0.1:{processor.grpc_port}"
        ) as channel:
            stub = TraceServiceStub(channel)
            # V starts harmlessly; W's forbidden call is reported early, before any flood.
            await stub.Export(request((v, "agents", ["lookup", "refund"]), (w, "agents", ["wire_funds"])), timeout=5)
            text = await _text(processor)
            assert metric(text, "plumb_violations_total", invariant="no-wire") == 1
            # 1,000 junk traces of the same service evict V and W.
            for _ in range(10):
                await stub.Export(request(*((os.urandom(16), "agents", ["lookup"]) for _ in range(100))), timeout=10)
            assert not processor.intake.assembler.in_flight(v.hex()) and processor.intake.tombstone(v.hex()) is not None
            # Then V's forbidden call, and a second refund, arrive: counted once each.
            forbidden = request((v, "agents", ["wire_funds", "refund"]))
            await stub.Export(forbidden, timeout=5)
            await stub.Export(forbidden, timeout=5)  # a resend: a duplicate, not a second call
            await stub.Export(request((v, "agents", ["wire_funds"]), (w, "agents", ["wire_funds"])), timeout=5)
            # Early verdicts are counted before the request is answered.
            during = await _text(processor)
        text = await _text(processor)
    finally:
        await processor.stop()
    assert metric(during, "plumb_violations_total", invariant="no-wire") == 2
    assert metric(text, "plumb_traces_evicted_total", reason="max_traces") >= 900
    assert metric(text, "plumb_violations_total", invariant="no-wire") == 2  # V once, W once
    assert metric(text, "plumb_violations_total", invariant="one-refund") == 1
    assert metric(text, "plumb_spans_dropped_total", reason="duplicate") == 2


async def test_an_early_failure_still_waiting_when_its_trace_is_evicted_is_counted_once(tmp_path: Path) -> None:
    processor = Processor(config(
        tmp_path, policies=[policy_file(tmp_path)],
        assembly={"idle_timeout": 60, "max_wait": 60, "max_traces": 100, "confirm_wait": 60},
    ))  # fmt: skip
    await processor.start()
    w = os.urandom(16)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}") as channel:
            stub = TraceServiceStub(channel)
            await stub.Export(request((w, "agents", ["wire_funds"])), timeout=5)
            assert metric(await _text(processor), "plumb_violations_total", invariant="no-wire") == 0  # waiting
            for _ in range(10):  # a flood evicts W before its early failure is confirmed
                await stub.Export(request(*((os.urandom(16), "agents", ["lookup"]) for _ in range(100))), timeout=10)
            assert processor.intake.tombstone(w.hex()) is not None
            # the decision of the trace let go reports it (a forbidden call stands on part of a trace)
            assert metric(await _text(processor), "plumb_violations_total", invariant="no-wire") == 1
            await stub.Export(request((w, "agents", ["wire_funds"])), timeout=5)  # a late second call
        text = await _text(processor)
    finally:
        await processor.stop()
    assert metric(text, "plumb_violations_total", invariant="no-wire") == 1


async def test_a_flood_from_one_service_does_not_evict_another_services_trace(tmp_path: Path) -> None:
    processor = Processor(config(
        tmp_path, policies=[policy_file(tmp_path)], assembly={"idle_timeout": 60, "max_wait": 60, "max_traces": 100},
    ))  # fmt: skip
    decided: dict[str, Decided] = {}
    processor.on_decided(lambda d: decided.setdefault(d.trajectory.trace_id or "", d))
    await processor.start()
    a = os.urandom(16)
    try:
        async with healthz_probe(processor.metrics_port or 0), grpc.aio.insecure_channel(
            f"127.0.0.1:{processor.grpc_port}"
        ) as channel:
            stub = TraceServiceStub(channel)
            await stub.Export(request((a, "service-a", ["lookup"])), timeout=5)
            # Service B floods: 2,000 traces of two spans with different missing parents (they wait).
            for _ in range(20):
                flood = request(*((os.urandom(16), "service-b", ["lookup"]) for _ in range(100)))
                for rs in flood.resource_spans:
                    extra = rs.scope_spans[0].spans.add()
                    extra.CopyFrom(rs.scope_spans[0].spans[0])
                    extra.span_id, extra.parent_span_id = os.urandom(8), os.urandom(8)
                await stub.Export(flood, timeout=10)
            assert processor.intake.assembler.in_flight(a.hex())
            # A's forbidden call and its root arrive: A completes, whole, and is violating.
            await stub.Export(request((a, "service-a", ["wire_funds"]), root=a), timeout=5)
            text = await _text(processor)
    finally:
        await processor.stop()  # decides what is open: A has its root, so it is complete
    t = decided[a.hex()].trajectory
    assert t.complete and [s.name for s in t.tool_steps] == ["lookup", "wire_funds"]
    assert decided[a.hex()].status == "violating"
    assert metric(text, "plumb_traces_evicted_total", reason="max_traces") == 2000 - 99
    final = processor.metrics.render("")[0].decode()  # after the drain decided A
    assert metric(final, "plumb_violations_total", invariant="no-wire") == 1
