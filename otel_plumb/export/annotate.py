"""Annotated spans: the original OTLP spans, unchanged apart from added plumb.* attributes and
``plumb.violation`` events, grouped back into ResourceSpans/ScopeSpans for export.

The processor keeps each received span as its wire bytes (``Forwarded``) with an ``Origin``
(its resource and scope, serialised once per request and shared by their spans), so the
exported request carries the same resource, scope and schema URLs the agent sent, and a
buffered span holds its own bytes rather than the whole parsed request. Annotations are
appended to those bytes as a serialised ``Span`` holding only the added attributes and events:
protobuf reads concatenated messages as one, repeated fields appended, so the span is
byte-for-byte what was received, followed by what was added.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_plumb.model import NormalisedSpan, Trajectory, Verdict
from otel_plumb.receive.otlp import native_encode_spans, native_span_addition, to_key_values

VIOLATION_EVENT: Final = "plumb.violation"


# A resource or instrumentation scope as exported: serialised, with its schema URL.
Wire = tuple[bytes, str]


def wire(message: Resource | InstrumentationScope, schema_url: str) -> Wire:
    return message.SerializeToString(), schema_url


class Origin:
    """Where a span came from: its resource and instrumentation scope. Spans of equal origins
    are exported under one ResourceSpans and ScopeSpans."""

    __slots__ = ("resource", "scope")

    def __init__(self, resource: Wire, scope: Wire) -> None:
        self.resource = resource
        self.scope = scope


# Distinct origins kept by ``Origins`` at most; past this it starts again (a flood of distinct
# resources costs lookups, never memory).
ORIGINS_MAX: Final = 1024


class Origins:
    """One ``Origin`` per distinct resource and scope, shared by every request that carries them
    (an agent's process sends the same ones in each request), so that encoding a batch finds
    the spans of one origin by identity instead of comparing serialised resources."""

    __slots__ = ("_known",)

    def __init__(self) -> None:
        self._known: dict[tuple[bytes, str, bytes, str], Origin] = {}

    def of(self, wires: Iterable[tuple[bytes, str, bytes, str]]) -> list[Origin]:
        """The origins of a request's ScopeSpans (resource, its schema URL, scope, its schema URL)."""
        out: list[Origin] = []
        known = self._known
        for wire in wires:
            origin = known.get(wire)
            if origin is None:
                if len(known) >= ORIGINS_MAX:
                    known.clear()
                origin = known[wire] = Origin((wire[0], wire[1]), (wire[2], wire[3]))
            out.append(origin)
        return out


class SpanIds(Protocol):
    """What annotation and export read of a kept span besides its bytes: its ids (in hex, as
    verdicts name them) and its times."""

    @property
    def trace_id(self) -> str: ...
    @property
    def span_id(self) -> str: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...


class Forwarded:
    """A received span as the processor keeps it to forward it: its wire bytes (annotations
    appended), where it came from, the id of the journaled request it arrived in (0: not
    journaled) and an object giving its ids and times (the normalised span, once there is one:
    a buffered span holds no copies of them)."""

    __slots__ = ("body", "ids", "journal_id", "origin")

    def __init__(self, body: bytes, origin: Origin, ids: SpanIds, journal_id: int) -> None:
        self.body = body
        self.origin = origin
        self.ids = ids
        self.journal_id = journal_id

    @property
    def trace_id(self) -> str:
        return self.ids.trace_id

    @property
    def span_id(self) -> str:
        return self.ids.span_id

    @property
    def start_ns(self) -> int:
        return self.ids.start_ns

    @property
    def end_ns(self) -> int:
        return self.ids.end_ns

    def add(self, attributes: dict[str, Any], events: Iterable[Event] = ()) -> None:
        """Append attributes and events to the span."""
        self.body += span_addition(attributes, events)

    def message(self) -> Span:
        return Span.FromString(self.body)


class JournalProgress:
    """What forwarding some spans does to the journal (journal id 0: a span not journaled):
    ``taken``, spans forwarded per journaled request; ``released``, the requests with no span
    left to forward (``pending`` counts what was left); ``done``, per request still held, the
    whole traces now forwarded from it (a replay skips them): (journal id, their trace ids, 16
    bytes each, in one ``bytes``)."""

    __slots__ = ("done", "released", "taken")

    def __init__(self, payloads: list[Forwarded], pending: dict[int, int], whole_traces: bool) -> None:
        # This runs for every span forwarded. Spans come in runs of one request and, within
        # it, of one trace: the counts and sets are touched once per run, not once per span.
        taken: dict[int, int] = {}
        traces: dict[int, set[str]] = {}
        run_id = run = 0
        run_traces: set[str] = set()
        last_trace = ""
        for span in payloads:
            journal_id = span.journal_id
            if journal_id != run_id:
                if run_id:
                    taken[run_id] = taken.get(run_id, 0) + run
                run_id, run, last_trace = journal_id, 0, ""
                if journal_id and whole_traces:
                    found = traces.get(journal_id)
                    if found is None:
                        found = traces[journal_id] = set()
                    run_traces = found
            if journal_id == 0:
                continue
            run += 1
            if whole_traces:
                trace_id = span.ids.trace_id
                if trace_id != last_trace:
                    run_traces.add(trace_id)
                    last_trace = trace_id
        if run_id:
            taken[run_id] = taken.get(run_id, 0) + run
        self.taken = taken
        self.released = [journal_id for journal_id, n in taken.items() if pending.get(journal_id, 0) <= n]
        gone = set(self.released)
        self.done = [
            (journal_id, bytes.fromhex("".join(trace_ids)))
            for journal_id, trace_ids in traces.items()
            if journal_id not in gone
        ]


def span_ids_by_trace(payloads: list[Forwarded]) -> list[tuple[str, str]]:
    """Per trace of ``payloads``: its id and its spans' ids, in one text, as the decided traces'
    memory keeps them on disk (``DiskQueue.put``). Spans come in runs of one trace: the dict is
    touched once per run."""
    by_trace: dict[str, list[str]] = {}
    last_trace = ""
    run: list[str] = []
    for span in payloads:
        ids = span.ids
        # A kept span's ids are its normalised span's: read in place, not through the protocol.
        if isinstance(ids, NormalisedSpan):
            trace_id, span_id = ids.trace_id, ids.span_id
        else:
            trace_id, span_id = ids.trace_id, ids.span_id
        if trace_id != last_trace:
            found = by_trace.get(trace_id)
            if found is None:
                found = by_trace[trace_id] = []
            run, last_trace = found, trace_id
        run.append(span_id)
    return [(trace_id, "".join(ids)) for trace_id, ids in by_trace.items()]


# Default cut for annotation values (exporters.otlp.max_annotation_chars).
MAX_ANNOTATION_CHARS: Final = 1024


# json.dumps(value, default=str, sort_keys=True), without building an encoder for each value.
_JSON_TEXT: Final = json.JSONEncoder(default=str, sort_keys=True).encode


def _text(value: Any) -> str:
    """A verdict's expected or got value as annotation text: strings as they are, other values
    as JSON (an int as json writes it, without the encoder: counts are the usual value)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return str(value) if type(value) is int else _JSON_TEXT(value)


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, with a visible marker of how much was left out,
    so a span annotated with a huge argument is not much bigger than the span received."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}… [{len(text) - max_chars} more characters]"


def violation_event_attributes(v: Verdict, max_chars: int = MAX_ANNOTATION_CHARS) -> dict[str, Any]:
    return {
        "invariant": v.invariant,
        "severity": v.severity,
        "message": truncate(v.message, max_chars),
        "expected": truncate(_text(v.expected), max_chars),
        "got": truncate(_text(v.got), max_chars),
    }


def trajectory_attributes(status: str, policies: Sequence[str], failures: Sequence[Verdict]) -> dict[str, Any]:
    return {
        "plumb.verdict": status,
        "plumb.policy": ",".join(policies),
        "plumb.violations.count": len(failures),
        "plumb.violations.ids": list(dict.fromkeys(v.invariant for v in failures)),
    }


def annotate(
    spans: Sequence[Forwarded],
    trajectory: Trajectory,
    status: str,
    policies: Sequence[str],
    verdicts: Iterable[Verdict],
    max_chars: int = MAX_ANNOTATION_CHARS,
) -> None:
    """Add the verdict annotations to the spans of one trajectory, in place.

    Root span: plumb.verdict, plumb.policy, plumb.violations.count, plumb.violations.ids. Each
    offending span: plumb.violation.ids and one ``plumb.violation`` event per violation. A
    violation localised to no step (a missing call) goes on the root span. Values copied from
    the verdict (message, expected, got) are cut to ``max_chars`` characters.
    """
    failures = [v for v in verdicts if v.verdict == "fail"]
    root_id = trajectory.root_span_id
    by_id = {span.span_id: span for span in spans}  # a trace's buffer holds each span id once
    root = by_id.get(root_id) if root_id else None
    if root is None and spans:
        # No root received: the earliest span stands for the trajectory.
        root = min(spans, key=lambda s: s.start_ns)
    if root is not None:
        root.add(trajectory_attributes(status, policies, failures))
    if not failures:
        return
    offending: dict[int, tuple[Forwarded, list[Verdict]]] = {}
    for v in failures:
        span = by_id.get(v.span_id or "") or root
        if span is None:
            continue
        offending.setdefault(id(span), (span, []))[1].append(v)
    for span, vs in offending.values():
        at = span.end_ns or span.start_ns
        events = [(VIOLATION_EVENT, at, violation_event_attributes(v, max_chars)) for v in vs]
        span.add({"plumb.violation.ids": list(dict.fromkeys(v.invariant for v in vs))}, events)


def redact_forwarded(span: Forwarded, text: Callable[[str], str]) -> None:
    """``redact_span`` on a kept span's bytes."""
    message = span.message()
    redact_span(message, text)
    span.body = message.SerializeToString()


def redact_span(span: Span, text: Callable[[str], str]) -> None:
    """Every string the span carries (attributes, event and link attributes, the status message)
    passed through ``text``, in place: the span forwarded with ``redact_forwarded``. Names, ids,
    times and the resource (shared by the request's spans) are kept."""
    for kv in span.attributes:
        _redact_value(kv.value, text, 0)
    for event in span.events:
        for kv in event.attributes:
            _redact_value(kv.value, text, 0)
    for link in span.links:
        for kv in link.attributes:
            _redact_value(kv.value, text, 0)
    if span.status.message:
        span.status.message = text(span.status.message)


# Deeper values than this are cleared: nothing forwarded is left unscanned.
_MAX_VALUE_DEPTH: Final = 64


def _redact_value(value: AnyValue, text: Callable[[str], str], depth: int) -> None:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        value.string_value = text(value.string_value)
    elif depth >= _MAX_VALUE_DEPTH and kind in ("array_value", "kvlist_value"):
        value.string_value = "[redacted: nested too deep]"
    elif kind == "array_value":
        for item in value.array_value.values:
            _redact_value(item, text, depth + 1)
    elif kind == "kvlist_value":
        for kv in value.kvlist_value.values:
            _redact_value(kv.value, text, depth + 1)


def encode_requests(
    spans: Iterable[Forwarded], max_spans: int, max_bytes: int | None = None
) -> list[tuple[bytes, int]]:
    """Serialised ``ExportTraceServiceRequest``s: spans grouped back under their resource and
    scope, at most ``max_spans`` spans and about ``max_bytes`` bytes per request (a span bigger
    than that alone goes in a request of its own).

    The request is written in protobuf wire format around each span's own bytes, so spans are
    never copied into a new message (the bulk of the export cost); by the compiled decoder's
    module when it is built (``receive._otlp_native.encode_spans``: the same bytes, in a tenth of
    the instructions), else below."""
    if native_encode_spans is not None:
        return native_encode_spans(spans, max_spans, max_bytes)
    return _encode_spans(((span.body, span.origin) for span in spans), max_spans, max_bytes)


# Bytes a resource or scope wrapper may add to a request, besides the spans (an estimate, so
# that requests stay under max_bytes without serialising them twice).
_GROUP_OVERHEAD: Final = 64

# Spans grouped for one request, per resource and per scope.
_Groups = dict[Wire, dict[Wire, list[bytes]]]


def _encode_spans(
    spans: Iterable[tuple[bytes, Origin]], max_spans: int, max_bytes: int | None
) -> list[tuple[bytes, int]]:
    out: list[tuple[bytes, int]] = []
    groups: _Groups = {}
    count = size = 0
    for body, origin in spans:
        resource, scope = origin.resource, origin.scope
        extra = len(body) + 6
        group = groups.get(resource)
        if max_bytes is not None:
            if group is None:
                extra += len(resource[0]) + _GROUP_OVERHEAD
            if group is None or scope not in group:
                extra += len(scope[0]) + _GROUP_OVERHEAD
        if count and (count >= max_spans or (max_bytes is not None and size + extra > max_bytes)):
            out.append((_encode_request(groups), count))
            groups, count, size, group = {}, 0, 0, None
            if max_bytes is not None:  # the wrappers go into the new request as well
                extra = len(body) + 6 + len(resource[0]) + len(scope[0]) + 2 * _GROUP_OVERHEAD
        size += extra
        if group is None:
            group = groups[resource] = {}
        group.setdefault(scope, []).append(body)
        count += 1
    if count:
        out.append((_encode_request(groups), count))
    return out


def split_request(body: bytes, max_spans: int, max_bytes: int | None = None) -> list[tuple[bytes, int]]:
    """A serialised request cut into requests of at most ``max_spans`` spans (and about
    ``max_bytes`` bytes), every span under its own resource and scope as before."""
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for rs in request.resource_spans:
        resource = wire(rs.resource, rs.schema_url)
        for ss in rs.scope_spans:
            origin = Origin(resource, wire(ss.scope, ss.schema_url))
            spans += [(span.SerializeToString(), origin) for span in ss.spans]
    if native_encode_spans is not None:
        return native_encode_spans(spans, max_spans, max_bytes)
    return _encode_spans(spans, max_spans, max_bytes)


def halve_request(body: bytes, spans: int) -> list[tuple[bytes, int]]:
    """A serialised request of ``spans`` spans (at least 2) as two requests of about half each."""
    return split_request(body, (spans + 1) // 2)


def build_requests(spans: Iterable[Forwarded], max_spans: int) -> list[tuple[ExportTraceServiceRequest, int]]:
    """``encode_requests`` as messages."""
    return [(ExportTraceServiceRequest.FromString(body), n) for body, n in encode_requests(spans, max_spans)]


# Field tags (field number << 3 | length-delimited): ExportTraceServiceRequest.resource_spans = 1;
# ResourceSpans resource = 1, scope_spans = 2, schema_url = 3; ScopeSpans scope = 1, spans = 2, schema_url = 3.
_TAG_1: Final = b"\x0a"
_TAG_2: Final = b"\x12"
_TAG_3: Final = b"\x1a"


# Lengths and small ints under 2^14, the usual case, written without a loop.
_ONE_BYTE: Final = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, body: bytes) -> bytes:
    return tag + _varint(len(body)) + body


def _encode_request(groups: _Groups) -> bytes:
    """The request as a list of pieces (tags, lengths, the kept bytes) joined once at the end:
    each span is copied once, however deep it sits (a message's length is the sum of its pieces)."""
    out: list[bytes] = []
    for (resource, resource_schema_url), scopes in groups.items():
        rs = [_TAG_1, _varint(len(resource)), resource]
        for (scope, scope_schema_url), spans in scopes.items():
            ss = [_TAG_1, _varint(len(scope)), scope]
            for span in spans:
                ss += (_TAG_2, _varint(len(span)), span)
            if scope_schema_url:
                ss.append(_field(_TAG_3, scope_schema_url.encode()))
            rs += (_TAG_2, _varint(sum(map(len, ss))))
            rs += ss
        if resource_schema_url:
            rs.append(_field(_TAG_3, resource_schema_url.encode()))
        out += (_TAG_1, _varint(sum(map(len, rs))))
        out += rs
    return b"".join(out)


def verdict_span_request(
    trajectory: Trajectory,
    status: str,
    policies: Sequence[str],
    verdicts: Iterable[Verdict],
    max_chars: int = MAX_ANNOTATION_CHARS,
) -> ExportTraceServiceRequest:
    """Passthrough mode: the spans went out already, so the verdict travels as one small span in
    the same trace, a child of the root, with the same attributes and events the root would get."""
    failures = [v for v in verdicts if v.verdict == "fail"]
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend(to_key_values({"service.name": "otel-plumb"}))
    ss = rs.scope_spans.add()
    ss.scope.name = "otel_plumb"
    now = time.time_ns()
    span = ss.spans.add()
    span.trace_id = bytes.fromhex(trajectory.trace_id)
    span.span_id = os.urandom(8)
    if trajectory.root_span_id:
        span.parent_span_id = bytes.fromhex(trajectory.root_span_id)
    span.name = "plumb.verdict"
    span.kind = Span.SPAN_KIND_INTERNAL
    span.start_time_unix_nano = span.end_time_unix_nano = now
    events = []
    for v in failures:
        attrs = violation_event_attributes(v, max_chars)
        if v.span_id:
            attrs["span_id"] = v.span_id
        events.append((VIOLATION_EVENT, now, attrs))
    span.MergeFromString(span_addition(trajectory_attributes(status, policies, failures), events))
    return request


# --- annotations in wire format --------------------------------------------------------------
# Written as the protobuf runtime writes them, without building messages: this runs for every
# decided trajectory. Text is UTF-8 with any lone surrogate (which a JSON escape in trace data
# can put in a verdict's message or value) written as its escape, so no verdict can make a span
# unexportable.

# An event to append: name, time (ns), attributes.
Event = tuple[str, int, dict[str, Any]]

# Span.attributes = 9, Span.events = 11; Event.time_unix_nano = 1 (fixed64), name = 2, attributes = 3;
# KeyValue key = 1, value = 2; AnyValue string = 1, bool = 2, int = 3, double = 4 (fixed64),
# array = 5, kvlist = 6, bytes = 7; ArrayValue and KeyValueList values = 1.
_SPAN_ATTRIBUTE: Final = b"\x4a"
_SPAN_EVENT: Final = b"\x5a"
_EVENT_TIME: Final = b"\x09"
_BOOL_TRUE: Final = b"\x10\x01"
_BOOL_FALSE: Final = b"\x10\x00"
_INT: Final = b"\x18"
_DOUBLE: Final = b"\x21"
_ARRAY: Final = b"\x2a"
_KVLIST: Final = b"\x32"
_BYTES: Final = b"\x3a"
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_DOUBLE_BYTES: Final = struct.Struct("<d").pack
_FIXED64: Final = struct.Struct("<Q").pack


def span_addition(attributes: dict[str, Any], events: Iterable[Event] = ()) -> bytes:
    """A serialised ``Span`` holding only these attributes and events (to append to a span): by
    the compiled decoder's module when it is built (``_otlp_native.span_addition``, the same
    bytes), else below."""
    if native_span_addition is not None:
        return native_span_addition(attributes, events)
    return _span_addition(attributes, events)


def _span_addition(attributes: dict[str, Any], events: Iterable[Event] = ()) -> bytes:
    out = [_field(_SPAN_ATTRIBUTE, _key_value(k, v)) for k, v in attributes.items()]
    for name, time_ns, event_attributes in events:
        body = [_EVENT_TIME + _FIXED64(time_ns)] if time_ns else []
        if name:
            body.append(_field(_TAG_2, _utf8(name)))
        body += (_field(_TAG_3, _key_value(k, v)) for k, v in event_attributes.items())
        out.append(_field(_SPAN_EVENT, b"".join(body)))
    return b"".join(out)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "backslashreplace")


# Encoded key-values of short scalar values (names, verdicts, severities, counts: most of what
# annotations repeat from trajectory to trajectory), bounded: cleared when full.
_KEY_VALUES: Final[dict[tuple[str, type, str | int | float], bytes]] = {}
_KEY_VALUES_MAX: Final = 4096
_CACHED_CHARS: Final = 64


def _key_value(key: str, value: Any) -> bytes:
    kind = type(value)
    cacheable = kind is bool or kind is int or (kind is str and len(value) <= _CACHED_CHARS)
    if cacheable:
        # The type is part of the key: True == 1, and their encodings differ.
        cached = _KEY_VALUES.get((key, kind, value))
        if cached is not None:
            return cached
    encoded = _field(_TAG_2, _any_value(value))
    if key:
        encoded = _field(_TAG_1, _utf8(key)) + encoded
    if cacheable:
        if len(_KEY_VALUES) >= _KEY_VALUES_MAX:
            _KEY_VALUES.clear()
        _KEY_VALUES[(key, kind, value)] = encoded
    return encoded


def _any_value(v: Any) -> bytes:
    """``receive.otlp.to_any_value(v)`` serialised."""
    if isinstance(v, bool):
        return _BOOL_TRUE if v else _BOOL_FALSE
    if isinstance(v, int):
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise ValueError(f"integer {v} is out of the int64 range")
        return _INT + _varint(v & 0xFFFFFFFFFFFFFFFF)
    if isinstance(v, float):
        return _DOUBLE + _DOUBLE_BYTES(v)
    if isinstance(v, bytes):
        return _field(_BYTES, v)
    if isinstance(v, (list, tuple)):
        return _field(_ARRAY, b"".join(_field(_TAG_1, _any_value(x)) for x in v))
    if isinstance(v, dict):
        return _field(_KVLIST, b"".join(_field(_TAG_1, _key_value(k, x)) for k, x in v.items()))
    return _field(_TAG_1, _utf8("" if v is None else str(v)))
