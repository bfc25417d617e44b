"""Normalise: dispatch, the fields every convention shares, and robustness on arbitrary spans."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from otel_plumb.assemble import build_trajectory
from otel_plumb.check import load_policy
from otel_plumb.model import SpanEvent, SpanRecord
from otel_plumb.model.span import STATUS_ERROR, STATUS_OK
from otel_plumb.normalise import CAPTURE_HINTS, messages, normalise
from otel_plumb.normalise.dispatch import BY_SCOPE, BY_SPAN_NAME, MARKERS, Dispatch, DispatchCache
from otel_plumb.receive.otlp import request_records


def span(attributes=None, *, name="s", scope="", events=None, status=0, message="", resource=None, parent=None):
    return SpanRecord(
        "t1",
        "a1",
        parent,
        name,
        start_ns=1,
        end_ns=2,
        status_code=status,
        status_message=message,
        attributes=attributes or {},
        events=events or [],
        resource=resource or {},
        scope_name=scope,
    )


def test_a_span_matching_no_convention_is_kept_as_other():
    n = normalise(span({"http.method": "GET"}, name="GET /health"))
    assert (n.kind, n.convention, n.name) == ("other", "unknown", "GET /health")
    assert n.attributes == {"http.method": "GET"}
    assert n.args_status == "absent" and n.problems == ()


def test_short_scalar_attributes_are_kept_long_payloads_are_not():
    resource = {"service.name": "billing", "host.name": "h1", "big": "x" * 300}
    attributes = {
        "plumb.case.id": "c1",
        "plumb.context.expected_amount": 120.5,
        "plumb.context.expected_calls": json.dumps(["lookup_invoice"] * 40),  # long, kept
        "plumb.context.vendors": ["v1", "v2"],
        "invoice.id": "INV-1",
        "gen_ai.tool.call.arguments": json.dumps({"blob": "y" * 400}),
        "llm.input_messages.0.message.content": "short but flattened",
        "flag": True,
        "list": [1, 2],
        "service.name": "span-level wins",
        # Convention namespaces are read into fields, not kept; user metadata they carry is.
        "gen_ai.tool.name": "pay",
        "gen_ai.operation.name": "execute_tool",
        "traceloop.association.properties.customer_id": "cust-9",
        "session.id": "s1",
    }
    n = normalise(span(attributes, resource=resource))
    assert n.attributes == {
        "service.name": "span-level wins",
        "host.name": "h1",
        "plumb.case.id": "c1",
        "plumb.context.expected_amount": 120.5,
        "plumb.context.expected_calls": json.dumps(["lookup_invoice"] * 40),
        "plumb.context.vendors": ["v1", "v2"],
        "invoice.id": "INV-1",
        "flag": True,
        "traceloop.association.properties.customer_id": "cust-9",
        "session.id": "s1",
    }
    assert (n.kind, n.name, n.session_id) == ("tool", "pay", "s1")


def test_errors_from_status_exception_events_and_error_type():
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay"}
    assert normalise(span(tool, status=STATUS_ERROR, message="declined")).error == "declined"
    exc = SpanEvent("exception", 5, {"exception.type": "ValueError", "exception.message": "bad amount"})
    assert normalise(span(tool, events=[exc])).error == "bad amount"
    assert normalise(span({**tool, "error.type": "timeout"})).error == "timeout"
    assert normalise(span(tool, status=STATUS_ERROR)).error == "error"
    assert normalise(span(tool)).error is None


def _sdk_tool_span(*, status: StatusCode, error_type: str | None = None) -> SpanRecord:
    """A ``pay`` tool span from the OpenTelemetry SDK, through the OTLP encoder and decoder, that
    recorded an exception (a first attempt that timed out) and then ended with ``status``."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay"}
    with provider.get_tracer("test").start_as_current_span("execute_tool pay", attributes=attributes) as sdk_span:
        sdk_span.record_exception(TimeoutError("first attempt timed out, retrying"))
        if error_type is not None:
            sdk_span.set_attribute("error.type", error_type)
        sdk_span.set_status(Status(status))
    provider.shutdown()
    (record,) = request_records(encode_spans(exporter.get_finished_spans()))
    return record


def test_an_exception_event_on_a_span_with_status_ok_is_no_error(tmp_path):
    # OK is final: the tool raised, handled it (a retry) and succeeded.
    record = _sdk_tool_span(status=StatusCode.OK)
    assert [e.name for e in record.events] == ["exception"] and record.status_code == STATUS_OK
    (step,) = build_trajectory(record.trace_id, [normalise(record)]).tool_steps
    assert step.error is None and step.succeeded
    policy = tmp_path / "p.yaml"
    policy.write_text("policy: t\ninvariants:\n  - {id: m, must_call: pay}\n  - {id: n, never_call: pay}\n")
    verdicts = load_policy(policy).evaluate(build_trajectory(record.trace_id, [normalise(record)]))
    assert [(v.invariant, v.verdict) for v in verdicts] == [("m", "pass"), ("n", "fail")]
    # Without a status the exception event still says the call failed; error.type says so whatever the status.
    assert normalise(_sdk_tool_span(status=StatusCode.UNSET)).error == "first attempt timed out, retrying"
    assert normalise(_sdk_tool_span(status=StatusCode.OK, error_type="timeout")).error == "timeout"


def test_tokens_only_on_model_calls_and_session_ids():
    usage = {"gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": "5"}
    llm = normalise(span({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", **usage}))
    assert (llm.kind, llm.name, llm.tokens) == ("llm", "m", 15)
    agent = normalise(span({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a", **usage}))
    assert agent.tokens is None and agent.name == "a"
    oi = normalise(span({"openinference.span.kind": "LLM", "llm.token_count.total": 9, "session.id": "s1"}))
    assert oi.tokens == 9 and oi.session_id == "s1"
    lf = normalise(span({"langfuse.observation.type": "span", "langfuse.session.id": "s2"}))
    assert lf.session_id == "s2" and lf.convention == "langfuse"


def test_dispatch_picks_the_specific_convention_over_genai():
    # MCP tool spans also carry gen_ai.* attributes; OpenInference spans may carry gen_ai.* too.
    mcp = {"mcp.method.name": "tools/call", "gen_ai.tool.name": "pay", "gen_ai.operation.name": "execute_tool"}
    assert normalise(span(mcp)).convention == "mcp"
    oi = {"openinference.span.kind": "TOOL", "tool.name": "pay", "gen_ai.operation.name": "execute_tool"}
    assert normalise(span(oi)).convention == "openinference"
    pyd = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay"}
    assert normalise(span(pyd, scope="pydantic-ai")).convention == "pydantic_ai"
    assert normalise(span({"tool_arguments": "{}"}, name="running tool")).kind == "tool"


def test_mcp_flattened_arguments_and_other_methods():
    n = normalise(
        span({"mcp.method.name": "tools/call", "mcp.tool.name": "pay", "mcp.request.argument.amount": "12.5"})
    )
    assert (n.kind, n.name, n.args_source) == ("tool", "pay", "mcp.request.argument.*")
    assert n.args == {"amount": "12.5"}
    assert normalise(span({"mcp.method.name": "tools/list"}, name="tools/list")).kind == "other"
    # A value's JSON cut off (an attribute length limit): not the value sent, whatever the rest.
    cut = {"mcp.method.name": "tools/call", "mcp.tool.name": "mail", "mcp.request.argument.to": '"alice@co',
           "mcp.request.argument.n": "3"}  # fmt: skip
    n = normalise(span(cut))
    assert (n.args_status, n.args) == ("undecodable", None) and n.problems[0].startswith("mcp.request.argument.to: ")
    # A placeholder stays where it is, for the checks to find (check.values).
    n = normalise(span({**cut, "mcp.request.argument.to": "<REDACTED>"}))
    assert (n.args_status, n.args) == ("captured", {"to": "<REDACTED>", "n": "3"})


def test_openinference_tool_parameters_schema_is_not_arguments():
    schema = json.dumps({"type": "object", "properties": {"q": {"type": "string"}}})
    n = normalise(span({"openinference.span.kind": "TOOL", "tool.name": "search", "tool.parameters": schema}))
    assert n.args_status == "absent"
    values = normalise(span({"openinference.span.kind": "TOOL", "tool.parameters": json.dumps({"q": "x"})}))
    assert values.args == {"q": "x"} and values.args_source == "tool.parameters"


def test_mlflow_values_are_json_encoded():
    n = normalise(
        span(
            {
                "mlflow.spanType": json.dumps("TOOL"),
                "mlflow.spanInputs": json.dumps({"q": "x"}),
                "mlflow.spanOutputs": json.dumps(json.dumps({"hits": 3})),
            },
            name="search",
        )
    )
    assert (n.kind, n.name, n.args, n.result) == ("tool", "search", {"q": "x"}, {"hits": 3})


def test_every_convention_has_a_capture_hint():
    conventions = {"otel_genai", "mcp", "openinference", "traceloop", "vercel_ai", "pydantic_ai", "langsmith"}
    conventions |= {"strands", "google_adk", "mlflow", "langfuse", "unknown"}
    assert set(CAPTURE_HINTS) == conventions and all(CAPTURE_HINTS.values())


# ---------------------------------------------------------------------------------------------
# Arbitrary spans never make normalise or build_trajectory raise.

KNOWN_KEYS = sorted(
    {key for key, _ in MARKERS}
    | {
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "gen_ai.tool.call.id",
        "gen_ai.agent.name",
        "gen_ai.conversation.id",
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments",
        "llm.output_messages.0.message.tool_calls.0.tool_call.id",
        "llm.input_messages.0.message.role",
        "llm.input_messages.0.message.tool_call_id",
        "llm.input_messages.0.message.content",
        "input.value",
        "output.value",
        "tool.name",
        "tool.parameters",
        "traceloop.entity.input",
        "traceloop.entity.output",
        "gen_ai.completion.0.tool_calls.0.name",
        "gen_ai.completion.0.tool_calls.0.arguments",
        "gen_ai.prompt.0.role",
        "gen_ai.prompt.0.tool_call_id",
        "ai.toolCall.args",
        "ai.toolCall.result",
        "ai.response.toolCalls",
        "ai.prompt.messages",
        "tool_response",
        "events",
        "agent_name",
        "gcp.vertex.agent.tool_response",
        "gcp.vertex.agent.llm_response",
        "mlflow.spanInputs",
        "mlflow.spanOutputs",
        "mlflow.chat.tokenUsage",
        "langfuse.observation.input",
        "langfuse.observation.output",
        "langfuse.observation.level",
        "langfuse.observation.usage_details",
        "gen_ai.prompt",
        "gen_ai.completion",
        "mcp.request.argument.x",
        "tool.status",
        "error.type",
        "session.id",
    }
)
KINDS = ["execute_tool", "invoke_agent", "chat", "TOOL", "LLM", "AGENT", "tool", "llm", "generation", '"TOOL"']

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30) | st.binary(max_size=20)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3),
    max_leaves=12,
)
structured = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.sampled_from(KINDS),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "name",
                    "id",
                    "arguments",
                    "args",
                    "function",
                    "tool_calls",
                    "parts",
                    "role",
                    "content",
                    "toolUse",
                    "functionCall",
                    "tool_call_id",
                    "message",
                    "input",
                    "toolName",
                ]
            )
            | st.text(max_size=5),
            children,
            max_size=4,
        )
    ),
    max_leaves=15,
)
attribute_values = (
    values
    | st.sampled_from(KINDS)
    | structured.map(json.dumps)
    | structured.map(lambda v: json.dumps(json.dumps(v)))
    | structured.map(repr)
    | st.sampled_from(["<REDACTED>", "***", "{'a': ", "[1,", "{" * 50])
)
attributes = st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=15), attribute_values, max_size=8)
event_names = st.sampled_from(
    [
        "exception",
        "gen_ai.choice",
        "gen_ai.tool.message",
        "gen_ai.client.inference.operation.details",
        "gen_ai.user.message",
    ]
) | st.text(max_size=10)
events = st.lists(st.builds(SpanEvent, event_names, st.integers(0, 10), attributes), max_size=3)
ids = st.sampled_from(["a", "b", "c", "d", "e"])
records = st.builds(
    SpanRecord,
    st.sampled_from(["t1", "t2"]),
    ids,
    st.none() | ids,
    st.sampled_from(["running tool", "agent run", "call_llm", "execute_tool x", "ai.toolCall"]) | st.text(max_size=12),
    kind=st.integers(0, 5),
    start_ns=st.integers(0, 10**6),
    end_ns=st.integers(0, 10**6),
    status_code=st.integers(0, 2),
    status_message=st.text(max_size=10),
    attributes=attributes,
    events=events,
    resource=st.dictionaries(st.text(max_size=8), values, max_size=3),
    scope_name=st.sampled_from([*BY_SCOPE, ""]) | st.text(max_size=8),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records, max_size=6))
def test_arbitrary_spans_never_raise(spans):
    normalised = [normalise(s) for s in spans]
    for n in normalised:
        assert n.kind in ("tool", "llm", "agent", "other")
        assert n.args_status in ("captured", "absent", "redacted", "undecodable")
        assert n.args_status == "captured" or n.args is None
        assert isinstance(n.name, str)
        assert all(isinstance(p, str) and ": " in p for p in n.problems)
    t = build_trajectory("k", normalised)
    assert [s.index for s in t.steps] == list(range(len(t.steps)))


# Message-shaped values: the keys the message readers look at, holding anything (a role that is
# a list, a call id that is an object), at any depth.
message_keys = st.sampled_from([
    "role", "type", "id", "tool_call_id", "toolCallId", "name", "arguments", "args", "input", "function", "toolUse",
    "toolResult", "functionResponse", "toolName", "content", "parts", "tool_calls", "messages", "response", "result",
    "output", "choices", "message",
])  # fmt: skip
message_scalars = st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from(
    ["tool", "tool_result", "tool_call", "function_call_output", "assistant", "call_1", "lookup", '{"a": 1}', ""]
)
message_trees = st.recursive(
    message_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(message_keys, inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(message_trees, message_trees)
def test_arbitrary_messages_never_raise(inputs, outputs):
    n = normalise(span({
        "gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(inputs),
        "gen_ai.output.messages": json.dumps(outputs),
    }))  # fmt: skip
    assert n.kind == "llm" and not any("could not" in p for p in n.problems)
    assert all(isinstance(c.name, str) and c.name for c in n.requested_calls)
    assert all(isinstance(k, str) for k in n.tool_results)


def test_span_name_readers_are_registered():
    assert set(BY_SPAN_NAME) == {"running tool", "agent run"}


def test_redacted_fields_inside_captured_arguments_are_named():
    args = json.dumps({"invoice_id": "INV-1", "card": "<REDACTED>", "note": "***"})
    n = normalise(span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.arguments": args}))
    assert n.args_status == "captured" and n.args["invoice_id"] == "INV-1"
    assert n.problems == (
        "gen_ai.tool.call.arguments: argument 'card' is a redaction placeholder",
        "gen_ai.tool.call.arguments: argument 'note' is a redaction placeholder",
    )


def test_only_results_given_back_since_the_last_model_turn_are_kept():
    history = [
        {"role": "user", "content": "pay"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "a"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"n": 1}'},
        {"role": "assistant", "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "b"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": '{"n": 2}'},
    ]
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(history)}
    assert normalise(span(attributes)).tool_results == {"c2": {"n": 2}}
    flat = {"openinference.span.kind": "LLM"}
    for i, m in enumerate(history):
        flat[f"llm.input_messages.{i}.message.role"] = m["role"]
        if "tool_call_id" in m:
            flat[f"llm.input_messages.{i}.message.tool_call_id"] = m["tool_call_id"]
            flat[f"llm.input_messages.{i}.message.content"] = m["content"]
    assert normalise(span(flat)).tool_results == {"c2": {"n": 2}}


@pytest.mark.parametrize("wrapper", messages._RESULT_WRAPPERS)
def test_a_result_in_each_wrapper_is_found(wrapper):
    given_back = [{"role": "user", "parts": [{wrapper: {"id": "c1", "name": "lookup", "response": {"n": 1}}}]}]
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(given_back)}
    assert normalise(span(attributes)).tool_results == {"c1": {"n": 1}}


_attribute_keys = st.sampled_from(
    ["http.method", "url.full", "service.name", "plumb.case.id", "db.statement", "gen_ai.tool.name", "invoice.id"]
)
_attribute_values = st.one_of(
    st.text(max_size=3), st.text(min_size=257, max_size=260), st.integers(), st.booleans(), st.lists(st.integers())
)


@given(st.dictionaries(_attribute_keys, _attribute_values), st.dictionaries(_attribute_keys, _attribute_values))
def test_kept_attributes_are_the_resources_short_ones_then_the_spans(attributes, resource):
    """Whatever mix of short and long values, of convention keys or none: a span keeps its
    resource's short scalars, then its own short scalars and plumb.* values over them, outside
    the conventions' namespaces."""

    def kept(values, own):
        return {
            k: v for k, v in values.items()
            if k.startswith("plumb.") or (
                (not own or not k.startswith("gen_ai."))
                and (type(v) in (int, bool) or (type(v) is str and len(v) <= 256))
            )
        }  # fmt: skip

    n = normalise(span(attributes, name="GET /health", resource=resource))
    expected = {**kept(resource, own=False), **kept(attributes, own=True)}
    assert n.attributes == expected
    assert list(n.attributes) == list(expected)


# Few scopes and keys, so that sequences share a scope, a first key and a length (the cache's
# candidates) and differ further on.
_scopes = st.sampled_from(["", "pydantic-ai", "opentelemetry.instrumentation.httpx"])
_key_sequences = st.lists(
    st.sampled_from(["http.method", "url.full", "gen_ai.operation.name", "gen_ai.tool.name", "tool.name", "llm.x"]),
    max_size=5, unique=True,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_scopes, _key_sequences), max_size=60), st.integers(1, 3), st.integers(1, 12))
def test_the_dispatch_cache_gives_each_span_the_dispatch_of_its_own_keys(seen, candidates, limit):
    """Whatever order key sequences come in, with candidates dropped and the cache started
    again: each span gets the reading of its own scope and keys, in their order, and the cache
    holds no more than its bounds."""
    cache = DispatchCache(candidates=candidates, limit=limit)
    for scope, keys in seen:
        found = cache.find(scope, dict.fromkeys(keys, "v"))
        fresh = Dispatch(scope, tuple(keys))
        assert found.keys == tuple(keys)
        assert (found.reader, found.agentic_keys, found.infrastructure, found.framework) == (
            fresh.reader, fresh.agentic_keys, fresh.infrastructure, fresh.framework,
        )  # fmt: skip
        assert found.shape.kept == fresh.shape.kept and found.shape.session_keys == fresh.shape.session_keys
        buckets = [b for by_first in cache.by_scope.values() for b in by_first.values()]
        assert sum(map(len, buckets)) == cache.size <= limit
        assert all(len(b) <= candidates for b in buckets)


def test_a_repeated_key_sequence_is_worked_out_once():
    cache = DispatchCache()
    first = cache.find("s", {"http.method": "GET", "url.full": "/a"})
    assert cache.find("s", {"http.method": "POST", "url.full": "/b"}) is first
    assert cache.find("s", {"url.full": "/b", "http.method": "POST"}) is not first  # another order
    assert cache.find("other", {"http.method": "GET", "url.full": "/a"}) is not first  # another scope
    assert cache.size == 3


def test_a_genai_tool_span_naming_no_tool_is_unrecognised_not_a_tool_called_execute_tool(tmp_path):
    """execute_tool with no gen_ai.tool.name (nor a name after it): which tool ran is unknown, so
    no check may count it as one tool or another, nor say no tool it names ran."""
    agent = span({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "ap"}, name="invoke_agent ap")
    unnamed = span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.arguments": '{"amount": 5}'},
                   name="execute_tool", parent=agent.span_id)  # fmt: skip
    unnamed.span_id = "b1"
    n = normalise(unnamed)
    assert (n.kind, n.convention) == ("other", "unrecognised")
    assert n.problems[0].startswith("gen_ai.tool.name: ") and "names no tool" in n.problems[0]
    t = build_trajectory("t1", [normalise(agent), n])
    assert not t.complete and t.tool_steps == []
    policy = tmp_path / "p.yaml"
    policy.write_text("policy: p\ninvariants:\n  - {id: n, never_call: pay}\n  - {id: m, must_call: check}\n")
    assert [v.verdict for v in load_policy(policy).evaluate(t)] == ["indeterminate", "indeterminate"]
    named = span({"gen_ai.operation.name": "execute_tool"}, name="execute_tool pay", parent=agent.span_id)
    assert (normalise(named).kind, normalise(named).name) == ("tool", "pay")
    # A tool the attribute names "execute_tool" is a tool of that name, whatever the span's name.
    literal = span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "execute_tool"}, name="execute_tool")
    assert (normalise(literal).kind, normalise(literal).name) == ("tool", "execute_tool")
