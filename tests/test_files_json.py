"""The direct OTLP/JSON reader agrees with protobuf's own JSON parser on every request."""

import json
from typing import Any

from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_plumb.model import SpanRecord
from otel_plumb.receive.otlp import request_records
from otel_plumb.receive.otlp_json import _base64_ids_to_hex, parse_request
from otel_plumb.receive.otlp_json_spans import request_spans

int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
uint64 = st.integers(min_value=0, max_value=2**64 - 1)
text = st.text(max_size=12)


def _any(draw_value: Any) -> AnyValue:
    kind, v = draw_value
    if kind == "array":
        out = AnyValue()
        out.array_value.values.extend(_any(x) for x in v)
        return out
    if kind == "kvlist":
        out = AnyValue()
        out.kvlist_value.values.extend(KeyValue(key=k, value=_any(x)) for k, x in v)
        return out
    return AnyValue(**{kind: v})


scalar = st.one_of(
    st.tuples(st.just("string_value"), text),
    st.tuples(st.just("int_value"), int64),
    st.tuples(st.just("bool_value"), st.booleans()),
    st.tuples(st.just("double_value"), st.floats(allow_nan=False)),
    st.tuples(st.just("bytes_value"), st.binary(max_size=8)),
)
any_values = st.recursive(
    scalar,
    lambda children: st.tuples(st.just("array"), st.lists(children, max_size=3))
    | st.tuples(st.just("kvlist"), st.lists(st.tuples(text, children), max_size=3)),
    max_leaves=8,
)
attrs = st.lists(st.tuples(text, any_values), max_size=4)


@st.composite
def requests(draw: Any) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(1, 2))):
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(KeyValue(key=k, value=_any(v)) for k, v in draw(attrs))
        ss = rs.scope_spans.add()
        ss.scope.name = draw(text)
        for _ in range(draw(st.integers(0, 3))):
            span = Span(
                trace_id=draw(st.binary(min_size=16, max_size=16)),
                span_id=draw(st.binary(min_size=8, max_size=8)),
                parent_span_id=draw(st.sampled_from([b"", b"\x01" * 8])),
                name=draw(text),
                kind=draw(st.integers(0, 5)),
                start_time_unix_nano=draw(uint64),
                end_time_unix_nano=draw(uint64),
            )
            span.status.code = draw(st.integers(0, 2))
            span.status.message = draw(text)
            span.attributes.extend(KeyValue(key=k, value=_any(v)) for k, v in draw(attrs))
            for _ in range(draw(st.integers(0, 2))):
                event = span.events.add(name=draw(text), time_unix_nano=draw(uint64))
                event.attributes.extend(KeyValue(key=k, value=_any(v)) for k, v in draw(attrs))
            ss.spans.append(span)
    return req


def as_tuple(s: SpanRecord) -> tuple[Any, ...]:
    return (
        s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_ns, s.end_ns, s.status_code,
        s.status_message, s.attributes, [(e.name, e.time_ns, e.attributes) for e in s.events], dict(s.resource),
        s.scope_name,
    )


@settings(max_examples=80, deadline=None)
@given(req=requests(), snake=st.booleans(), enum_numbers=st.booleans())
def test_direct_reader_matches_protobuf_json_parser(req: ExportTraceServiceRequest, snake: bool,
                                                    enum_numbers: bool) -> None:
    doc = _base64_ids_to_hex(
        json_format.MessageToDict(req, preserving_proto_field_name=snake, use_integers_for_enums=enum_numbers)
    )
    doc = json.loads(json.dumps(doc))  # as read from a file
    direct = list(request_spans(doc))
    assert all(isinstance(s, SpanRecord) for s in direct), direct
    via_protobuf = list(request_records(parse_request(doc)))
    assert [as_tuple(s) for s in direct] == [as_tuple(s) for s in via_protobuf]  # type: ignore[arg-type]


def test_int64_as_number_and_enum_number_as_string() -> None:
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x",
        "kind": "3", "startTimeUnixNano": 1700000000000000000, "endTimeUnixNano": "1700000000000000001",
        "status": {"code": "STATUS_CODE_ERROR"},
        "attributes": [{"key": "n", "value": {"intValue": 7}}, {"key": "d", "value": {"doubleValue": "NaN"}}],
    }]}]}]}
    [span] = request_spans(doc)
    assert isinstance(span, SpanRecord)
    assert (span.kind, span.start_ns, span.end_ns, span.status_code) == (3, 1700000000000000000, 1700000000000000001, 2)
    assert span.attributes["n"] == 7 and span.attributes["d"] != span.attributes["d"]


def test_bad_values_are_reported_per_span() -> None:
    good = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "ok"}
    bad_kind = dict(good, spanId="b7ad6b7169203332", kind="SPAN_KIND_WHATEVER")
    bad_attr = dict(good, spanId="b7ad6b7169203333", attributes=[{"key": "x", "value": {"intValue": "ten"}}])
    items = list(request_spans({"resourceSpans": [{"scopeSpans": [{"spans": [good, bad_kind, bad_attr]}]}]}))
    assert isinstance(items[0], SpanRecord)
    assert "kind: unknown value 'SPAN_KIND_WHATEVER'" in str(items[1])
    assert "intValue is not an integer: 'ten'" in str(items[2])
