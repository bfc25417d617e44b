"""Annotated spans: the original OTLP spans, unchanged apart from added plumb.* attributes and
``plumb.violation`` events, grouped back into ResourceSpans/ScopeSpans for export.

The receivers keep each span's proto message with an ``Origin`` (its ResourceSpans and
ScopeSpans, shared by all spans of that group), so the exported request carries the same
resource, scope and schema URLs the agent sent.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from otel_plumb.model import Trajectory, Verdict
from otel_plumb.receive.otlp import to_key_values

VIOLATION_EVENT = "plumb.violation"


class Origin:
    """Where a span came from: the ResourceSpans and ScopeSpans it was received in."""

    __slots__ = ("resource_spans", "scope_spans")

    def __init__(self, resource_spans: ResourceSpans, scope_spans: ScopeSpans) -> None:
        self.resource_spans = resource_spans
        self.scope_spans = scope_spans


# What the assembler keeps per span so it can be forwarded unchanged: the span, where it came
# from, its span id in hex (as verdicts name it; read once at receipt), and the id of the
# journaled request it arrived in (0: not journaled).
Payload = tuple[Span, Origin, str, int]


# Default cut for annotation values (exporters.otlp.max_annotation_chars).
MAX_ANNOTATION_CHARS = 1024


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)


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
    payloads: Sequence[Payload],
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
    root = next((span for span, _, span_id, _ in payloads if span_id == root_id), None) if root_id else None
    if root is None and payloads:
        # No root received: the earliest span stands for the trajectory.
        root = min((p[0] for p in payloads), key=lambda s: s.start_time_unix_nano)
    if root is not None:
        root.attributes.extend(to_key_values(trajectory_attributes(status, policies, failures)))
    if not failures:
        return
    by_id = {span_id: span for span, _, span_id, _ in payloads}
    offending: dict[int, tuple[Span, list[Verdict]]] = {}
    for v in failures:
        span = by_id.get(v.span_id or "") or root
        if span is None:
            continue
        offending.setdefault(id(span), (span, []))[1].append(v)
    for span, vs in offending.values():
        span.attributes.extend(to_key_values({"plumb.violation.ids": list(dict.fromkeys(v.invariant for v in vs))}))
        for v in vs:
            event = span.events.add()
            event.name = VIOLATION_EVENT
            event.time_unix_nano = span.end_time_unix_nano or span.start_time_unix_nano
            event.attributes.extend(to_key_values(violation_event_attributes(v, max_chars)))


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
_MAX_VALUE_DEPTH = 64


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
    payloads: Iterable[Payload], max_spans: int, max_bytes: int | None = None
) -> list[tuple[bytes, int]]:
    """Serialised ``ExportTraceServiceRequest``s: spans grouped back under their resource and
    scope, at most ``max_spans`` spans and about ``max_bytes`` bytes per request (a span bigger
    than that alone goes in a request of its own).

    The request is written in protobuf wire format around each span's own serialisation, so spans
    are serialised once and never copied into a new message (the bulk of the export cost)."""
    return _encode_spans(((span.SerializeToString(), origin) for span, origin, _, _ in payloads), max_spans, max_bytes)


# Bytes a resource or scope wrapper may add to a request, besides the spans (an estimate, so
# that requests stay under max_bytes without serialising them twice).
_GROUP_OVERHEAD = 64


def _encode_spans(
    spans: Iterable[tuple[bytes, Origin]], max_spans: int, max_bytes: int | None
) -> list[tuple[bytes, int]]:
    out: list[tuple[bytes, int]] = []
    groups: dict[int, tuple[ResourceSpans, dict[int, tuple[ScopeSpans, list[bytes]]]]] = {}
    count = size = 0
    sizes: dict[int, int] = {}
    for body, origin in spans:
        rs = origin.resource_spans
        ss = origin.scope_spans
        extra = len(body) + 6
        if max_bytes is not None:
            if id(rs) not in groups:
                extra += sizes.get(id(rs)) or sizes.setdefault(id(rs), rs.resource.ByteSize() + _GROUP_OVERHEAD)
            if id(rs) not in groups or id(ss) not in groups[id(rs)][1]:
                extra += sizes.get(id(ss)) or sizes.setdefault(id(ss), ss.scope.ByteSize() + _GROUP_OVERHEAD)
        if count and (count >= max_spans or (max_bytes is not None and size + extra > max_bytes)):
            out.append((_encode_request(groups), count))
            groups, count, size = {}, 0, 0
            if max_bytes is not None:  # the wrappers go into the new request as well
                extra = len(body) + 6 + sizes[id(rs)] + sizes[id(ss)]
        size += extra
        group = groups.get(id(rs))
        if group is None:
            group = groups[id(rs)] = (rs, {})
        ss = origin.scope_spans
        scope = group[1].get(id(ss))
        if scope is None:
            scope = group[1][id(ss)] = (ss, [])
        scope[1].append(body)
        count += 1
    if count:
        out.append((_encode_request(groups), count))
    return out


def split_request(body: bytes, max_spans: int, max_bytes: int | None = None) -> list[tuple[bytes, int]]:
    """A serialised request cut into requests of at most ``max_spans`` spans (and about
    ``max_bytes`` bytes), every span under its own resource and scope as before."""
    request = ExportTraceServiceRequest.FromString(body)
    spans = (
        (span.SerializeToString(), Origin(rs, ss))
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    )
    # Holds every resource and scope of the request alive while encoding (they are told apart by id).
    origins: dict[tuple[int, int], Origin] = {}

    def grouped() -> Iterable[tuple[bytes, Origin]]:
        for span_body, origin in spans:
            key = (id(origin.resource_spans), id(origin.scope_spans))
            yield span_body, origins.setdefault(key, origin)

    return _encode_spans(grouped(), max_spans, max_bytes)


def halve_request(body: bytes, spans: int) -> list[tuple[bytes, int]]:
    """A serialised request of ``spans`` spans (at least 2) as two requests of about half each."""
    return split_request(body, (spans + 1) // 2)


def build_requests(payloads: Iterable[Payload], max_spans: int) -> list[tuple[ExportTraceServiceRequest, int]]:
    """``encode_requests`` as messages."""
    return [(ExportTraceServiceRequest.FromString(body), n) for body, n in encode_requests(payloads, max_spans)]


# Field tags (field number << 3 | length-delimited): ExportTraceServiceRequest.resource_spans = 1;
# ResourceSpans resource = 1, scope_spans = 2, schema_url = 3; ScopeSpans scope = 1, spans = 2, schema_url = 3.
_TAG_1, _TAG_2, _TAG_3 = b"\x0a", b"\x12", b"\x1a"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, body: bytes) -> bytes:
    return tag + _varint(len(body)) + body


def _encode_request(groups: dict[int, tuple[ResourceSpans, dict[int, tuple[ScopeSpans, list[bytes]]]]]) -> bytes:
    parts: list[bytes] = []
    for rs, scopes in groups.values():
        body = [_field(_TAG_1, rs.resource.SerializeToString())]
        for ss, spans in scopes.values():
            scope_body = [_field(_TAG_1, ss.scope.SerializeToString())]
            scope_body.extend(_TAG_2 + _varint(len(span)) + span for span in spans)
            if ss.schema_url:
                scope_body.append(_field(_TAG_3, ss.schema_url.encode()))
            body.append(_field(_TAG_2, b"".join(scope_body)))
        if rs.schema_url:
            body.append(_field(_TAG_3, rs.schema_url.encode()))
        parts.append(_field(_TAG_1, b"".join(body)))
    return b"".join(parts)


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
    span.attributes.extend(to_key_values(trajectory_attributes(status, policies, failures)))
    for v in failures:
        event = span.events.add()
        event.name = VIOLATION_EVENT
        event.time_unix_nano = now
        attrs = violation_event_attributes(v, max_chars)
        if v.span_id:
            attrs["span_id"] = v.span_id
        event.attributes.extend(to_key_values(attrs))
    return request
