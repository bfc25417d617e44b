"""OTLP protobuf messages -> SpanRecord. Shared by the network receivers and the file readers.

``decode_request`` turns serialized request bytes into records with the compiled decoder
(``_otlp_native.c``) when it was built and imports, else with the protobuf runtime and the
functions below; both give the same records and reject the same bytes with the same
``DecodeError``. ``OTEL_PLUMB_PURE_PYTHON=1`` forces the latter; ``DECODER`` names the one in use.

``decode_spans`` (the live processor's) gives each record with its span as sent (``SpanWire``)
and where it came from (``OriginWire``), so the span is forwarded without a parsed message: the
compiled decoder slices them out of the request's bytes, the protobuf runtime serialises them.
``ReceivedRequest`` is what the receivers hand on: the bytes decoded once, the message parsed
only if something needs it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

from otel_plumb import PURE_PYTHON_ENV, pure_python
from otel_plumb.model.span import SpanEvent, SpanRecord, fingerprint


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
        dropped=span.dropped_attributes_count + span.dropped_events_count
        + sum(e.dropped_attributes_count for e in events),
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


# A span as sent: its bytes, its trace id's bytes, the index of its origin in the request, and
# its record's fingerprint (``model.span.fingerprint``; 0 for a span that could not be read).
SpanWire = tuple[bytes, bytes, int, int]
# Where spans came from, as sent: resource bytes and schema URL, scope bytes and schema URL.
OriginWire = tuple[bytes, str, bytes, str]


class UnreadSpan:
    """A span the protobuf runtime parsed whose values could not be read into a record: what
    forwarding it needs, and why."""

    __slots__ = ("end_ns", "reason", "span_id", "start_ns", "trace_id")

    def __init__(self, span: Span, reason: str) -> None:
        self.trace_id = span.trace_id.hex()
        self.span_id = span.span_id.hex()
        self.start_ns = span.start_time_unix_nano
        self.end_ns = span.end_time_unix_nano
        self.reason = reason


RequestSpans = tuple[list[SpanRecord | UnreadSpan], list[SpanWire], list[OriginWire]]


def request_spans(request: ExportTraceServiceRequest) -> RequestSpans:
    """What the compiled decoder's ``decode_spans`` gives, from a parsed request: the records,
    each span serialised again (the same message as the bytes it came in), each ScopeSpans' origin."""
    records: list[SpanRecord | UnreadSpan] = []
    wires: list[SpanWire] = []
    origins: list[OriginWire] = []
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        resource_bytes = rs.resource.SerializeToString()
        for ss in rs.scope_spans:
            scope_name, index = ss.scope.name, len(origins)
            origins.append((resource_bytes, rs.schema_url, ss.scope.SerializeToString(), ss.schema_url))
            for span in ss.spans:
                try:
                    record = span_record(span, resource, scope_name)
                except Exception as exc:  # kept to be forwarded: nothing received is lost
                    records.append(UnreadSpan(span, str(exc)))
                    wires.append((span.SerializeToString(), span.trace_id, index, 0))
                    continue
                records.append(record)
                wires.append((span.SerializeToString(), span.trace_id, index, fingerprint(record)))
    return records, wires, origins


def _native_decoder() -> tuple[Any, str]:
    """The compiled decoder's module, or None and why not."""
    if pure_python():
        return None, f"{PURE_PYTHON_ENV} is set"
    try:
        from otel_plumb.receive import _otlp_native  # type: ignore[attr-defined]
    except ImportError as exc:
        return None, f"no compiled decoder: {exc}"
    return _otlp_native, f"compiled: {os.path.basename(_otlp_native.__file__)}"


_native, DECODER_DETAIL = _native_decoder()
DECODER = "native" if _native else "pure-python"
native_decode_request: Callable[[bytes], list[SpanRecord]] | None = _native.decode_request if _native else None
native_decode_spans: Callable[[bytes], RequestSpans] | None = _native.decode_spans if _native else None
# Export requests written around kept spans' bytes (``export.annotate.encode_requests``), and
# annotations in wire format (``export.annotate.span_addition``).
native_encode_spans: Callable[[Iterable[Any], int, int | None], list[tuple[bytes, int]]] | None = (
    _native.encode_spans if _native else None
)
native_span_addition: Callable[[dict[str, Any], Iterable[Any]], bytes] | None = (
    _native.span_addition if _native else None
)
decode_request: Callable[[bytes], list[SpanRecord]] = native_decode_request or pure_decode_request


class ReceivedRequest:
    """An ExportTraceServiceRequest as a receiver took it: its bytes, its spans, and the parsed
    message only when something asks for it (forwarding with spans left out or redacted).

    ``parse`` decodes the bytes once: straight into span records with the compiled decoder (a
    large request parsed by the protobuf runtime as well cost as much again, in allocations it
    hands back to the system), else with the protobuf runtime. Both refuse the same bytes
    (``tests/test_native_decoder.py``); should they ever differ, the protobuf runtime decides.
    """

    __slots__ = ("_message", "_raw", "_spans")

    def __init__(
        self, message: ExportTraceServiceRequest | None, raw: bytes | None, spans: RequestSpans | None
    ) -> None:
        self._message, self._raw, self._spans = message, raw, spans

    @classmethod
    def parse(cls, raw: bytes) -> ReceivedRequest:
        """Raises ``DecodeError`` (or RecursionError, MemoryError) on bytes that are not a request."""
        spans = _native_spans(raw)
        if spans is not None:
            return cls(None, raw, spans)
        return cls(ExportTraceServiceRequest.FromString(raw), raw, None)

    @classmethod
    def of(cls, message: ExportTraceServiceRequest) -> ReceivedRequest:
        """A request parsed elsewhere (OTLP/JSON, tests)."""
        return cls(message, None, None)

    @property
    def message(self) -> ExportTraceServiceRequest:
        if self._message is None:
            assert self._raw is not None
            self._message = ExportTraceServiceRequest.FromString(self._raw)
        return self._message

    @property
    def raw(self) -> bytes:
        """The request's bytes: as received, else serialised."""
        if self._raw is None:
            assert self._message is not None
            self._raw = self._message.SerializeToString()
        return self._raw

    @property
    def spans(self) -> RequestSpans:
        """Each span's record, with its bytes and origin (see ``decode_spans``); from the parsed
        message when the compiled decoder did not read the request."""
        if self._spans is None:
            self._spans = request_spans(self.message)
        return self._spans

    @property
    def size(self) -> int:
        """Its size in bytes as received (serialised, when it came as JSON)."""
        return len(self._raw) if self._raw is not None else self.message.ByteSize()


def _native_spans(raw: bytes) -> RequestSpans | None:
    """``raw`` through the compiled decoder; None without it or when it refuses them."""
    if native_decode_spans is None:
        return None
    try:
        return native_decode_spans(raw)
    except Exception:
        return None


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
