"""Export over OTLP/HTTP: a backend answering 503 with Retry-After first, then 200; the export
queue filling up throttles the receivers; oversized requests are refused."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import aiohttp
import grpc
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from test_live_backpressure import trace_request
from test_live_support import config, free_port, wait_until

from otel_plumb.processor import Processor
from otel_plumb.receive.otlp import ReceivedRequest
from otel_plumb.receive.sink import Throttled


async def test_http_export_retries_after_503_and_delivers_once(tmp_path: Path) -> None:
    received: list[ExportTraceServiceRequest] = []
    answers = [503, 503]  # then 200

    async def traces(request: web.Request) -> web.Response:
        assert request.headers["Content-Type"] == "application/x-protobuf"
        assert request.headers["Authorization"] == "Bearer t0ken"
        if answers:
            return web.Response(status=answers.pop(), headers={"Retry-After": "0"})
        received.append(ExportTraceServiceRequest.FromString(await request.read()))
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    cfg = config(tmp_path, f"http://127.0.0.1:{port}")
    assert cfg.exporters.otlp is not None
    cfg.exporters.otlp.headers = {"Authorization": "Bearer t0ken"}
    cfg.exporters.otlp.compression = "gzip"
    processor = Processor(cfg)
    await processor.start()
    try:
        sent = [trace_request(tools=3) for _ in range(4)]
        for request in sent:
            await processor.ingest(ReceivedRequest.of(request), "grpc")

        def count() -> int:
            return sum(len(ss.spans) for r in received for rs in r.resource_spans for ss in rs.scope_spans)

        await wait_until(lambda: count() == 16, 10, "spans delivered over HTTP")
        assert await processor.stop()
    finally:
        await processor.stop()
        await runner.cleanup()
    assert not answers, "the 503s were answered and retried"
    ids = Counter(s.span_id for r in received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans)
    expected = {s.span_id for r in sent for s in r.resource_spans[0].scope_spans[0].spans}
    assert set(ids) == expected and set(ids.values()) == {1}


async def test_full_export_queue_throttles_receivers(tmp_path: Path) -> None:
    # Nothing listens there: the queue only grows.
    cfg = config(tmp_path, f"grpc://127.0.0.1:{free_port()}", assembly={"idle_timeout": 0.05, "tick": 0.02})
    assert cfg.exporters.otlp is not None
    cfg.exporters.otlp.queue.max_spans = 10
    processor = Processor(cfg)
    await processor.start()
    try:
        await processor.ingest(ReceivedRequest.of(trace_request(tools=9)), "grpc")  # 10 spans
        exporter = processor.exporter
        assert exporter is not None
        await wait_until(lambda: exporter.queued_spans == 10, 5, "the trace queued for export")
        try:
            await processor.ingest(ReceivedRequest.of(trace_request()), "grpc")
            raise AssertionError("accepted with a full export queue")
        except Throttled as exc:
            assert exc.overloaded and "export queue" in exc.reason
    finally:
        await processor.stop(grace=0)


async def test_oversized_requests_are_refused(tmp_path: Path) -> None:
    processor = Processor(config(tmp_path, receivers={"max_message_mib": 0.01}))  # ~10 KiB
    await processor.start()
    big = trace_request(tools=1)
    big.resource_spans[0].scope_spans[0].spans[1].attributes.add(key="blob").value.string_value = "x" * 20_000
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}") as channel:
            try:
                await TraceServiceStub(channel).Export(big)
                raise AssertionError("oversized gRPC request accepted")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{processor.http_port}/v1/traces"
            headers = {"Content-Type": "application/x-protobuf"}
            async with session.post(url, data=big.SerializeToString(), headers=headers) as resp:
                assert resp.status == 413
        assert processor.intake.spans_buffered == 0
    finally:
        await processor.stop()
