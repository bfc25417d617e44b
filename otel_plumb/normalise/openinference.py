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

from collections.abc import Mapping
from typing import Any

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan, StepKind
from otel_plumb.normalise import messages
from otel_plumb.normalise.common import as_str, first_str, flat_calls, flat_results, flattened, set_args, set_first_args
from otel_plumb.normalise.values import decode

KINDS: dict[str, StepKind] = {"TOOL": "tool", "LLM": "llm", "AGENT": "agent"}

_CALL_FIELDS = ("tool_call.function.name", "tool_call.function.arguments", "tool_call.id")


def read(span: SpanRecord, out: NormalisedSpan) -> None:
    a = span.attributes
    out.convention = "openinference"
    raw_kind = a.get("openinference.span.kind")
    out.kind = KINDS.get(raw_kind.upper(), "other") if isinstance(raw_kind, str) else "other"
    out.agent = as_str(a.get("agent.name"))
    if out.kind == "tool":
        _read_tool(span, out, a)
    elif out.kind == "agent":
        out.name = out.agent or span.name
        out.agent = out.name
    elif out.kind == "llm":
        out.name = first_str(a, ("llm.model_name",)) or span.name
        _read_messages(out, a)


def _read_tool(span: SpanRecord, out: NormalisedSpan, a: Mapping[str, Any]) -> None:
    out.name = first_str(a, ("tool.name", "tool_call.function.name")) or span.name
    out.tool_call_id = first_str(a, ("tool_call.id", "gen_ai.tool.call.id"))
    if not set_first_args(out, a, ("tool_call.function.arguments", "input.value")):
        params = a.get("tool.parameters")
        if params is not None and not _is_schema(decode(params).value):
            set_args(out, params, "tool.parameters")
    result = decode(a.get("output.value"))
    if result.status == "undecodable":
        out.problems.append(f"output.value: {result.reason}")
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


def _read_messages(out: NormalisedSpan, a: Mapping[str, Any]) -> None:
    outputs = flattened(a, "llm.output_messages.")
    if outputs:
        out.requested_calls.extend(flat_calls(outputs, "message.tool_calls.", _CALL_FIELDS))
    elif "output.value" in a:
        payload = decode(a["output.value"])
        if payload.status == "captured":
            out.requested_calls.extend(messages.requested_calls(payload.value))
    inputs = flattened(a, "llm.input_messages.")
    if inputs:
        out.tool_results.update(flat_results(inputs, "message.role", "message.tool_call_id", "message.content"))
    elif "input.value" in a:
        payload = decode(a["input.value"])
        if payload.status == "captured":
            out.tool_results.update(messages.tool_results(payload.value))
