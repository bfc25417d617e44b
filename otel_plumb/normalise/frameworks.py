"""Frameworks that emit OTel GenAI spans with payloads of their own: MCP, AWS Strands, Google ADK.

- MCP (``mcp.method.name``): ``tools/call`` spans are tool calls, named by ``gen_ai.tool.name``
  (older instrumentations: ``mcp.tool.name``), arguments in ``gen_ai.tool.call.arguments`` or
  flattened ``mcp.request.argument.<name>``, result in ``gen_ai.tool.call.result`` or
  ``mcp.tool.result.content``; other methods (initialize, tools/list, ...) are ``other``.
- AWS Strands (scope ``strands.telemetry.tracer``): a tool span records its input on the
  ``gen_ai.tool.message`` event (``content``) and its result on ``gen_ai.choice`` (``message``),
  ``tool.status`` "error" on failure; a model span records its output content blocks
  (``toolUse``) on ``gen_ai.choice``.
- Google ADK (scope ``gcp.vertex.agent``): ``gcp.vertex.agent.tool_call_args`` /
  ``gcp.vertex.agent.tool_response`` on ``execute_tool`` spans, ``gcp.vertex.agent.llm_request``
  / ``llm_response`` (Gemini ``functionCall`` / ``functionResponse`` parts) on ``call_llm``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from otel_plumb.model.span import SPAN_KIND_CLIENT, SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan, RequestedCall, StepKind
from otel_plumb.normalise import genai
from otel_plumb.normalise.common import (
    as_str,
    captured_tool_results,
    error_of,
    first_str,
    set_args,
    set_first_args,
    set_first_result,
)
from otel_plumb.normalise.values import decode

_MCP_ARG_PREFIX: Final = "mcp.request.argument."


def read_mcp(span: SpanRecord, out: NormalisedSpan) -> None:
    a = span.attributes
    method = as_str(a.get("mcp.method.name"))
    out.convention = "mcp"
    if method != "tools/call":
        out.kind, out.name = "other", span.name
        return
    out.kind = "tool"
    # The MCP SDK's client span is named "MCP send tools/call <tool>", and names the tool nowhere else.
    named = span.name.partition("tools/call ")[2].strip()
    out.name = first_str(a, ("gen_ai.tool.name", "mcp.tool.name")) or named or span.name
    out.tool_call_id = first_str(a, ("gen_ai.tool.call.id",))
    out.agent = as_str(a.get("gen_ai.agent.name"))
    if not set_first_args(out, a, ("gen_ai.tool.call.arguments", "mcp.request.params.arguments")):
        flat = {k[len(_MCP_ARG_PREFIX) :]: v for k, v in a.items() if k.startswith(_MCP_ARG_PREFIX)}
        if flat:
            _set_flat_args(out, flat)
    set_first_result(out, a, _MCP_RESULT_KEYS)
    if out.error is None and (_is_true(a.get("mcp.tool.result.is_error")) or _result_is_error(a)):
        out.error = error_of(span) or "tool returned isError"
    elif out.error is None and span.kind == SPAN_KIND_CLIENT and out.result_status == "absent":
        # A client span recording neither the result nor its isError cannot say the tool did not
        # fail (the MCP SDK's), unless the request itself failed.
        out.outcome_recorded = "mcp.tool.result.is_error" in a or error_of(span) is not None


# Where the tool's CallToolResult is recorded, first found first.
_MCP_RESULT_KEYS: Final[tuple[str, ...]] = ("gen_ai.tool.call.result", "mcp.tool.result.content")


def _is_true(value: object) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def _result_is_error(a: Mapping[str, object]) -> bool:
    """The recorded CallToolResult says the call failed (``"isError": true``): MCP reports a
    tool's failure in its result, not as a protocol error, and an instrumentation may record
    no ``error.type`` for it."""
    for key in _MCP_RESULT_KEYS:
        raw = a.get(key)
        if raw is not None:
            d = decode(raw)
            return d.status == "captured" and isinstance(d.value, dict) and _is_true(d.value.get("isError"))
    return False


def _set_flat_args(out: NormalisedSpan, flat: dict[str, object]) -> None:
    """Flattened MCP arguments are recorded as JSON of each value. One that does not decode
    (JSON text cut off, by an attribute length limit say) is not the value sent, so the
    arguments are undecodable, naming it; a placeholder stays, for the checks to see."""
    source = _MCP_ARG_PREFIX + "*"
    args: dict[str, object] = {}
    for key, value in flat.items():
        d = decode(value)
        if d.status == "undecodable":
            out.args_status, out.args_source = "undecodable", source
            out.problems += (f"{_MCP_ARG_PREFIX}{key}: {d.reason}",)
            return
        args[key] = d.value if d.status == "captured" else value
    set_args(out, args, source)


def read_strands(span: SpanRecord, out: NormalisedSpan) -> None:
    genai.read_as(span, out, "strands")
    a = span.attributes
    if out.kind == "tool":
        if out.args_status == "absent":
            for e in span.events:
                if e.name == "gen_ai.tool.message" and set_args(out, e.attributes.get("content"), e.name):
                    break
        if out.result_status == "absent":
            for e in span.events:
                if e.name == "gen_ai.choice" and set_first_result(out, e.attributes, ("message",)):
                    break
        if as_str(a.get("tool.status")) == "error" and out.error is None:
            out.error = error_of(span) or "tool.status error"
    elif out.kind == "llm" and not out.requested_calls:
        genai.read_legacy_events(span, out)
        for e in span.events:
            if e.name.startswith("gen_ai.") and e.name.endswith(".message") and e.name != "gen_ai.tool.message":
                genai.read_input(out, e.attributes.get("content"), e.name)


ADK_MERGED_TOOLS: Final = "(merged tools)"


def read_adk(span: SpanRecord, out: NormalisedSpan) -> None:
    a = span.attributes
    kind: StepKind | None = None
    if "gen_ai.operation.name" not in a:
        if span.name == "call_llm" or "gcp.vertex.agent.llm_request" in a:
            kind = "llm"
        elif span.name.startswith(("agent_run", "invoke_agent")):
            kind = "agent"
    genai.read_as(span, out, "google_adk", kind)
    if out.kind == "tool" and out.name == ADK_MERGED_TOOLS:
        # ADK's span around the merged responses of parallel calls (each call has its own span).
        out.kind = "other"
    elif out.kind == "tool":
        if out.args_status == "absent":
            set_first_args(out, a, ("gcp.vertex.agent.tool_call_args",))
        if out.result_status == "absent":
            set_first_result(out, a, ("gcp.vertex.agent.tool_response",))
    elif out.kind == "llm":
        if not out.requested_calls and "gcp.vertex.agent.llm_response" in a:
            genai.read_output(out, a["gcp.vertex.agent.llm_response"], "gcp.vertex.agent.llm_response")
        if "gcp.vertex.agent.llm_request" in a and not captured_tool_results(out):
            genai.read_input(out, a["gcp.vertex.agent.llm_request"], "gcp.vertex.agent.llm_request")
    elif out.kind == "agent" and out.name == span.name:
        bracketed = span.name.partition("[")[2].rstrip("]")
        out.name = bracketed or out.name
        out.agent = out.name


# Semantic Kernel names a function "<plugin>-<function>" (the name the model calls it by); the
# tool is the function. Its Handoff plugin is the framework's own: transfer_to_<agent> hands
# control over (an agent step, see assemble), complete_task ends the run (not a tool).
SK_FRAMEWORK_PLUGIN: Final = "Handoff"


def read_semantic_kernel(span: SpanRecord, out: NormalisedSpan) -> None:
    genai.read_as(span, out, "otel_genai")
    if out.kind != "tool":
        return
    plugin, sep, function = out.name.partition("-")
    if not sep or not function:
        return
    out.name = function
    if plugin == SK_FRAMEWORK_PLUGIN and not function.startswith("transfer_to_"):
        out.kind = "other"


def read_autogen_runtime(span: SpanRecord, out: NormalisedSpan) -> None:
    """AutoGen's runtime delivers messages between agents (messaging spans). The tool calls a model
    asked for travel in a ``ToolCallRequestEvent`` message: read as the requested calls, which
    give the ``execute_tool`` spans (no arguments of their own) their arguments by call id."""
    out.convention = "autogen"
    message = decode(span.attributes.get("message")).value
    event = message.get("message") if isinstance(message, dict) else None
    if not isinstance(event, dict) or event.get("type") != "ToolCallRequestEvent":
        return
    calls = event.get("content")
    if not isinstance(calls, (list, tuple)):
        return  # a list of calls, or nothing we can read
    for call in calls:
        if isinstance(call, dict) and isinstance(call.get("name"), str) and call["name"]:
            args = decode(call.get("arguments"))
            out.requested_calls += (RequestedCall(call["name"], args.value, args.status, as_str(call.get("id"))),)
