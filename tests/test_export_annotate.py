"""Annotation never changes a span beyond the added attributes and events (property-based),
and regrouping keeps every span under its own resource and scope."""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from otel_plumb.export import annotate as annotate_module
from otel_plumb.export.annotate import (
    Forwarded,
    JournalProgress,
    Origin,
    annotate,
    build_requests,
    encode_requests,
    halve_request,
    span_addition,
    split_request,
    truncate,
    verdict_span_request,
    wire,
)
from otel_plumb.model import SpanRecord, Trajectory, Verdict
from otel_plumb.receive.otlp import to_key_values

ADDED_ATTRIBUTES = {
    "plumb.verdict",
    "plumb.policy",
    "plumb.violations.count",
    "plumb.violations.ids",
    "plumb.violation.ids",
}

scalars = st.one_of(
    st.text(max_size=20).map(lambda s: AnyValue(string_value=s)),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: AnyValue(int_value=i)),
    st.floats(allow_nan=False).map(lambda f: AnyValue(double_value=f)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.binary(max_size=8).map(lambda b: AnyValue(bytes_value=b)),
)
key_values = st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), st.text(max_size=16), scalars), max_size=6)


@st.composite
def spans(draw: st.DrawFn, trace_id: bytes, span_id: bytes, parent: bytes) -> Span:
    span = Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name=draw(st.text(max_size=20)),
        kind=draw(st.integers(0, 5)),  # type: ignore[arg-type]
        start_time_unix_nano=draw(st.integers(0, 2**63)),
        end_time_unix_nano=draw(st.integers(0, 2**63)),
        trace_state=draw(st.text(max_size=10)),
        flags=draw(st.integers(0, 2**32 - 1)),
        dropped_attributes_count=draw(st.integers(0, 5)),
        status=Status(code=draw(st.integers(0, 2)), message=draw(st.text(max_size=10))),  # type: ignore[arg-type]
    )
    span.attributes.extend(draw(key_values))
    for _ in range(draw(st.integers(0, 2))):
        event = span.events.add(name=draw(st.text(max_size=10)), time_unix_nano=draw(st.integers(0, 2**63)))
        event.attributes.extend(draw(key_values))
    for _ in range(draw(st.integers(0, 1))):
        span.links.add(trace_id=trace_id, span_id=draw(st.binary(min_size=8, max_size=8)))
    return span


@st.composite
def trajectories(draw: st.DrawFn) -> tuple[list[Span], Trajectory, list[Verdict]]:
    trace_id = draw(st.binary(min_size=16, max_size=16))
    ids = draw(st.lists(st.binary(min_size=8, max_size=8), min_size=1, max_size=5, unique=True))
    out = [draw(spans(trace_id, ids[0], b""))] + [draw(spans(trace_id, i, ids[0])) for i in ids[1:]]
    has_root = draw(st.booleans())
    verdicts = [
        Verdict(
            invariant=draw(st.sampled_from(["a", "b", "c"])),
            policy="p",
            verdict=draw(st.sampled_from(["pass", "fail", "indeterminate"])),
            severity="high",
            span_id=draw(st.one_of(st.none(), st.sampled_from([i.hex() for i in ids]))),
            expected=draw(st.one_of(st.none(), st.integers(), st.text(max_size=5))),
            got=draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))),
        )
        for _ in range(draw(st.integers(0, 4)))
    ]
    trajectory = Trajectory(key=trace_id.hex(), trace_ids=[trace_id.hex()], steps=[],
                            root_span_id=ids[0].hex() if has_root else None)
    return out, trajectory, verdicts


def origin_of(rs: ResourceSpans, ss: ScopeSpans) -> Origin:
    return Origin(wire(rs.resource, rs.schema_url), wire(ss.scope, ss.schema_url))


def kept(span: Span, origin: Origin) -> Forwarded:
    """A span as the processor keeps it."""
    ids = SpanRecord(span.trace_id.hex(), span.span_id.hex(), None, span.name,
                     start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano)  # fmt: skip
    return Forwarded(span.SerializeToString(), origin, ids, 0)


@settings(max_examples=150, deadline=None)
@given(trajectories())
def test_annotation_only_adds_attributes_and_events(case: tuple[list[Span], Trajectory, list[Verdict]]) -> None:
    originals, trajectory, verdicts = case
    origin = origin_of(ResourceSpans(), ScopeSpans())
    payloads = [kept(span, origin) for span in originals]
    annotate(payloads, trajectory, "violating", ["p"], verdicts)

    violation_events = 0
    for original, payload in zip(originals, payloads, strict=True):
        # The received bytes are kept as they came; what is added follows them.
        assert payload.body.startswith(original.SerializeToString())
        annotated = payload.message()
        added_attributes = annotated.attributes[len(original.attributes) :]
        added_events = annotated.events[len(original.events) :]
        assert {a.key for a in added_attributes} <= ADDED_ATTRIBUTES
        assert all(e.name == "plumb.violation" for e in added_events)
        violation_events += len(added_events)
        # Everything else, the original attributes and events included, is untouched.
        trimmed = Span()
        trimmed.CopyFrom(annotated)
        del trimmed.attributes[len(original.attributes) :]
        del trimmed.events[len(original.events) :]
        assert trimmed == original
    assert violation_events == sum(1 for v in verdicts if v.verdict == "fail")
    spans = [p.message() for p in payloads]
    root = spans[0]  # the parentless span; also the stand-in when no root is known (earliest start)
    stand_in = root if trajectory.root_span_id else min(spans, key=lambda s: s.start_time_unix_nano)
    assert {a.key for a in stand_in.attributes} >= {"plumb.verdict", "plumb.violations.count"}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=40), st.integers(1, 7))
def test_regrouping_keeps_resource_and_scope(layout: list[tuple[int, int]], max_spans: int) -> None:
    resources = [ResourceSpans(schema_url=f"r{i}") for i in range(3)]
    for i, rs in enumerate(resources):
        rs.resource.attributes.add(key="service.name").value.string_value = f"svc{i}"
    scopes = {(r, s): ScopeSpans(schema_url=f"s{r}{s}") for r in range(3) for s in range(3)}
    for (r, s), ss in scopes.items():
        ss.scope.name = f"scope{r}{s}"
    payloads: list[Forwarded] = []
    for n, (r, s) in enumerate(layout):
        span = Span(span_id=n.to_bytes(8, "big"), trace_id=b"\x01" * 16, name=f"{r}/{s}")
        payloads.append(kept(span, origin_of(resources[r], scopes[(r, s)])))
    requests = build_requests(payloads, max_spans)
    assert all(count <= max_spans for _, count in requests)
    seen: Counter[bytes] = Counter()
    for request, count in requests:
        assert count == sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    r, s = (int(x) for x in span.name.split("/"))
                    assert rs.resource == resources[r].resource and rs.schema_url == f"r{r}"
                    assert ss.scope.name == f"scope{r}{s}" and ss.schema_url == f"s{r}{s}"
                    seen[span.span_id] += 1
    assert seen == Counter(p.message().span_id for p in payloads)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3000)), min_size=1, max_size=40), st.integers(2048, 20000))
def test_requests_stay_under_max_bytes_and_split_requests_keep_every_span(
    layout: list[tuple[int, int]], max_bytes: int
) -> None:
    resources = [ResourceSpans(schema_url=f"r{i}") for i in range(3)]
    scopes = [ScopeSpans(schema_url=f"s{i}") for i in range(3)]
    payloads: list[Forwarded] = []
    for n, (r, size) in enumerate(layout):
        span = Span(span_id=n.to_bytes(8, "big"), trace_id=b"\x01" * 16, name="x" * size)
        payloads.append(kept(span, origin_of(resources[r], scopes[r])))
    bodies = encode_requests(payloads, 1000, max_bytes)
    for body, count in bodies:
        assert len(body) <= max_bytes or count == 1, "only a span too big alone goes over"
    assert sum(count for _, count in bodies) == len(payloads)
    # Splitting a request again (what the exporter does to a refused batch) loses nothing.
    whole = encode_requests(payloads, 1000)[0][0]
    halves = halve_request(whole, len(payloads)) if len(payloads) > 1 else [(whole, 1)]
    again = [ExportTraceServiceRequest.FromString(b) for b, _ in split_request(whole, 1000, max_bytes)]
    for parts in (halves, [(r.SerializeToString(), 0) for r in again]):
        ids = [s.span_id for b, _ in parts for rs in ExportTraceServiceRequest.FromString(b).resource_spans
               for ss in rs.scope_spans for s in ss.spans]  # fmt: skip
        assert sorted(ids) == sorted(p.message().span_id for p in payloads)


def test_annotation_values_are_cut_with_a_marker() -> None:
    span = Span(span_id=b"\x02" * 8, trace_id=b"\x01" * 16, name="send_email")
    payloads = [kept(span, origin_of(ResourceSpans(), ScopeSpans()))]
    trajectory = Trajectory(key="01" * 16, trace_ids=["01" * 16], steps=[])
    big = "y" * 100_000
    verdict = Verdict(policy="p", invariant="short", verdict="fail", severity="high", message=f"got {big}",
                      span_id=span.span_id.hex(), expected="^short$", got=big)  # fmt: skip
    annotate(payloads, trajectory, "violating", ["p"], [verdict], max_chars=100)
    event = payloads[0].message().events[0]
    values = {a.key: a.value.string_value for a in event.attributes}
    assert values["got"] == "y" * 100 + "… [99900 more characters]"
    assert values["message"].endswith("more characters]") and len(values["message"]) < 140
    assert values["expected"] == "^short$"
    assert truncate("short", 100) == "short"


# --- annotations written in wire format -------------------------------------------------------
annotation_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.binary(max_size=8)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
annotation_attributes = st.dictionaries(st.text(max_size=10), annotation_values, max_size=4)


@settings(max_examples=300, deadline=None)
@given(annotation_attributes, st.lists(st.tuples(st.text(max_size=8), st.integers(0, 2**64 - 1), annotation_attributes),
                                       max_size=3))  # fmt: skip
def test_annotations_are_written_as_the_protobuf_runtime_writes_them(attributes, events) -> None:
    want = Span()
    want.attributes.extend(to_key_values(attributes))
    for name, at, event_attributes in events:
        want.events.add(name=name, time_unix_nano=at).attributes.extend(to_key_values(event_attributes))
    assert span_addition(attributes, events) == want.SerializeToString()


def test_verdict_text_that_is_no_unicode_still_annotates_the_span() -> None:
    """A lone surrogate (a JSON escape in an argument: ``"\\ud800"``) in a verdict's message and
    value cannot be UTF-8: the span still goes out annotated, the character written as its escape."""
    span = Span(trace_id=b"\1" * 16, span_id=b"\2" * 8, name="execute_tool send_email", start_time_unix_nano=1,
                end_time_unix_nano=2)  # fmt: skip
    kept_span = kept(span, Origin((b"", ""), (b"", "")))
    trajectory = Trajectory(key="k", trace_ids=["01" * 16], steps=[], root_span_id="02" * 8)
    verdict = Verdict(invariant="mail-domain", policy="p", verdict="fail", severity="error", span_id="02" * 8,
                      message="to is '\ud800@x.org'", expected="@example.com", got="\ud800@x.org")  # fmt: skip
    annotate([kept_span], trajectory, "violating", ["p"], [verdict])
    sent = Span.FromString(kept_span.body)
    (event,) = sent.events
    values = {kv.key: kv.value.string_value for kv in event.attributes}
    assert values["got"] == "\\ud800@x.org" and values["message"] == "to is '\\ud800@x.org'"
    request = verdict_span_request(trajectory, "violating", ["p"], [verdict])
    (event,) = request.resource_spans[0].scope_spans[0].spans[0].events
    assert {kv.key: kv.value.string_value for kv in event.attributes}["got"] == "\\ud800@x.org"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5) | st.decimals(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@given(json_values)
def test_annotation_text_of_a_value_is_its_json(value):
    """Expected and got values are written as the JSON the annotations always carried (sorted
    keys, anything else by str), whichever path writes them."""
    if value is None:
        expected = ""
    else:
        expected = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    assert annotate_module._text(value) == expected


def test_journal_progress_counts_requests_releases_the_finished_and_pairs_the_rest_with_their_traces():
    """Spans of trace A from requests 7 and 8, of trace B from 8, one span not journaled (0): 8's
    last pending span goes out, 7 keeps three."""
    origin = Origin((b"", ""), (b"", ""))

    def forwarded(trace: str, journal_id: int) -> Forwarded:
        return Forwarded(b"", origin, SpanRecord(trace * 32, "01" * 8, None, "s"), journal_id)

    payloads = [forwarded("a", 7), forwarded("a", 8), forwarded("a", 7), forwarded("b", 8), forwarded("b", 0)]
    progress = JournalProgress(payloads, {7: 5, 8: 2}, whole_traces=True)
    assert progress.taken == {7: 2, 8: 2}
    assert progress.released == [8]
    # Request 8 is released (its traces go with it); request 7 still holds trace A's other spans.
    assert progress.done == [(7, bytes.fromhex("a" * 32))]
    # Request 8 still held: both its traces in one entry, 16 bytes each.
    held = JournalProgress(payloads, {7: 5, 8: 3}, whole_traces=True)
    [trace_ids] = [ids for journal_id, ids in held.done if journal_id == 8]
    assert len(trace_ids) == 32
    assert {trace_ids[:16], trace_ids[16:]} == {bytes.fromhex("a" * 32), bytes.fromhex("b" * 32)}
    # Spans forwarded unchecked (not every span of their traces) mark no trace done.
    partial = JournalProgress(payloads, {7: 5, 8: 3}, whole_traces=False)
    assert partial.taken == {7: 2, 8: 2} and partial.released == [] and partial.done == []


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([0, 7, 8, 9])), max_size=30),
       st.dictionaries(st.sampled_from([7, 8, 9]), st.integers(0, 12)), st.booleans())  # fmt: skip
def test_journal_progress_of_any_order_of_spans_counts_each_span_and_trace_once(spans, pending, whole_traces):
    """Counted per run of spans, the progress is what counting span by span gives, in whatever
    order the spans of requests and traces interleave."""
    origin = Origin((b"", ""), (b"", ""))
    payloads = [Forwarded(b"", origin, SpanRecord(t * 32, "01" * 8, None, "s"), j) for t, j in spans]
    progress = JournalProgress(payloads, pending, whole_traces)
    taken = {j: sum(1 for _, k in spans if k == j) for j in dict.fromkeys(j for _, j in spans if j)}
    assert progress.taken == taken
    assert sorted(progress.released) == sorted(j for j, n in taken.items() if pending.get(j, 0) <= n)
    traces = {j: {t for t, k in spans if k == j} for j in taken if j not in progress.released}
    done = {j: {ids[i : i + 16] for i in range(0, len(ids), 16)} for j, ids in progress.done}
    assert done == ({j: {bytes.fromhex(t * 32) for t in ts} for j, ts in traces.items()} if whole_traces else {})
    assert all(len(ids) == 16 * len(traces[j]) for j, ids in progress.done)
