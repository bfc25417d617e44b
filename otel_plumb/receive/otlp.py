"""OTLP protobuf messages -> SpanRecord. Shared by the network receivers and the file readers.

``decode_request`` turns serialized request bytes into records with the compiled decoder
(``_otlp_native.c``) when it was built and imports, else with the protobuf runtime and the
functions below; both give the same records and reject the same bytes with the same
``DecodeError``. ``OTEL_PLUMB_PURE_PYTHON=1`` forces the latter; ``DECODER`` names the one in use.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

from otel_plumb.model.span import SpanEvent, SpanRecord

PURE_PYTHON_ENV = "OTEL_PLUMB_PURE_PYTHON"


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, kind)


def attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # The hot path of decoding. A non-empty string_value can only be the set oneof member, so
    # most values are read without asking WhichOneof; ints are read inline, saving a call.
    for kv in kvs:
        value = kv.value
        text = value.string_value
        if text:
            out[kv.key] = text
            continue
        kind = value.WhichOneof("value")
        if kind == "int_value":
            out[kv.key] = value.int_value
        elif kind == "string_value":
            out[kv.key] = ""
        else:
            out[kv.key] = any_value(value)
    return out


def span_record(span: Span, resource: dict[str, Any], scope_name: str) -> SpanRecord:
    status = span.status
    events = span.events
    return SpanRecord(
        span.trace_id.hex(),
        span.span_id.hex(),
        span.parent_span_id.hex() or None,
        span.name,
        kind=span.kind,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        status_code=status.code,
        status_message=status.message,
        attributes=attributes(span.attributes),
        events=[SpanEvent(e.name, e.time_unix_nano, attributes(e.attributes)) for e in events] if events else None,
        resource=resource,
        scope_name=scope_name,
    )


def resource_spans_records(rs: ResourceSpans) -> Iterator[tuple[SpanRecord, Span]]:
    """Each span of one ResourceSpans with its proto message (the live processor forwards the latter)."""
    resource = attributes(rs.resource.attributes)
    for ss in rs.scope_spans:
        scope_name = ss.scope.name
        for span in ss.spans:
            yield span_record(span, resource, scope_name), span


def request_records(request: ExportTraceServiceRequest) -> Iterator[SpanRecord]:
    for rs in request.resource_spans:
        for record, _ in resource_spans_records(rs):
            yield record


def pure_decode_request(data: bytes) -> list[SpanRecord]:
    """The spans of a serialized ExportTraceServiceRequest, through the protobuf runtime.
    Raises ``google.protobuf.message.DecodeError`` on malformed bytes."""
    return list(request_records(ExportTraceServiceRequest.FromString(data)))


def _native_decoder() -> tuple[Callable[[bytes], list[SpanRecord]] | None, str]:
    """The compiled decoder, or None and why not."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None, f"{PURE_PYTHON_ENV} is set"
    try:
        from otel_plumb.receive import _otlp_native  # type: ignore[attr-defined]
    except ImportError as exc:
        return None, f"no compiled decoder: {exc}"
    return _otlp_native.decode_request, f"compiled: {os.path.basename(_otlp_native.__file__)}"


native_decode_request, DECODER_DETAIL = _native_decoder()
DECODER = "native" if native_decode_request else "pure-python"
decode_request: Callable[[bytes], list[SpanRecord]] = native_decode_request or pure_decode_request


def to_key_values(values: dict[str, Any]) -> list[KeyValue]:
    """Plain Python values -> OTLP KeyValues (for annotations and generated spans)."""
    return [KeyValue(key=k, value=to_any_value(v)) for k, v in values.items()]


def to_any_value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, bytes):
        return AnyValue(bytes_value=v)
    if isinstance(v, (list, tuple)):
        out = AnyValue()
        out.array_value.values.extend(to_any_value(x) for x in v)
        return out
    if isinstance(v, dict):
        out = AnyValue()
        out.kvlist_value.values.extend(to_key_values(v))
        return out
    return AnyValue(string_value="" if v is None else str(v))
