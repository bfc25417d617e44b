"""The compiled OTLP decoder gives exactly the records the pure-Python path gives, accepts and
rejects exactly the bytes it does (with the same error), and survives any input. Its
``decode_spans`` gives the same records with each span and origin as sent: the same messages the
protobuf runtime parses, and each span's bytes exactly as they are in the request.

Skipped where the extension was not built (no compiler); CI builds it and .ci/run fails when
it does not import.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, EntityRef, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_plumb.export import annotate
from otel_plumb.model import SpanRecord
from otel_plumb.receive import otlp
from otel_plumb.receive.otlp_json import parse_request

native = pytest.importorskip("otel_plumb.receive._otlp_native", reason="the compiled decoder was not built")

FIXTURES = Path(__file__).parent / "fixtures"
pure_decode: Callable[[bytes], list[SpanRecord]] = otlp.pure_decode_request
native_decode: Callable[[bytes], list[SpanRecord]] = native.decode_request


def typed(v: Any) -> Any:
    """A value with its exact type spelled out (True == 1 and 1.0 == 1 in Python; NaN != NaN)."""
    if isinstance(v, dict):
        return ("dict", [(k, typed(x)) for k, x in v.items()])
    if isinstance(v, list):
        return ("list", [typed(x) for x in v])
    if isinstance(v, float):
        return ("float", struct.pack("<d", v))
    return (type(v).__name__, v)


def record(s: SpanRecord) -> tuple[Any, ...]:
    assert type(s) is SpanRecord
    return (
        typed(s.trace_id), typed(s.span_id), typed(s.parent_span_id), typed(s.name), typed(s.kind),
        typed(s.start_ns), typed(s.end_ns), typed(s.status_code), typed(s.status_message),
        typed(s.attributes),
        [(typed(e.name), typed(e.time_ns), typed(e.attributes)) for e in s.events],
        typed(dict(s.resource)), typed(s.scope_name), typed(s.dropped),
    )  # fmt: skip


def outcome(decode: Callable[[bytes], list[SpanRecord]], data: bytes) -> Any:
    try:
        records = decode(data)
    except DecodeError as exc:
        return ("rejected", str(exc))
    # Spans of one ResourceSpans share one resource mapping, and only they do.
    groups = [next(i for i, o in enumerate(records) if o.resource is r.resource) for r in records]
    return ("accepted", [record(r) for r in records], groups)


def canonical(message: type[Span | Resource | InstrumentationScope], data: bytes) -> bytes:
    return message.FromString(data).SerializeToString(deterministic=True)


def spans_outcome(decode: Callable[[bytes], otlp.RequestSpans], data: bytes) -> Any:
    try:
        records, wires, origins = decode(data)
    except DecodeError as exc:
        return ("rejected", str(exc))
    return (
        "accepted",
        [record(r) for r in records],  # type: ignore[arg-type]
        [(canonical(Span, body), trace_id, origin, fp) for body, trace_id, origin, fp in wires],
        [(canonical(Resource, r), r_url, canonical(InstrumentationScope, s), s_url) for r, r_url, s, s_url in origins],
    )


def assert_same(data: bytes) -> Any:
    want = outcome(pure_decode, data)
    assert outcome(native_decode, data) == want
    want_spans = spans_outcome(lambda b: otlp.request_spans(ExportTraceServiceRequest.FromString(b)), data)
    assert spans_outcome(native.decode_spans, data) == want_spans
    assert want_spans[:2] == want[:2]
    if want[0] == "accepted":
        # Each span is forwarded byte for byte as it came.
        assert all(body in data for body, *_ in native.decode_spans(data)[1])
    # What the receivers run: one parse, whichever decoder reads it, with upb's verdict.
    try:
        received = otlp.ReceivedRequest.parse(data)
    except DecodeError:
        assert want[0] == "rejected"
    else:
        assert want[0] == "accepted"
        assert spans_outcome(lambda _: received.spans, data) == want_spans
        assert received.message == ExportTraceServiceRequest.FromString(data)
        assert received.raw == data and received.size == len(data)
    return want


# --- fixtures ----------------------------------------------------------------------------


def fixture_requests() -> list[tuple[str, bytes]]:
    """Every OTLP/JSON request among the captured fixtures, serialized as an exporter sends it."""
    out: list[tuple[str, bytes]] = []
    for path in sorted(FIXTURES.rglob("*.json*")):
        if "node_modules" in path.parts or path.name.endswith(".expected.json"):
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        docs = [json.loads(line) for line in lines if line.strip()] if path.suffix == ".jsonl" else []
        if path.suffix == ".json":
            docs = [json.loads(path.read_text(encoding="utf-8"))]
        for i, doc in enumerate(docs):
            if isinstance(doc, dict) and ("resourceSpans" in doc or "resource_spans" in doc):
                out.append((f"{path.relative_to(FIXTURES)}:{i + 1}", parse_request(doc).SerializeToString()))
    return out


FIXTURE_REQUESTS = fixture_requests()


def test_the_fixtures_are_found() -> None:
    names = {name.split(":")[0] for name, _ in FIXTURE_REQUESTS}
    assert any(n.startswith("frameworks/") for n in names) and any(n.startswith("conventions/") for n in names)
    assert sum(len(pure_decode(data)) for _, data in FIXTURE_REQUESTS) > 500


@pytest.mark.parametrize("data", [d for _, d in FIXTURE_REQUESTS], ids=[n for n, _ in FIXTURE_REQUESTS])
def test_every_fixture_decodes_to_the_same_records(data: bytes) -> None:
    kind, records, _ = assert_same(data)
    assert kind == "accepted" and records


# --- generated requests ------------------------------------------------------------------

int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
uint64 = st.integers(min_value=0, max_value=2**64 - 1)
int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
text = st.text(max_size=12)
ids = st.one_of(st.binary(min_size=16, max_size=16), st.binary(max_size=20))

scalar = st.one_of(
    st.builds(lambda v: AnyValue(string_value=v), text),
    st.builds(lambda v: AnyValue(int_value=v), int64),
    st.builds(lambda v: AnyValue(bool_value=v), st.booleans()),
    st.builds(lambda v: AnyValue(double_value=v), st.floats()),
    st.builds(lambda v: AnyValue(bytes_value=v), st.binary(max_size=8)),
    st.builds(lambda v: AnyValue(string_value_strindex=v), int32),
    st.just(AnyValue()),
)


def _array(values: list[AnyValue]) -> AnyValue:
    out = AnyValue()
    out.array_value.values.extend(values)
    return out


def _kvlist(items: list[tuple[str, AnyValue]]) -> AnyValue:
    out = AnyValue()
    out.kvlist_value.values.extend(KeyValue(key=k, value=v) for k, v in items)
    return out


any_values = st.recursive(
    scalar,
    lambda children: st.builds(_array, st.lists(children, max_size=3))
    | st.builds(_kvlist, st.lists(st.tuples(text, children), max_size=3)),
    max_leaves=10,
)
# Few distinct keys, so that repeated keys (the last one wins) come up.
key_values = st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), st.sampled_from(["a", "b", "", "é"]) | text,
                                any_values), max_size=4)  # fmt: skip


@st.composite
def spans(draw: Any) -> Span:
    span = Span(
        trace_id=draw(ids), span_id=draw(ids), parent_span_id=draw(st.sampled_from([b"", b"\x01" * 8]) | ids),
        trace_state=draw(text), name=draw(text), kind=draw(int32), flags=draw(st.integers(0, 2**32 - 1)),
        start_time_unix_nano=draw(uint64), end_time_unix_nano=draw(uint64),
        dropped_attributes_count=draw(st.sampled_from([0, 0, 1, 2**32 - 1])), attributes=draw(key_values),
        dropped_events_count=draw(st.sampled_from([0, 0, 3, 2**32 - 1])),
    )  # fmt: skip
    if draw(st.booleans()):
        span.status.code = draw(int32)
        span.status.message = draw(text)
    for _ in range(draw(st.integers(0, 2))):
        span.events.add(name=draw(text), time_unix_nano=draw(uint64), attributes=draw(key_values),
                        dropped_attributes_count=draw(st.sampled_from([0, 0, 2, 2**32 - 1])))  # fmt: skip
    for _ in range(draw(st.integers(0, 1))):
        span.links.add(trace_id=draw(ids), span_id=draw(ids), trace_state=draw(text), attributes=draw(key_values))
    return span


@st.composite
def requests(draw: Any) -> bytes:
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        rs = req.resource_spans.add(schema_url=draw(text))
        rs.resource.attributes.extend(draw(key_values))
        if draw(st.booleans()):
            rs.resource.entity_refs.append(EntityRef(type=draw(text), id_keys=draw(st.lists(text, max_size=2))))
        for _ in range(draw(st.integers(0, 2))):
            ss = rs.scope_spans.add()
            ss.scope.name = draw(text)
            ss.scope.version = draw(text)
            ss.scope.attributes.extend(draw(key_values))
            ss.spans.extend(draw(st.lists(spans(), max_size=3)))
    data = req.SerializeToString()
    # Concatenated messages merge: repeated fields append, singular messages merge, scalars
    # and oneofs take the last value. Two serializations back to back exercise all of it.
    return data + draw(st.just(b"") | st.builds(lambda r: r.SerializeToString(), st.just(req)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=requests())
def test_generated_requests_decode_to_the_same_records(data: bytes) -> None:
    assert_same(data)


# --- hand-made wire bytes: the corners of the format ------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def ld(field: int, payload: bytes) -> bytes:
    return tag(field, 2) + varint(len(payload)) + payload


def req(span: bytes, resource_spans: bytes = b"", scope_spans: bytes = b"") -> bytes:
    return ld(1, resource_spans + ld(2, scope_spans + ld(2, span)))


IDS = ld(1, b"\x01" * 16) + ld(2, b"\x02" * 8)


def kv(key: bytes, any_value: bytes) -> bytes:
    return ld(9, ld(1, key) + ld(2, any_value))


def nested_arrays(depth: int, leaf: bytes = ld(1, b"x")) -> bytes:
    av = leaf
    for _ in range(depth):
        av = ld(5, ld(1, av))
    return av


def groups(field: int, depth: int) -> bytes:
    return tag(field, 3) * depth + tag(field, 4) * depth


# Resources of a ResourceSpans (kv() is a span's attribute field: its tag and length left out).
RESOURCE_A = ld(1, ld(1, kv(b"service.name", ld(1, b"a"))[2:]))
RESOURCE_B = ld(1, ld(1, kv(b"host.name", ld(1, b"b"))[2:]))
SCOPE_S = ld(1, ld(1, b"s"))

CORNERS = {
    "empty": b"",
    "resource sent twice (merged)": ld(1, RESOURCE_A + ld(2, ld(2, IDS)) + RESOURCE_B),
    "resource after its spans, schema URLs twice": ld(
        1, ld(2, SCOPE_S + ld(2, IDS) + ld(3, b"u1") + ld(3, b"u2")) + RESOURCE_A + ld(3, b"r1") + ld(3, b"r2")
    ),
    "scope sent twice, two scopes": ld(
        1, ld(2, SCOPE_S + ld(2, IDS) + ld(1, ld(2, b"v"))) + ld(2, ld(1, ld(1, b"t")) + ld(2, IDS))
    ),
    "resource with a wrong wire type": ld(1, tag(1, 0) + b"\x01" + ld(2, ld(2, IDS))),
    "field number 0": b"\x00\x00",
    "end group with none open": tag(15, 4),
    "group left open": tag(15, 3),
    "group closed by another field": tag(15, 3) + tag(14, 4),
    "nested unknown groups": groups(15, 3),
    "field number 0 inside an unknown group": tag(15, 3) + b"\x00\x00" + groups(0, 1) + tag(15, 4),
    "unknown groups at the depth limit": groups(15, 100),
    "unknown groups past the depth limit": groups(15, 101),
    "unknown groups inside a span at the limit": req(IDS + groups(30, 97)),
    "unknown groups inside a span past the limit": req(IDS + groups(30, 98)),
    "wire types 6 and 7": tag(15, 6) + tag(15, 7),
    "largest field number": varint(0xFFFFFFF8) + b"\x00",
    "tag over 32 bits": b"\xf8\xff\xff\xff\x1f\x00",
    "5-byte tag": b"\x88\x80\x80\x80\x00\x01",
    "6-byte tag": b"\x88\x80\x80\x80\x80\x00\x01",
    "10-byte varint": tag(15, 0) + b"\xff" * 9 + b"\x7f",
    "11-byte varint": tag(15, 0) + b"\xff" * 10 + b"\x01",
    "truncated varint": tag(15, 0) + b"\xff",
    "truncated fixed32": tag(15, 5) + b"\x00\x00\x00",
    "truncated fixed64": tag(15, 1) + b"\x00" * 7,
    "5-byte length": b"\x0a\x80\x80\x80\x80\x00",
    "6-byte length": b"\x0a\x80\x80\x80\x80\x80\x00",
    "length past the end": b"\x0a\x05ab",
    "huge length": b"\x0a\xff\xff\xff\xff\x0f",
    "name as a varint (unknown)": req(IDS + tag(5, 0) + b"\x05"),
    "name twice": req(IDS + ld(5, b"a") + ld(5, b"b")),
    "negative kind": req(IDS + tag(6, 0) + varint(2**64 - 1)),
    "kind over 32 bits": req(IDS + tag(6, 0) + varint(2**35 + 3)),
    "status merged": req(IDS + ld(15, ld(2, b"m") + tag(3, 0) + b"\x02") + ld(15, tag(3, 0) + b"\x01")),
    "status code length-delimited (unknown)": req(IDS + ld(15, ld(3, b"xx"))),
    "string then array": req(IDS + kv(b"a", ld(1, b"s") + ld(5, ld(1, ld(1, b"x"))))),
    "array twice merged": req(IDS + kv(b"a", ld(5, ld(1, ld(1, b"x"))) + ld(5, ld(1, ld(1, b"y"))))),
    "array, string, array": req(IDS + kv(b"a", ld(5, ld(1, ld(1, b"x"))) + ld(1, b"s") + ld(5, ld(1, ld(1, b"y"))))),
    "kvlist twice merged": req(IDS + kv(b"a", ld(6, ld(1, ld(1, b"k"))) + ld(6, ld(1, ld(1, b"j"))))),
    "value twice merged": req(IDS + ld(9, ld(1, b"a") + ld(2, ld(5, ld(1, ld(1, b"x")))) + ld(2, ld(5, ld(1, b""))))),
    "empty string value": req(IDS + kv(b"a", ld(1, b""))),
    "bool 2": req(IDS + kv(b"a", tag(2, 0) + b"\x02")),
    "strindex": req(IDS + kv(b"a", tag(8, 0) + varint(2**32 - 1))),
    "NaN": req(IDS + kv(b"a", tag(4, 1) + struct.pack("<d", math.nan))),
    "no key": req(IDS + ld(9, ld(2, ld(1, b"v")))),
    "no value": req(IDS + ld(9, ld(1, b"k"))),
    "key_strindex": req(IDS + ld(9, ld(1, b"k") + tag(3, 0) + b"\x07")),
    "repeated keys": req(IDS + kv(b"a", ld(1, b"1")) + kv(b"b", ld(1, b"2")) + kv(b"a", ld(1, b"3"))),
    "resource after the spans": ld(1, ld(2, ld(2, IDS)) + ld(1, ld(1, ld(1, b"service.name") + ld(2, ld(1, b"x"))))),
    "resource twice merged": ld(
        1, ld(1, ld(1, ld(1, b"a") + ld(2, ld(1, b"x")))) + ld(2, ld(2, IDS)) + ld(1, ld(1, ld(1, b"b")))
    ),
    "scope after the spans": ld(1, ld(2, ld(2, IDS) + ld(1, ld(1, b"sc")))),
    "scope twice merged": ld(1, ld(2, ld(1, ld(1, b"sc") + ld(2, b"v")) + ld(2, IDS) + ld(1, ld(2, b"w")))),
    "two resource spans": ld(1, ld(2, ld(2, IDS))) + ld(1, ld(1, ld(1, ld(1, b"r"))) + ld(2, ld(2, IDS))),
    "event fields": req(IDS + ld(11, tag(1, 1) + b"\x07" * 8 + ld(2, b"ev") + ld(3, ld(1, b"q") + ld(2, ld(1, b"r"))))),
    "ids of odd lengths": req(ld(1, b"\xff" * 3) + ld(2, b"") + ld(4, b"\x00")),
    "bad UTF-8 in the name": req(IDS + ld(5, b"\xff")),
    "bad UTF-8 in trace_state": req(IDS + ld(3, b"\xff")),
    "bad UTF-8 in a link": req(IDS + ld(13, ld(3, b"\xc0\x80"))),
    "bad UTF-8 in a link attribute": req(IDS + ld(13, ld(4, ld(1, b"\xed\xa0\x80")))),
    "bad UTF-8 in a scope attribute": ld(1, ld(2, ld(1, ld(3, ld(2, ld(1, b"\xf4\x90\x80\x80")))))),
    "bad UTF-8 in a scope version": ld(1, ld(2, ld(1, ld(2, b"\xe0\x80\x80")))),
    "bad UTF-8 in an entity ref": ld(1, ld(1, ld(3, ld(3, b"\x80")))),
    "bad UTF-8 in a schema url": ld(1, ld(3, b"\xfe")),
    "bad UTF-8 in an unknown field": req(IDS + ld(30, b"\xff")),
    "bad UTF-8 in bytes": req(IDS + kv(b"a", ld(7, b"\xff"))),
    "four-byte UTF-8 and NUL": req(IDS + ld(5, "a\x00😀".encode())),
    "bad UTF-8 then corrupt": req(IDS + ld(5, b"\xff")) + b"\x0a\x05",
    "corrupt inside a link": req(IDS + ld(13, b"\x0a\x05")),
    # Request > ResourceSpans > ScopeSpans > Span > KeyValue > AnyValue, then 2 per array level.
    "99 levels below the request": req(IDS + kv(b"a", nested_arrays(47))),
    "100 levels below the request (the limit)": req(IDS + kv(b"a", nested_arrays(47, ld(6, b"")))),
    "101 levels below the request": req(IDS + kv(b"a", nested_arrays(48))),
    "nested far past the limit": req(IDS + kv(b"a", nested_arrays(5000))),
    "deep link attributes": req(IDS + ld(13, ld(4, ld(1, b"k") + ld(2, nested_arrays(50))))),
    "start group for a message field": req(IDS + tag(15, 3) + tag(15, 4)),
    # A string may run past the end of its message (upb reads it, checks its UTF-8, and only
    # then finds the message overrun); a submessage may not.
    "string past its message": ld(1, ld(2, tag(2, 2) + varint(len(IDS) + 2) + IDS + tag(5, 2) + b"\x06ab" + b"cdef")),
    "string past its message, bad UTF-8 inside it": ld(
        1, ld(2, tag(2, 2) + varint(len(IDS) + 2) + IDS + tag(5, 2) + b"\x06\xff\xfe" + b"cdef")
    ),
    "string past its message, bad UTF-8 beyond it": ld(
        1, ld(2, tag(2, 2) + varint(len(IDS) + 2) + IDS + tag(5, 2) + b"\x06ab" + b"cd\xff\xfe")
    ),
    "string past two messages, bad UTF-8": ld(
        1, ld(2, tag(2, 2) + varint(len(IDS) + 2) + IDS + tag(5, 2) + b"\x08ab") + b"cd\xff\xfe\x00\x00"
    ),
    "string past the buffer, bad UTF-8": ld(1, ld(2, tag(2, 2) + varint(len(IDS) + 2) + IDS + tag(5, 2) + b"\x3c\xff")),
    "tag past its message, then a bad string": ld(
        1, ld(2, tag(2, 2) + varint(len(IDS) + 1) + IDS + tag(5, 2) + b"\x02\xff\xfe")
    ),
    "message past its parent, bad UTF-8 inside": ld(
        1, ld(2, tag(2, 2) + varint(len(IDS) + 2) + IDS + tag(15, 2) + b"\x03" + ld(2, b"\xff"))
    ),
}


@pytest.mark.parametrize("data", CORNERS.values(), ids=CORNERS.keys())
def test_corners_of_the_wire_format_decode_alike(data: bytes) -> None:
    assert_same(data)


def test_the_corners_cover_every_error_kind() -> None:
    messages = {outcome(pure_decode, d)[1].rsplit(": ", 1)[-1] for d in CORNERS.values()
                if outcome(pure_decode, d)[0] == "rejected"}  # fmt: skip
    assert messages == {"Wire format was corrupt", "Exceeded upb_DecodeOptions_MaxDepth", "String field had bad UTF-8"}


def test_any_buffer_is_read() -> None:
    data = req(IDS + kv(b"a", ld(1, b"v")))
    assert [record(r) for r in native_decode(memoryview(data))] == [record(r) for r in pure_decode(data)]
    assert [record(r) for r in native_decode(bytearray(data))] == [record(r) for r in pure_decode(data)]
    with pytest.raises(TypeError):
        native_decode("not bytes")  # type: ignore[arg-type]


def test_short_strings_are_shared_between_spans_and_requests() -> None:
    """A buffered span holds no copy of a tool name, model name or attribute key it shares
    with other spans; long values are each span's own (no cache holds them)."""
    long_value = b"x" * 200
    span = IDS + kv(b"gen_ai.tool.name", ld(1, b"get_weather")) + kv(b"payload", ld(1, long_value))
    first, second = native_decode(req(span) + req(span)), native_decode(req(span))  # two ResourceSpans, then one
    names = [r.attributes["gen_ai.tool.name"] for r in (*first, *second)]
    assert names == ["get_weather"] * 3 and len({id(n) for n in names}) == 1
    keys = [next(iter(r.attributes)) for r in (*first, *second)]
    assert len({id(k) for k in keys}) == 1
    longs = [r.attributes["payload"] for r in (*first, *second)]
    assert longs == [long_value.decode()] * 3 and len({id(v) for v in longs}) == 3



def assert_keeps_nothing(churn: Callable[[], None]) -> None:
    """Memory after running ``churn`` twice more is as it was after once (after a warm-up: interned
    strings, free lists): what it made and refused was all let go."""
    churn()
    tracemalloc.start()
    try:
        churn()
        first, _ = tracemalloc.get_traced_memory()
        churn()
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert second - first < 64 * 1024, (first, second)


def test_no_memory_is_kept_across_decodes() -> None:
    """Objects built for a request are all freed, whether it was accepted or refused half way."""
    good = b"".join(data for _, data in FIXTURE_REQUESTS[:20])
    refused = good + ld(1, ld(2, ld(2, IDS + ld(5, b"\xff"))))

    def churn() -> None:
        for _ in range(200):
            native_decode(good)
            native.decode_spans(good)
            with pytest.raises(DecodeError):
                native_decode(refused)
            with pytest.raises(DecodeError):
                native.decode_spans(refused)

    assert_keeps_nothing(churn)


# --- fuzzing: mutated, truncated, bit-flipped requests -----------------------------------

SEEDS = [d for _, d in FIXTURE_REQUESTS if len(d) < 20_000][:40] + [d for d in CORNERS.values() if d]


@st.composite
def mutated(draw: Any, seeds: st.SearchStrategy[bytes]) -> bytes:
    """A valid request (or a corner case) with a few random edits."""
    data = bytearray(draw(seeds))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["flip", "byte", "insert", "delete", "truncate", "duplicate"]))
        if edit == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif edit == "byte" and at < len(data):
            data[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x1A, 0x0B, 0x0C]))
        elif edit == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=6))
        elif edit == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif edit == "truncate":
            del data[at:]
        elif edit == "duplicate":
            data[at:at] = data[at : at + draw(st.integers(1, 64))]
    return bytes(data)


FUZZ = settings(deadline=2000, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(FUZZ, max_examples=2000)
@given(data=mutated(st.sampled_from(SEEDS)))
def test_mutated_requests_are_accepted_or_refused_alike_and_never_crash(data: bytes) -> None:
    assert_same(data)


@settings(FUZZ, max_examples=200)
@given(data=mutated(requests()))
def test_mutated_generated_requests_are_accepted_or_refused_alike(data: bytes) -> None:
    assert_same(data)


@settings(max_examples=500, deadline=1000)
@given(data=st.binary(max_size=200))
def test_random_bytes_are_accepted_or_refused_alike(data: bytes) -> None:
    assert_same(data)


# --- choice at import ---------------------------------------------------------------------


def _decoder_in_child(env: dict[str, str]) -> str:
    code = "from otel_plumb.receive import otlp; print(otlp.DECODER, otlp.decode_request is otlp.pure_decode_request)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True)  # fmt: skip
    return out.stdout.strip()


def test_the_native_decoder_is_chosen_when_built_and_pure_python_when_forced() -> None:
    assert _decoder_in_child({otlp.PURE_PYTHON_ENV: "0"}) == "native False"
    assert _decoder_in_child({otlp.PURE_PYTHON_ENV: "1"}) == "pure-python True"


def test_the_decoder_fills_the_interpreted_record_as_well() -> None:
    """Beside the interpreted core (a compiler failed, or it is forced) the decoder fills the plain
    class's slots, where beside the compiled core it calls ``model.span.decoded``: the same
    records, and the same fingerprints, either way."""
    code = """if True:
        import sys
        sys.path.insert(0, sys.argv[1])
        import otel_plumb
        assert otel_plumb.core() == "pure-python"
        from test_native_decoder import FIXTURE_REQUESTS, native, pure_decode, record
        from otel_plumb.model.span import SpanRecord, fingerprint
        assert type(SpanRecord.trace_id).__name__ == "member_descriptor"
        n = 0
        for _, data in FIXTURE_REQUESTS:
            records, wires, _origins = native.decode_spans(data)
            assert [record(r) for r in records] == [record(r) for r in pure_decode(data)]
            assert [w[3] for w in wires] == [fingerprint(r) for r in records]
            n += len(records)
        print(n)
    """
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)],
                         env={**os.environ, otlp.PURE_PYTHON_ENV: "1"}, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout) == sum(len(pure_decode(data)) for _, data in FIXTURE_REQUESTS)


# --- encode_spans: export requests written around kept spans' bytes --------------------------

resources = st.builds(lambda v: Resource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value=v))])
                      .SerializeToString(), st.text(max_size=10))  # fmt: skip
scopes = st.builds(lambda name: InstrumentationScope(name=name).SerializeToString(), st.text(max_size=10))
bodies = st.builds(lambda name, n: Span(name=name, span_id=bytes(8), start_time_unix_nano=n).SerializeToString(),
                   st.text(max_size=200), st.integers(0, 2**64 - 1))  # fmt: skip
urls = st.sampled_from(["", "https://opentelemetry.io/schemas/1.26.0", "é/schema"])
origins = st.lists(
    st.builds(lambda r, ru, s, su: annotate.Origin((r, ru), (s, su)), resources, urls, scopes, urls),
    min_size=1, max_size=3,
)  # fmt: skip


@given(origins, st.lists(st.tuples(bodies, st.integers(0, 2)), max_size=30),
       st.integers(1, 6), st.none() | st.integers(0, 2_000))  # fmt: skip
def test_encode_spans_writes_what_the_pure_python_encoder_writes(origins_, spans, max_spans, max_bytes):
    """The same requests, byte for byte, whatever the spans, origins (equal ones from different
    requests included) and limits; given (body, origin) pairs or kept spans."""
    pairs = [(body, origins_[i % len(origins_)]) for body, i in spans]
    # An origin equal to another but another object, as two requests of one process give.
    pairs += [(body, annotate.Origin(tuple(o.resource), tuple(o.scope))) for body, o in pairs[:3]]
    expected = annotate._encode_spans(pairs, max_spans, max_bytes)
    assert native.encode_spans(pairs, max_spans, max_bytes) == expected
    kept = [annotate.Forwarded(body, origin, SpanRecord("a" * 32, "b" * 16, None, "s"), 0) for body, origin in pairs]
    assert native.encode_spans(kept, max_spans, max_bytes) == expected
    for request, count in expected:
        parsed = ExportTraceServiceRequest.FromString(request)
        assert sum(len(ss.spans) for rs in parsed.resource_spans for ss in rs.scope_spans) == count


@pytest.mark.parametrize("spans", [
    [(None, annotate.Origin((b"", ""), (b"", "")))],
    [(b"x", object())],
    [(b"x", SimpleNamespace(resource=b"not a wire", scope=(b"", "")))],
    [(b"x", SimpleNamespace(resource=(b"", 1), scope=(b"", "")))],
    [(b"x", SimpleNamespace(resource=(b"", ""), scope=(b"", "", "")))],
    [object()],
    [(b"x", annotate.Origin((b"", "\ud800"), (b"", "")))],
])  # fmt: skip
def test_encode_spans_refuses_what_is_no_span_without_crashing(spans):
    with pytest.raises((TypeError, AttributeError, UnicodeEncodeError)):
        native.encode_spans(spans, 10, None)


def test_encode_spans_keeps_nothing_it_made():
    """No reference leaks: requests and annotations encoded and refused over and over leave
    memory as it was."""
    scope = InstrumentationScope(name="s").SerializeToString()
    origin = annotate.Origin((Resource().SerializeToString(), "u"), (scope, ""))
    spans = [(Span(name=f"s{i}", span_id=bytes(8)).SerializeToString(), origin) for i in range(50)]
    bad = [*spans[:5], (None, origin)]

    def churn() -> None:
        for _ in range(300):
            native.encode_spans(spans, 7, 300)
            with pytest.raises(TypeError):
                native.encode_spans(bad, 7, None)
            native.span_addition({"a": [1, "\ud800", {"k": 2.5}]}, [("e", 5, {"m": "x" * 100})])
            with pytest.raises(ValueError):
                native.span_addition({"a": [1, 2**64]})

    assert_keeps_nothing(churn)


# --- span_addition: annotations in wire format --------------------------------------------------

annotation_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=4) | st.sampled_from(["\ud800", "a\udfffb"]),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12,
)  # fmt: skip
annotation_attributes = st.dictionaries(st.text(max_size=6), annotation_values, max_size=5)
annotation_events = st.lists(
    st.tuples(st.text(max_size=6), st.integers(0, 2**64 - 1), annotation_attributes), max_size=3
)


@given(annotation_attributes, annotation_events)
def test_span_addition_writes_what_the_pure_python_writer_writes(attributes, events):
    """The same bytes for any attributes and events (lone surrogates, int64 edges, nested lists and
    maps, empty keys and names), and the runtime reads them back as a span of those."""
    expected = annotate._span_addition(attributes, events)
    assert native.span_addition(attributes, events) == expected
    span = Span.FromString(expected)
    assert len(span.attributes) == len(attributes) and len(span.events) == len(events)


@pytest.mark.parametrize(("attributes", "events", "error"), [
    ({"big": 2**63}, [], ValueError),
    ({"small": -(2**63) - 1}, [], ValueError),
    ({"m": {1: "x"}}, [], AttributeError),
    ({}, [("e", -1, {})], OverflowError),
    ({}, [("e", 1)], TypeError),
    ({}, 5, TypeError),
])  # fmt: skip
def test_span_addition_refuses_what_cannot_be_written(attributes, events, error):
    with pytest.raises(error):
        native.span_addition(attributes, events)
    with pytest.raises((error, TypeError, ValueError, struct.error)):
        annotate._span_addition(attributes, events)


def test_span_addition_stops_at_a_nesting_limit():
    deep: list[object] = []
    for _ in range(2000):
        deep = [deep]
    with pytest.raises(RecursionError):
        native.span_addition({"deep": deep})
