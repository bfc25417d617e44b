"""Back-pressure and bad input on the live receivers: throttled clients retry and nothing is lost;
malformed requests are refused and counted."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
from pathlib import Path

import aiohttp
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from test_live_support import config, metric, scrape, scrape_when_sent, wait_until

from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.processor import Processor
from otel_plumb.receive.otlp import ReceivedRequest
from otel_plumb.receive.otlp_json import request_to_json


def trace_request(tools: int = 4, trace_id: bytes | None = None) -> ExportTraceServiceRequest:
    """One trace: an invoke_agent root and ``tools`` execute_tool children."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "load"
    ss = rs.scope_spans.add()
    tid = trace_id or os.urandom(16)
    root = ss.spans.add(trace_id=tid, span_id=os.urandom(8), name="invoke_agent load", start_time_unix_nano=1)
    root.end_time_unix_nano = 100
    root.attributes.append(KeyValue(key="gen_ai.operation.name"))
    root.attributes[-1].value.string_value = "invoke_agent"
    for n in range(tools):
        span = ss.spans.add(trace_id=tid, span_id=os.urandom(8), parent_span_id=root.span_id, name="execute_tool t")
        span.start_time_unix_nano, span.end_time_unix_nano = 10 + n, 11 + n
        for key, value in (("gen_ai.operation.name", "execute_tool"), ("gen_ai.tool.name", f"tool_{n}")):
            span.attributes.add(key=key).value.string_value = value
    return request


async def test_overloaded_processor_throttles_and_clients_retry_without_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = OtlpBackend()
    await backend.start(0)
    processor = Processor(
        config(
            tmp_path,
            backend.endpoint,
            receivers={"max_buffered_spans": 30, "retry_after": 0.05},
            assembly={"idle_timeout": 0.2, "tick": 0.05},
        )
    )
    await processor.start()
    throttled: list[float] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}") as channel:
            stub = TraceServiceStub(channel)

            async def send(request: ExportTraceServiceRequest) -> None:
                while True:
                    try:
                        await stub.Export(request, timeout=5)
                        return
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                        status = rpc_status.from_call(exc)  # type: ignore[arg-type]
                        assert status is not None
                        info = error_details_pb2.RetryInfo()
                        assert status.details[0].Unpack(info)
                        delay = info.retry_delay.ToTimedelta().total_seconds()
                        throttled.append(delay)
                        await asyncio.sleep(delay)

            requests = [trace_request() for _ in range(40)]
            async with asyncio.timeout(20):
                await asyncio.gather(*(send(r) for r in requests))
        total = 40 * 5
        await wait_until(lambda: backend.span_count >= total, 15, "every span exported")
        # HTTP clients get 429 with Retry-After while the buffers are full.
        for _ in range(6):
            await processor.ingest(ReceivedRequest.of(trace_request()), "grpc")
        async with aiohttp.ClientSession() as session:
            body = trace_request().SerializeToString()
            url = f"http://127.0.0.1:{processor.http_port}/v1/traces"
            headers = {"Content-Type": "application/x-protobuf"}
            # Refused before it is decoded: under overload a refusal costs no decoding.
            parsed: list[bytes] = []
            parse = ReceivedRequest.parse
            monkeypatch.setattr(ReceivedRequest, "parse", lambda raw: parsed.append(raw) or parse(raw))
            async with session.post(url, data=body, headers=headers) as resp:
                assert resp.status == 429 and resp.headers["Retry-After"] == "1"
            assert parsed == []
            await wait_until(lambda: processor.intake.spans_buffered < 30, 5, "buffers to drain")
            async with session.post(url, data=body, headers=headers) as resp:
                assert resp.status == 200
            assert parsed == [body]
        total += 6 * 5 + 5
        await wait_until(lambda: backend.span_count >= total, 10, "the rest exported")
        text = await scrape_when_sent(processor.metrics_port or 0, total)
    finally:
        await processor.stop()
        await backend.stop()
    assert throttled and all(d == 0.05 for d in throttled)
    received = metric(text, "plumb_spans_received_total")
    exported = metric(text, "plumb_export_spans_total", outcome="sent")
    dropped = metric(text, "plumb_spans_dropped_total")
    assert received == exported + dropped == total
    assert dropped == 0
    assert backend.span_count == total


async def test_malformed_requests_are_refused_and_counted(tmp_path: Path) -> None:
    processor = Processor(config(tmp_path))
    await processor.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}") as channel:
            raw = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=None,
                response_deserializer=ExportTraceServiceResponse.FromString,
            )
            try:
                await raw(b"\xff\xff\xff not protobuf")
                raise AssertionError("garbage was accepted")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
            # Partial success: the span without a valid trace id is refused, the others taken.
            request = trace_request(tools=2)
            request.resource_spans[0].scope_spans[0].spans[2].trace_id = b"\x01\x02"
            response = await TraceServiceStub(channel).Export(request)
            assert response.partial_success.rejected_spans == 1
            assert "trace_id" in response.partial_success.error_message
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{processor.http_port}/v1/traces"
            async with session.post(url, data=b"\xff\xff", headers={"Content-Type": "application/x-protobuf"}) as r:
                assert r.status == 400
            async with session.post(url, data=b"{not json", headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400 and "message" in json.loads(await r.read())
            # OTLP/JSON, gzip-compressed: accepted.
            body = gzip.compress(json.dumps(request_to_json(trace_request(tools=3))).encode())
            headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
            async with session.post(url, data=body, headers=headers) as r:
                assert r.status == 200 and json.loads(await r.read()) == {}
            # Last: the server closes a connection whose body it could not inflate.
            not_gzip = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
            async with session.post(url, data=b"plain bytes", headers=not_gzip) as r:
                assert r.status == 400
        text = await asyncio.to_thread(scrape, processor.metrics_port or 0)
    finally:
        await processor.stop()
    assert metric(text, "plumb_spans_dropped_total", reason="malformed") == 5  # 4 bad requests + 1 bad span
    assert metric(text, "plumb_spans_received_total", receiver="grpc") == 2
    assert metric(text, "plumb_spans_received_total", receiver="http") == 4
