"""Trace data for the file, replay and coverage tests: real spans from the OpenTelemetry SDK,
encoded by the OTLP exporter's own encoder, written in each file form the readers accept."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zstandard
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from otel_plumb.receive.otlp_json import request_to_json


def agent_traces(
    n: int = 2, *, with_args: bool = True, fail_tool: str | None = None, case_ids: bool = False
) -> list[ReadableSpan]:
    """``n`` traces of an invoice agent: invoke_agent > chat, execute_tool x2 (children end first)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "ap-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("ap.agent")
    for i in range(n):
        root_attrs: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "ap"}
        if case_ids:
            root_attrs["plumb.case.id"] = f"INV-{i}"
        with tracer.start_as_current_span("invoke_agent ap", attributes=root_attrs):
            with tracer.start_as_current_span("chat gpt-4o", attributes={"gen_ai.operation.name": "chat"}):
                pass
            for tool, args in (("fetch_invoice", {"id": f"INV-{i}"}), ("schedule_payment", {"amount_gbp": 10 * i})):
                attrs: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool}
                if with_args:
                    attrs["gen_ai.tool.call.arguments"] = json.dumps(args)
                with tracer.start_as_current_span(f"execute_tool {tool}", attributes=attrs) as span:
                    if tool == fail_tool:
                        span.set_status(Status(StatusCode.ERROR, "503 upstream"))
    provider.shutdown()
    return list(exporter.get_finished_spans())


def request(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    return encode_spans(spans)


def otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    return request_to_json(encode_spans(spans))  # type: ignore[no-any-return]


def records(payloads: Sequence[bytes]) -> bytes:
    """The Collector file exporter's framing: 4-byte big-endian length, then the message."""
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


def write_json_lines(path: Path, batches: Sequence[Sequence[ReadableSpan]], extra_lines: Sequence[str] = ()) -> Path:
    lines = [json.dumps(otlp_json(batch)) for batch in batches] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_records(path: Path, batches: Sequence[Sequence[ReadableSpan]], *, zstd: bool = False) -> Path:
    payloads = [request(b).SerializeToString() for b in batches]
    if zstd:
        payloads = [zstandard.ZstdCompressor().compress(p) for p in payloads]
    path.write_bytes(records(payloads))
    return path


def by_trace(spans: Sequence[ReadableSpan]) -> list[list[ReadableSpan]]:
    out: dict[int, list[ReadableSpan]] = {}
    for s in spans:
        assert s.context is not None
        out.setdefault(s.context.trace_id, []).append(s)
    return list(out.values())
