"""The agent-side helper: trace context in, plumb.* baggage onto spans, injected tool faults."""

import asyncio

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_plumb.agent import Faults, InjectedFault, in_trial, setup_tracing, trial_context
from otel_plumb.campaign.runners import TraceContext

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def spans_under(carrier):
    exporter = InMemorySpanExporter()
    provider = setup_tracing("agent", exporter=exporter, batch=False)
    tracer = provider.get_tracer("t")
    with in_trial(carrier), tracer.start_as_current_span("root"), tracer.start_as_current_span("tool"):
        pass
    provider.shutdown()
    return exporter.get_finished_spans()


def test_headers_give_the_trace_and_plumb_baggage_becomes_span_attributes():
    ctx = TraceContext(TRACE_ID, "00f067aa0ba902b7", {"plumb.case.id": "INV 7001/ü", "plumb.arm": "retry"})
    headers = {"Traceparent": ctx.traceparent, "Baggage": ctx.baggage + ",other.key=x"}
    spans = spans_under(headers)
    assert {format(s.context.trace_id, "032x") for s in spans} == {TRACE_ID}
    root = next(s for s in spans if s.name == "root")
    assert format(root.parent.span_id, "016x") == "00f067aa0ba902b7"
    for s in spans:
        assert s.attributes["plumb.case.id"] == "INV 7001/ü"  # percent-encoded on the wire, decoded here
        assert s.attributes["plumb.arm"] == "retry"
        assert "other.key" not in s.attributes  # only plumb.* entries are copied


def test_trial_context_alone_parents_the_first_span():
    exporter = InMemorySpanExporter()
    provider = setup_tracing("agent", exporter=exporter, batch=False)
    ctx = trial_context({"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01", "baggage": "plumb.arm=a"})
    with provider.get_tracer("t").start_as_current_span("root", context=ctx):
        pass
    (root,) = exporter.get_finished_spans()
    assert format(root.context.trace_id, "032x") == TRACE_ID and root.attributes["plumb.arm"] == "a"


def test_environment_of_a_command_agent(monkeypatch):
    monkeypatch.setenv("TRACEPARENT", f"00-{TRACE_ID}-00f067aa0ba902b7-01")
    monkeypatch.setenv("BAGGAGE", "plumb.trial.id=t-1")
    (root,) = [s for s in spans_under(None) if s.name == "root"]
    assert format(root.context.trace_id, "032x") == TRACE_ID and root.attributes["plumb.trial.id"] == "t-1"
    monkeypatch.delenv("TRACEPARENT")
    monkeypatch.delenv("BAGGAGE")
    (root,) = [s for s in spans_under(None) if s.name == "root"]
    assert root.parent is None and "plumb.trial.id" not in root.attributes


def test_faults_fail_the_first_calls_then_let_the_tool_run():
    faults = Faults.from_request({"faults": [{"tool": "match", "error": "503 upstream", "times": 2}]})
    calls = []
    match = faults.wrap("match", lambda po: calls.append(po) or "matched")
    other = faults.wrap("other", lambda: "fine")
    for _ in range(2):
        with pytest.raises(InjectedFault, match="503 upstream") as err:
            match("PO-1")
        assert err.value.tool == "match"
    assert calls == []  # a failed call did not happen
    assert match("PO-1") == "matched" and calls == ["PO-1"]
    assert other() == "fine"


def test_faults_wrap_coroutine_tools():
    faults = Faults([{"tool": "fetch", "error": "timeout"}])

    async def fetch():
        return "invoice"

    wrapped = faults.wrap("fetch", fetch)
    with pytest.raises(InjectedFault):
        asyncio.run(wrapped())
    assert asyncio.run(wrapped()) == "invoice"
