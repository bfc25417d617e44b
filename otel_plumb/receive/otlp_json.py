"""OTLP/JSON (the OTLP spec's JSON mapping, and the Collector file exporter's lines) -> protobuf.

protobuf's own JSON parser already accepts camelCase and snake_case keys, enum names or
numbers, and int64 as string or number; OTLP/JSON differs from proto3 JSON only in encoding
trace and span ids as hex instead of base64, which is converted here.
"""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})
# Deepest JSON nesting read: beyond what protobuf's parser takes (100 nested messages) anyway,
# and far below Python's recursion limit.
MAX_DEPTH = 256



def _hex_ids_to_base64(node: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k in _ID_KEYS and isinstance(v, str):
                try:
                    v = base64.b64encode(bytes.fromhex(v)).decode() if v else ""
                except ValueError as exc:
                    raise ValueError(f"{k} is not hex: {v!r}") from exc
            else:
                v = _hex_ids_to_base64(v, depth + 1)
            out[k] = v
        return out
    if isinstance(node, list):
        return [_hex_ids_to_base64(x, depth + 1) for x in node]
    return node


def parse_request(obj: dict[str, Any]) -> ExportTraceServiceRequest:
    """An OTLP/JSON ExportTraceServiceRequest (already decoded from JSON) -> protobuf.

    Raises ValueError (with protobuf's message) when the object is not a valid request,
    including one nested deeper than ``MAX_DEPTH``.
    """
    message = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(_hex_ids_to_base64(obj), message, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError) as exc:
        raise ValueError(str(exc)) from exc
    return message


def request_to_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """protobuf -> OTLP/JSON dict with hex ids (the inverse of ``parse_request``)."""
    obj = json_format.MessageToDict(request)
    return _base64_ids_to_hex(obj)  # type: ignore[no-any-return]


def _base64_ids_to_hex(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: (base64.b64decode(v).hex() if k in _ID_KEYS and isinstance(v, str) else _base64_ids_to_hex(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_base64_ids_to_hex(x) for x in node]
    return node
