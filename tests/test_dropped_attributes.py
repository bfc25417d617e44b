"""Spans the SDK cut. OpenTelemetry SDKs keep at most 128 attributes and 128 events per span by
default (OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT, OTEL_SPAN_EVENT_COUNT_LIMIT), and an instrumentation
that flattens a long conversation's messages into attributes exceeds that: the Python SDK then
evicts the oldest attributes (often the one saying what the span is), others drop the newest.
The span says how many it lost (``dropped_attributes_count``, ``dropped_events_count``, an
event's ``dropped_attributes_count``): every reader takes the count, and a trajectory with such
a span is incomplete (``attributes_dropped``), so a verdict on it is one the whole span would
give, or indeterminate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from test_check_early_incremental import _load

from otel_plumb.assemble import build_trajectory
from otel_plumb.check import decide
from otel_plumb.check.early import EarlyWatch
from otel_plumb.model import SpanRecord
from otel_plumb.normalise import normalise
from otel_plumb.receive import otlp
from otel_plumb.receive.files import read_spans
from otel_plumb.receive.otlp_json import request_to_json
from otel_plumb.receive.otlp_json_spans import request_spans as json_records
from otel_plumb.replay import replay
from otel_plumb.report.coverage import coverage_report

FIXTURES = Path(__file__).parent / "fixtures"
# Every captured fixture of the invoice agent: lookup_invoice, then send_payment (in some first
# with a wrong amount the tool refuses).
CAPTURED = sorted(
    p for p in [*FIXTURES.glob("conventions/*.jsonl"), *FIXTURES.glob("frameworks/*.jsonl")]
    if json.loads(p.with_suffix(".expected.json").read_text()).get("synthetic") is not True
)  # fmt: skip
POLICY_TEXT = """
policy: invoices
invariants:
  - {id: look-up, must_call: lookup_invoice}
  - {id: never-pay, never_call: send_payment}
  - {id: never-try, never_call: {tool: send_payment, attempts: true}}
  - {id: look-up-first, precedes: {first: lookup_invoice, then: send_payment}}
  - {id: pay-once, call_count: {tool: send_payment, max: 1}}
  - {id: pay-twice, call_count: {tool: send_payment, min: 2}}
  - {id: as-invoiced, arg_equals: {tool: send_payment, arg: amount, value: 120.5}}
  - {id: euros, arg_matches: {tool: send_payment, arg: currency, regex: '^EUR$'}}
  - {id: no-errors, budget: {max_tool_errors: 0}}
  - {id: few-calls, budget: {max_tool_calls: 2}}
  - {id: paid, expr: "steps.exists(s, s.name == 'send_payment' && s.error == null)"}
  - {id: tokens, budget: {max_tokens: 150}}
  - {id: model-calls, budget: {max_llm_calls: 3}}
  - {id: steps, budget: {max_steps: 12}}
"""


POLICY = _load(POLICY_TEXT)


class Collect(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def _cut_by_the_sdk() -> bytes:
    """A request from the real SDK and OTLP encoder: two tool spans over a 3-attribute limit (5
    set each), a model span over a 1-event limit (3 added, one with 2 attributes over a
    1-attribute limit), a span within every limit."""
    collect = Collect()
    limits = SpanLimits(max_span_attributes=3, max_events=1, max_event_attributes=1)
    provider = TracerProvider(resource=Resource.create({"service.name": "billing-agent"}), span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(collect))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("invoke_agent billing", attributes={"gen_ai.operation.name": "invoke_agent"}):
        with tracer.start_as_current_span("execute_tool send_payment") as tool:
            # The Python SDK evicts the oldest: "a" and "b" go.
            for key, value in [("a", 1), ("b", 2), ("gen_ai.operation.name", "execute_tool"),
                               ("gen_ai.tool.name", "send_payment"), ("c", 3)]:  # fmt: skip
                tool.set_attribute(key, value)
        with tracer.start_as_current_span("execute_tool lookup_invoice") as lost:
            # Here the attributes saying what the span is go.
            for key, value in [("gen_ai.operation.name", "execute_tool"), ("gen_ai.tool.name", "lookup_invoice"),
                               ("a", 1), ("b", 2), ("c", 3)]:  # fmt: skip
                lost.set_attribute(key, value)
        with tracer.start_as_current_span("chat") as chat:
            chat.add_event("gen_ai.choice", {"finish_reason": "tool_calls", "index": 0})
            chat.add_event("two")
            chat.add_event("three")
    provider.shutdown()
    return encode_spans(collect.spans).SerializeToString()


def test_every_reader_takes_what_the_sdk_dropped() -> None:
    data = _cut_by_the_sdk()
    expected = {"execute_tool send_payment": 2, "execute_tool lookup_invoice": 2, "chat": 2, "invoke_agent billing": 0}
    decoded = {
        "native" if otlp.DECODER == "native" else "default": otlp.decode_request(data),
        "protobuf": otlp.pure_decode_request(data),
        "json": list(json_records(json.loads(json.dumps(request_to_json(ExportTraceServiceRequest.FromString(data)))))),
    }
    for reader, records in decoded.items():
        assert {r.name: r.dropped for r in records if isinstance(r, SpanRecord)} == expected, reader


def test_a_span_the_sdk_cut_leaves_its_trajectory_incomplete_and_its_outcome_unknown() -> None:
    records = otlp.pure_decode_request(_cut_by_the_sdk())
    spans = [normalise(r) for r in records]
    tool = next(s for s in spans if s.name == "send_payment")
    assert tool.kind == "tool" and tool.cut and not tool.outcome_recorded
    assert any("dropped 2 of its attributes or events" in p for p in tool.problems)
    # The span whose kind and tool name were dropped is no tool call: that call is missing.
    assert [s.name for s in spans if s.kind == "tool"] == ["send_payment"]
    t = build_trajectory("t", spans)
    assert not t.complete and t.incomplete_reason == "attributes_dropped"
    verdicts = {v.invariant: v for v in decide([POLICY], t).verdicts}
    assert verdicts["look-up"].verdict == "indeterminate"  # not a fail: the call's span was cut
    assert verdicts["never-pay"].verdict == "indeterminate"  # its error.type may have been dropped
    assert verdicts["never-try"].verdict == "indeterminate"  # what said it is a tool call may have gone too
    state = EarlyWatch([POLICY]).state()
    for s in spans:
        state.add(s)
    assert state.unsettled, "no early verdict rests on what a cut span says"


def _fixture_records(path: Path) -> list[SpanRecord]:
    records = [r for r in read_spans(path) if isinstance(r, SpanRecord)]
    assert records, path
    return records


def _verdicts(records: list[SpanRecord]) -> dict[str, str]:
    by_trace: dict[str, list[Any]] = {}
    for r in records:
        by_trace.setdefault(r.trace_id, []).append(normalise(r))
    out: dict[str, str] = {}
    for trace_id, spans in sorted(by_trace.items()):
        for v in decide([POLICY], build_trajectory(trace_id, spans)).verdicts:
            out[f"{trace_id}/{v.invariant}"] = v.verdict
    return out


WHOLE = {p.name: _verdicts(_fixture_records(p)) for p in CAPTURED}


def _cut(record: SpanRecord, keep: list[bool], events: bool) -> SpanRecord:
    """``record`` as the SDK leaves it over its limits: the attributes not kept dropped (and,
    with ``events``, its events), and counted."""
    kept = {k: v for (k, v), yes in zip(record.attributes.items(), keep + [True] * len(record.attributes), strict=False)
            if yes}  # fmt: skip
    lost = len(record.attributes) - len(kept) + (len(record.events) if events else 0)
    return SpanRecord(
        record.trace_id, record.span_id, record.parent_span_id, record.name, kind=record.kind,
        start_ns=record.start_ns, end_ns=record.end_ns, status_code=record.status_code,
        status_message=record.status_message, attributes=kept, events=[] if events else record.events,
        resource=record.resource, scope_name=record.scope_name, dropped=max(1, lost),
    )  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CAPTURED), st.data())
def test_whatever_the_sdk_dropped_a_verdict_is_the_whole_spans_or_indeterminate(path: Path, data: Any) -> None:
    records = _fixture_records(path)
    for i in data.draw(st.sets(st.integers(0, len(records) - 1), min_size=1, max_size=3)):
        keep = data.draw(st.lists(st.booleans(), max_size=len(records[i].attributes)))
        records[i] = _cut(records[i], keep, data.draw(st.booleans()))
    whole = WHOLE[path.name]
    for key, verdict in _verdicts(records).items():
        if key in whole:
            assert verdict in (whole[key], "indeterminate"), (path.name, key, verdict, whole[key])
        else:  # a trace the whole spans do not make (a root cut off): nothing decided on it
            assert verdict in ("indeterminate", "not_applicable"), (path.name, key, verdict)


def test_coverage_says_which_limits_to_raise() -> None:
    """The captured OpenInference trace of a long conversation under the SDK's default limits."""
    t = replay([FIXTURES / "conventions" / "openinference_openai_long_history.jsonl"]).trajectories
    report = coverage_report(t)
    assert report["incomplete"]["by_reason"] == {"attributes_dropped": 1}
    assert any("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT" in n for n in report["notes"]), report["notes"]
