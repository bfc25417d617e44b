"""OpenInference (``openinference.span.kind``: TOOL, LLM, AGENT, CHAIN, RETRIEVER, ...).

Tool spans: ``tool.name``, arguments in ``tool_call.function.arguments`` or ``input.value``
(``tool.parameters`` is the tool's JSON schema, read only when it holds values instead),
result in ``output.value``, ``tool_call.id``. Model spans flatten messages into attributes:
``llm.output_messages.N.message.tool_calls.M.tool_call.function.name`` / ``.arguments`` /
``tool_call.id`` are the requested calls; ``llm.input_messages.N.message.role == "tool"`` with
``.message.tool_call_id`` and ``.message.content`` are the results given back. With the messages
hidden (``OPENINFERENCE_HIDE_OUTPUT_MESSAGES`` / ``..._INPUT_MESSAGES``) but not the payloads,
``output.value`` / ``input.value`` still hold the provider's response and request as JSON, and
are read instead.
"""

from __future__ import annotations

from typing import Any, Final

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan, StepKind
from otel_plumb.normalise import messages
from otel_plumb.normalise.common import (
    add_tool_results,
    as_str,
    first_str,
    flat_calls,
    flat_results,
    flattened,
    set_args,
    set_first_args,
)
from otel_plumb.normalise.values import decode

KINDS: Final[dict[str, StepKind]] = {"TOOL": "tool", "LLM": "llm", "AGENT": "agent"}

_CALL_FIELDS: Final[tuple[str, str, str]] = ("tool_call.function.name", "tool_call.function.arguments", "tool_call.id")


def read(span: SpanRecord, out: NormalisedSpan) -> None:
    a = span.attributes
    out.convention = "openinference"
    raw_kind = a.get("openinference.span.kind")
    out.kind = KINDS.get(raw_kind.upper(), "other") if isinstance(raw_kind, str) else "other"
    if out.kind == "agent" and "tool.name" in a:
        out.kind = "tool"  # a tool that runs an agent (LangChain names such spans AGENT)
    elif span.scope_name == LANGCHAIN_SCOPE and out.kind in ("agent", "other") and "metadata" in a:
        out.kind = _langgraph_kind(span.name, out.kind, decode(a["metadata"]).value)
    # CrewAI and the OpenAI Agents SDK name the agent in graph.node.id too.
    out.agent = first_str(a, ("agent.name", "graph.node.id")) if out.kind == "agent" else as_str(a.get("agent.name"))
    if out.kind == "tool":
        _read_tool(span, out, a)
    elif out.kind == "agent":
        name = out.agent or _AGENT_SPAN_NAMES.get(span.scope_name, _same)(span.name)
        if name is None:
            # The instrumentation's own span around a run (OpenAI Agents' "Agent workflow"
            # trace root), not an agent.
            out.kind = "other"
            return
        out.name = out.agent = name
    elif out.kind == "llm":
        out.name = first_str(a, ("llm.model_name",)) or span.name
        _read_messages(out, a)


def _same(name: str) -> str | None:
    return name


def _smolagents_agent(name: str) -> str | None:
    return name.removesuffix(".run") or name  # "refunds.run": the agent named refunds


def _no_agent(name: str) -> str | None:
    return None  # every agent span of its own names the agent in agent.name


# How an AGENT span without agent.name names its agent, by instrumentation scope.
_AGENT_SPAN_NAMES: Final = {
    "openinference.instrumentation.smolagents": _smolagents_agent,
    "openinference.instrumentation.openai_agents": _no_agent,
}
LANGCHAIN_SCOPE: Final = "openinference.instrumentation.langchain"


def _langgraph_kind(name: str, kind: StepKind, metadata: Any) -> StepKind:
    """LangChain's tracer calls a run AGENT when its name contains "agent". Under LangGraph the
    agent is the graph: its root run (no ``langgraph_node`` of its own), or a sub-graph run inside
    another graph's node; a node of the graph (named as the node, e.g. create_react_agent's
    "agent" model node) is not an agent."""
    if not isinstance(metadata, dict) or metadata.get("ls_integration") != "langgraph":
        return kind
    node = metadata.get("langgraph_node")
    if node is None:
        return "agent"
    return "other" if node == name else kind


# A handoff in the OpenAI Agents SDK is a TOOL span "handoff to <agent>" without tool.name.
_HANDOFF_PREFIX: Final = "handoff to "

# Tools a framework runs itself to end its loop, not the agent's tools (smolagents returns its
# answer by "calling" final_answer).
FRAMEWORK_TOOLS: Final = {"openinference.instrumentation.smolagents": frozenset({"final_answer"})}


def _read_tool(span: SpanRecord, out: NormalisedSpan, a: dict[str, Any]) -> None:
    named = first_str(a, ("tool.name", "tool_call.function.name"))
    if named is None and span.name.startswith(_HANDOFF_PREFIX):
        # Control passes to another agent: an agent step naming it, not a tool call.
        out.kind = "agent"
        out.name = as_str(decode(a.get("output.value")).value) or span.name[len(_HANDOFF_PREFIX) :]
        return
    out.name = named or span.name
    if out.name in FRAMEWORK_TOOLS.get(span.scope_name, ()):
        out.kind = "other"
        return
    out.tool_call_id = first_str(a, ("tool_call.id", "gen_ai.tool.call.id"))
    params = a.get("tool.parameters")
    schema = decode(params).value if params is not None else None
    if not set_first_args(out, a, ("tool_call.function.arguments", "input.value")):
        if params is not None and not _is_schema(schema):
            set_args(out, params, "tool.parameters")
    elif out.args_status == "captured":
        _check_against_schema(out, parameter_names(schema))
    result = decode(a.get("output.value"))
    if result.status == "undecodable":
        out.problems += (f"output.value: {result.reason}",)
    out.result_status = result.status
    value = result.value
    # LangChain serialises the ToolMessage: the content is the result, and it names the call.
    if isinstance(value, dict) and value.get("type") == "tool" and isinstance(value.get("data"), dict):
        data = value["data"]
        out.tool_call_id = out.tool_call_id or as_str(data.get("tool_call_id"))
        inner = decode(data.get("content"))
        value = inner.value if inner.status == "captured" else data.get("content")
    out.result = value


def _is_schema(value: Any) -> bool:
    return isinstance(value, dict) and ("properties" in value or value.get("type") == "object")


def parameter_names(schema: Any) -> frozenset[str] | None:
    """A tool's parameter names from its JSON schema (``{"properties": {...}}``) or from a
    parameter map (``{"order_id": {"type": "string"}}``, as smolagents writes it); None when
    ``schema`` is neither."""
    if not isinstance(schema, dict) or not schema:
        return None
    props = schema.get("properties")
    if isinstance(props, dict):
        return frozenset(props)
    if all(isinstance(v, dict) and ("type" in v or "description" in v) for v in schema.values()):
        return frozenset(schema)
    return None


def _check_against_schema(out: NormalisedSpan, names: frozenset[str] | None) -> None:
    """Arguments that name none of the tool's parameters are a wrapper nobody has unwrapped, not
    the arguments: undecodable (the model's request, matched by call id, may supply them)."""
    args = out.args
    if not names:
        return
    if not isinstance(args, dict):
        if len(names) == 1 and isinstance(args, (str, int, float, bool)):
            # A single-argument tool given its value alone (LangChain's single-string input).
            (name,) = names
            out.args = {name: args}
            return
        what = f"a {type(args).__name__}, not the named parameters"
    elif not args or args.keys() <= names:
        return
    else:
        # Sorted by their text: keys of a Python repr may mix str and int.
        what = f"{sorted(args, key=str)[:5]} are not the parameters"
    out.args, out.args_status = None, "undecodable"
    out.problems += (f"{out.args_source}: {what} of {out.name} ({sorted(names, key=str)[:5]})",)

def _read_messages(out: NormalisedSpan, a: dict[str, Any]) -> None:
    outputs = flattened(a, "llm.output_messages.")
    if outputs:
        out.requested_calls += tuple(flat_calls(outputs, "message.tool_calls.", _CALL_FIELDS))
    elif "output.value" in a:
        payload = decode(a["output.value"])
        if payload.status == "captured":
            out.requested_calls += tuple(messages.requested_calls(payload.value))
    inputs = flattened(a, "llm.input_messages.")
    if inputs:
        results = flat_results(inputs, "message.role", "message.tool_call_id", "message.content")
        add_tool_results(out, results)
    elif "input.value" in a:
        payload = decode(a["input.value"])
        if payload.status == "captured":
            add_tool_results(out, messages.tool_results(payload.value))
