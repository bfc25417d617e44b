"""Every convention fixture, read like ``otel-plumb replay`` reads files, gives the expected tool steps.

The fixtures and their ``.expected.json`` are written by tests/fixtures/capture.py: captured from
real instrumentation libraries where they run offline, built from the published attribute
definitions (``"synthetic": true``) where not.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from otel_plumb.assemble import build_trajectory
from otel_plumb.assemble.trajectory import plain_trajectory
from otel_plumb.check import ToolNames, load_policy
from otel_plumb.model import NormalisedSpan, SpanRecord, Trajectory
from otel_plumb.normalise import CAPTURE_HINTS, normalise
from otel_plumb.receive.files import ReadError, read_spans

FIXTURES = Path(__file__).parent / "fixtures" / "conventions"
NAMES = sorted(p.name.removesuffix(".expected.json") for p in FIXTURES.glob("*.expected.json"))

# The convention each fixture's tool steps must be attributed to.
CONVENTIONS = {
    "google_adk": "google_adk",
    "google_adk_runner": "google_adk",
    "google_adk_runner_legacy": "google_adk",
    "langfuse": "langfuse",
    "langfuse_sdk": "langfuse",
    "langsmith": "langsmith",
    "mcp": "mcp",
    "mcp_sdk": "mcp",
    "mcp_remote": "mcp",
    "mlflow": "mlflow",
    "mlflow_tracing": "mlflow",
    "openai_v2": "otel_genai",
    "openai_v2_no_content": "otel_genai",
    "openai_v2_with_httpx": "otel_genai",
    "openinference_langchain": "openinference",
    "openinference_openai": "openinference",
    "openinference_openai_hidden": "openinference",
    "openinference_openai_hidden_messages": "openinference",
    "openinference_openai_long_history": "openinference",
    "openinference_openai_parallel": "openinference",
    "openllmetry_openai": "otel_genai",
    "openllmetry_openai_no_content": "otel_genai",
    "otel_genai_events": "otel_genai",
    "otel_genai_redacted": "otel_genai",
    "pydantic_ai_v1": "pydantic_ai",
    "pydantic_ai_v2": "pydantic_ai",
    "pydantic_ai_v5": "pydantic_ai",
    "pydantic_ai_mcp_remote": "pydantic_ai",
    "pydantic_ai_remote_subagent": "pydantic_ai",
    "strands": "strands",
    "strands_openai": "strands",
    "strands_openai_latest": "strands",
    "traceloop": "traceloop",
    "vercel_ai": "vercel_ai",
    "vercel_ai_sdk": "vercel_ai",
    "vercel_ai_sdk_no_content": "vercel_ai",
}
# Traces of services that are no agent, captured from their instrumentation beside the agents'.
NOT_AGENT = {"httpx_service"}
AGENT_NAMES = [n for n in NAMES if n not in NOT_AGENT]


def load(name: str) -> tuple[dict[str, Any], list[SpanRecord]]:
    expected = json.loads((FIXTURES / f"{name}.expected.json").read_text())
    items = list(read_spans(FIXTURES / f"{name}.jsonl"))
    errors = [i for i in items if isinstance(i, ReadError)]
    assert not errors, errors
    return expected, [i for i in items if isinstance(i, SpanRecord)]


def trajectory(spans: list[SpanRecord]) -> Trajectory:
    by_trace: dict[str, list[NormalisedSpan]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(normalise(span))
    assert len(by_trace) == 1, "each fixture is one agent run in one trace"
    ((key, normalised),) = by_trace.items()
    return build_trajectory(key, normalised)


def test_every_fixture_is_checked():
    assert sorted([*CONVENTIONS, *NOT_AGENT]) == NAMES


@pytest.mark.parametrize("name", AGENT_NAMES)
def test_fixture_gives_the_expected_tool_steps(name):
    expected, spans = load(name)
    assert len(spans) == expected["span_count"]
    t = trajectory(spans)
    got = [{"name": s.name, "args": s.args, "error": s.error is not None, "source": s.source} for s in t.tool_steps]
    assert got == expected["tool_steps"]
    # Complete unless the trace cannot show what the agent did (then the expected file says why).
    reason = expected.get("incomplete_reason")
    assert (t.complete, t.incomplete_reason) == (reason is None, reason)
    assert t.root_span_id is not None
    assert [s.index for s in t.steps] == list(range(len(t.steps)))
    for step in t.tool_steps:
        assert step.convention == CONVENTIONS[name]
        assert (step.args_status == "captured") == (step.args is not None)
        assert (step.args_source is None) == (step.args_status == "absent")
    assert CONVENTIONS[name] in CAPTURE_HINTS
    assert t.attributes.get("service.name") == "billing-agent"
    assert t.has_agent_spans


def test_http_client_spans_are_not_an_agent_run():
    expected, spans = load("httpx_service")
    assert len(spans) == expected["span_count"] == 4
    t = trajectory(spans)
    assert (t.complete, t.tool_steps, t.has_agent_spans) == (True, [], False)
    assert sorted(s.name for s in t.steps) == ["GET", "GET", "POST", "sync_orders"]
    assert {s.convention for s in t.steps} == {"unknown"}


@pytest.mark.parametrize("name", NAMES)
def test_only_the_service_that_is_no_agent_takes_the_plain_path(name):
    """A captured service's trace is decided without its steps (``plain_trajectory``), with the
    fields of the full build; every captured agent run is built in full."""
    _, spans = load(name)
    normalised = [normalise(span) for span in spans]
    plain = plain_trajectory(normalised[0].trace_id, normalised, complete=True, incomplete_reason=None,
                             names_tool=ToolNames([]))  # fmt: skip
    if name not in NOT_AGENT:
        assert plain is None
        return
    full = trajectory(spans)
    assert plain is not None and plain.steps == []
    assert (plain.service, plain.root_span_id, plain.span_count, plain.start_ns, plain.end_ns, plain.complete) == (
        full.service, full.root_span_id, full.span_count, full.start_ns, full.end_ns, full.complete
    )


def test_http_client_spans_under_model_calls_leave_the_tool_steps_alone():
    _, spans = load("openai_v2_with_httpx")
    t = trajectory(spans)
    http = [s for s in t.steps if s.name == "POST"]
    assert len(http) == 3 and all(s.kind == "other" for s in http)
    assert [s.name for s in t.tool_steps] == ["lookup_invoice", "send_payment"]


@pytest.mark.parametrize(
    "name",
    [
        "pydantic_ai_v2",
        "pydantic_ai_v5",
        "strands_openai",
        "strands_openai_latest",
        "vercel_ai",
        "mcp",
        "langfuse",
        "mlflow",
    ],
)
def test_failed_calls_carry_the_error_message(name):
    _, spans = load(name)
    failed = [s for s in trajectory(spans).tool_steps if s.error is not None]
    assert [s.name for s in failed] == ["send_payment"]
    assert not failed[0].succeeded
    if name != "mcp":  # MCP reports only error.type
        assert "amount does not match invoice" in (failed[0].error or "")


@pytest.mark.parametrize(
    ("name", "agent", "session"),
    [
        ("pydantic_ai_v5", "billing", None),  # session: a generated gen_ai.conversation.id, checked below
        ("vercel_ai", "billing-agent", "sess-vercel-1"),
        ("vercel_ai_sdk", "billing-agent", "sess-vercel-1"),
        ("strands", "billing", "sess-strands-1"),
        ("strands_openai", "billing", "sess-strands-1"),
        ("google_adk", "billing", "sess-adk-1"),
        ("google_adk_runner", "billing", "sess-adk-1"),
        ("google_adk_runner_legacy", "billing", "sess-adk-1"),
        ("mcp", "billing", "conv-mcp-1"),
        ("traceloop", None, "sess-tl-1"),
        ("langsmith", None, "thread-ls-1"),
        ("langfuse", "billing-agent", "sess-lf-1"),
        ("langfuse_sdk", "billing-agent", "sess-lf-1"),
        ("openinference_langchain", "billing_agent", None),
    ],
)
def test_agent_and_session(name, agent, session):
    _, spans = load(name)
    t = trajectory(spans)
    assert t.agent == agent
    if session is not None:
        assert t.session_id == session
    if agent is not None:
        assert all(s.agent == agent for s in t.tool_steps)


def test_pydantic_ai_session_is_the_conversation_id():
    _, spans = load("pydantic_ai_v5")
    conversation = {s.attributes["gen_ai.conversation.id"] for s in spans}
    assert len(conversation) == 1 and trajectory(spans).session_id == conversation.pop()


@pytest.mark.parametrize("name", ["openai_v2", "openinference_openai", "openllmetry_openai"])
def test_requested_calls_become_steps_with_the_results_given_back(name):
    _, spans = load(name)
    t = trajectory(spans)
    lookup, payment = t.tool_steps
    assert lookup.tool_call_id == "call_0" and lookup.result == {
        "invoice_id": "INV-1042",
        "amount": 120.5,
        "currency": "EUR",
        "status": "open",
    }
    assert payment.result_status == "captured" and payment.result["status"] == "paid"
    llm = [s for s in t.steps if s.kind == "llm"]
    assert [s.tokens for s in llm] == [52, 62, 72]  # prompt + completion tokens of each call
    assert t.attributes["invoice.id"] == "INV-1042"  # a task key on the application's span


def test_a_long_conversation_over_the_default_span_limits_is_incomplete_but_keeps_its_calls():
    """70 earlier messages under the SDK's default of 128 attributes a span: each OpenInference
    model-call span lost its oldest attributes (the earliest messages, ``input.value``,
    ``llm.tools``, ...) and kept the newest (its kind, model, token counts, the calls it asked
    for, the results given back): the trajectory shows the calls, and says it may not be all."""
    _, spans = load("openinference_openai_long_history")
    cut = [s for s in spans if s.dropped]
    assert [(s.name, len(s.attributes)) for s in cut] == [("ChatCompletion", 128)] * 3
    for s in cut:
        assert "input.value" not in s.attributes and "llm.input_messages.0.message.content" not in s.attributes
        assert s.attributes["openinference.span.kind"] == "LLM"
    t = trajectory(spans)
    assert (t.complete, t.incomplete_reason) == (False, "attributes_dropped")
    assert len(t.problems) == 3
    for s, problem in zip(cut, t.problems, strict=True):
        assert problem.startswith(f"span {s.span_id} ('ChatCompletion'): the SDK dropped {s.dropped} of its")
    assert [s.tokens for s in t.steps if s.kind == "llm"] == [52, 62, 72]
    lookup, payment = t.tool_steps
    assert (lookup.tool_call_id, payment.tool_call_id) == ("call_0", "call_1")
    assert lookup.result["status"] == "open" and payment.result["status"] == "paid"


def test_without_content_capture_there_are_model_calls_but_no_tool_steps():
    _, spans = load("openai_v2_no_content")
    t = trajectory(spans)
    assert t.tool_steps == [] and [s.kind for s in t.steps].count("llm") == 3


def test_langchain_tool_span_args_come_from_the_matching_request():
    # LangChain records a one-argument tool's input as the bare value ("INV-1042"); the model's
    # request with the same tool-call id names it.
    _, spans = load("openinference_langchain")
    lookup = trajectory(spans).tool_steps[0]
    assert lookup.tool_call_id == "call_a" and lookup.args_source == "llm_output"
    assert lookup.result == {"invoice_id": "INV-1042", "amount": 120.5, "currency": "EUR", "status": "open"}


def test_redacted_and_undecodable_arguments_are_not_data():
    _, spans = load("otel_genai_redacted")
    t = trajectory(spans)
    statuses = [s.args_status for s in t.tool_steps]
    assert statuses == ["redacted", "undecodable", "captured"]
    assert t.problems == ["gen_ai.tool.call.arguments: neither JSON nor a Python literal (Expecting ',' delimiter)"]


def _redact_tool_results(spans: list[SpanRecord]) -> None:
    """Tool results given back to the model replaced by OpenInference's placeholder (what
    OPENINFERENCE_HIDE_INPUT_TEXT writes), in each form a model call's input carries them."""
    for span in spans:
        a = span.attributes
        for key, value in list(a.items()):
            if key.startswith("llm.input_messages.") and key.endswith(".message.role") and value == "tool":
                a[key.removesuffix(".role") + ".content"] = "__REDACTED__"
        if "gen_ai.input.messages" in a:
            history = json.loads(a["gen_ai.input.messages"])
            for message in history:
                for part in message["parts"] if message["role"] == "tool" else []:
                    part["response"] = "__REDACTED__"
            a["gen_ai.input.messages"] = json.dumps(history)
        for event in span.events:
            if event.name == "gen_ai.tool.message":
                event.attributes["content"] = "__REDACTED__"


@pytest.mark.parametrize(
    ("name", "source"),
    [("openinference_openai", "llm_output"), ("openai_v2", "llm_output"), ("otel_genai_events", "span")],
)
def test_a_redacted_result_given_back_is_redacted_not_a_captured_null(name, source, tmp_path):
    _, spans = load(name)
    _redact_tool_results(spans)
    t = trajectory(spans)
    assert [(s.source, s.result_status, s.result) for s in t.tool_steps] == [(source, "redacted", None)] * 2
    policy = tmp_path / "p.yaml"
    policy.write_text("policy: t\ninvariants:\n  - {id: r, arg_satisfies: {tool: send_payment, expr: result == null}}")
    (verdict,) = load_policy(policy).evaluate(t)
    assert verdict.verdict == "indeterminate" and "redacted" in verdict.message


def test_events_form_fills_arguments_and_results_by_call_id():
    _, spans = load("otel_genai_events")
    lookup, payment = trajectory(spans).tool_steps
    assert lookup.args_source == "llm_output" and lookup.source == "span"
    assert lookup.result_status == "captured" and payment.result["status"] == "paid"


@pytest.mark.parametrize("name", ["strands_openai", "strands_openai_latest", "mcp"])
def test_results_in_content_blocks_are_unwrapped(name):
    _, spans = load(name)
    lookup = trajectory(spans).tool_steps[0]
    assert lookup.result == {"invoice_id": "INV-1042", "amount": 120.5, "currency": "EUR", "status": "open"}


@pytest.mark.parametrize(
    "marks", [{"result": True}, {"mcp.tool.result.is_error": True}, {"mcp.tool.result.is_error": "true"}]
)
def test_an_mcp_call_whose_result_says_is_error_failed_without_error_type(marks):
    """MCP reports a tool's failure in its CallToolResult (``isError``), not as a protocol error:
    without ``error.type`` the call still failed (must_call is not met by it, never_call not
    broken by it)."""
    _, spans = load("mcp")
    failed = next(s for s in spans if "error.type" in s.attributes)
    del failed.attributes["error.type"]
    if "result" not in marks:  # the recorded result without its isError, the flag elsewhere
        result = json.loads(failed.attributes["gen_ai.tool.call.result"])
        del result["isError"]
        failed.attributes["gen_ai.tool.call.result"] = json.dumps(result)
        failed.attributes.update(marks)
    assert [s.error for s in trajectory(spans).tool_steps] == [None, "tool returned isError", None]


def test_mcp_sdk_spans_name_tools_and_failures_but_carry_no_arguments():
    _, spans = load("mcp_sdk")
    t = trajectory(spans)
    assert [s.args_status for s in t.tool_steps] == ["absent", "absent", "absent"]
    assert [s.error for s in t.tool_steps] == [None, "tool_error", None]
    assert [s.name for s in t.steps if s.kind == "other"] == ["server/discover", "tools/list"]


@pytest.mark.parametrize("name", ["google_adk_runner", "google_adk_runner_legacy"])
def test_each_model_call_is_one_llm_step(name):
    # ADK's schema 1 records each model call twice (call_llm around generate_content).
    _, spans = load(name)
    llm = [s for s in trajectory(spans).steps if s.kind == "llm"]
    assert [s.tokens for s in llm] == [52, 62, 72]
