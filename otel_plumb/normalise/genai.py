"""OTel GenAI semantic conventions (v1.37-1.41 and the GenAI conventions repository).

``gen_ai.operation.name`` picks the kind: ``execute_tool`` spans carry ``gen_ai.tool.name``,
``gen_ai.tool.call.id``, ``gen_ai.tool.call.arguments`` / ``.result``; model calls carry
``gen_ai.input.messages`` / ``gen_ai.output.messages`` (JSON, "parts" format) as attributes or
on a ``gen_ai.client.inference.operation.details`` event; the older event-based form records
``gen_ai.choice`` and ``gen_ai.tool.message`` span events instead.
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
    name_after,
    set_first_args,
    set_first_result,
)
from otel_plumb.normalise.values import ABSENT, decode, given_result

OPERATION_KINDS: Final[dict[str, StepKind]] = {
    "execute_tool": "tool",
    "invoke_agent": "agent",
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
}

ARGS_KEYS: Final[tuple[str, ...]] = ("gen_ai.tool.call.arguments",)
RESULT_KEYS: Final[tuple[str, ...]] = ("gen_ai.tool.call.result",)
_DETAILS_EVENT: Final = "gen_ai.client.inference.operation.details"
_INPUT: Final = "gen_ai.input.messages"
_OUTPUT: Final = "gen_ai.output.messages"
_MODEL_KEYS: Final[tuple[str, ...]] = ("gen_ai.request.model", "gen_ai.response.model")


def read(span: SpanRecord, out: NormalisedSpan) -> None:
    read_as(span, out, "otel_genai")


def read_as(span: SpanRecord, out: NormalisedSpan, convention: str, kind: StepKind | None = None) -> None:
    """The OTel GenAI reading, under the convention name of the framework that emitted it
    (which may know the kind from elsewhere, e.g. the span name)."""
    a = span.attributes
    out.convention = convention
    out.kind = kind or kind_of(span, a)
    out.agent = as_str(a.get("gen_ai.agent.name"))
    if out.kind == "tool":
        read_tool(span, out, a)
    elif out.kind == "agent":
        out.name = out.agent or name_after(span.name, "invoke_agent ") or span.name
    elif out.kind == "llm":
        read_llm(span, out, a)
    elif "gen_ai.workflow.name" in a:
        out.name = as_str(a.get("gen_ai.workflow.name")) or span.name


def kind_of(span: SpanRecord, a: dict[str, Any]) -> StepKind:
    op = a.get("gen_ai.operation.name")
    kind = OPERATION_KINDS.get(op) if isinstance(op, str) else None
    if kind is not None:
        return kind
    if op is not None:
        return "other"  # workflows, embeddings, retrieval, ...: operations that are not steps we check
    if "gen_ai.tool.name" in a or span.name.startswith("execute_tool"):
        return "tool"
    if span.name.startswith("invoke_agent"):
        return "agent"
    if any(k in a for k in _MODEL_KEYS):
        return "llm"
    return "other"


def read_tool(span: SpanRecord, out: NormalisedSpan, a: dict[str, Any]) -> None:
    # A bare "execute_tool" span name is the operation, not a tool's name.
    from_span = span.name if span.name.strip() != "execute_tool" else ""
    named = as_str(a.get("gen_ai.tool.name")) or name_after(span.name, "execute_tool ") or from_span
    if not named.strip():
        # No tool named, in the attributes or the span name: a call of any tool may be hidden
        # in it, as in a span no convention reads (the trajectory is incomplete, not a call of
        # a tool named after the span).
        out.kind, out.convention = "other", "unrecognised"
        out.problems += (f"gen_ai.tool.name: absent, and span {span.name!r} names no tool",)
        return
    out.name = named
    out.tool_call_id = as_str(a.get("gen_ai.tool.call.id"))
    if not set_first_args(out, a, ARGS_KEYS):
        for e in span.events:
            if set_first_args(out, e.attributes, ARGS_KEYS):
                break
    if not set_first_result(out, a, RESULT_KEYS):
        for e in span.events:
            if set_first_result(out, e.attributes, RESULT_KEYS):
                break


def read_llm(span: SpanRecord, out: NormalisedSpan, a: dict[str, Any]) -> None:
    out.name = first_str(a, _MODEL_KEYS) or span.name
    output, output_key = a.get(_OUTPUT), _OUTPUT
    inputs = a.get(_INPUT)
    if output is None or inputs is None:
        for e in span.events:
            if e.name == _DETAILS_EVENT:
                output = output if output is not None else e.attributes.get(_OUTPUT)
                inputs = inputs if inputs is not None else e.attributes.get(_INPUT)
    if output is not None:
        read_output(out, output, output_key)
    if inputs is not None:
        read_input(out, inputs, _INPUT)
    if output is None:
        read_legacy_events(span, out)


def read_output(out: NormalisedSpan, raw: Any, source: str) -> None:
    """Requested tool calls from a model output payload (any shape ``messages`` knows)."""
    d = decode(raw)
    if d.status == "captured":
        out.requested_calls += tuple(messages.requested_calls(d.value))
    elif d.status == "undecodable":
        out.problems += (f"{source}: {d.reason}",)


def read_input(out: NormalisedSpan, raw: Any, source: str) -> None:
    """Tool results given back to the model, from an input messages payload."""
    d = decode(raw)
    if d.status == "captured":
        add_tool_results(out, messages.tool_results(d.value))
    elif d.status == "undecodable":
        out.problems += (f"{source}: {d.reason}",)


def read_legacy_events(span: SpanRecord, out: NormalisedSpan) -> None:
    """The event-based form: ``gen_ai.choice`` (the output) and ``gen_ai.tool.message`` (a
    result; only those after the last ``gen_ai.assistant.message``, as for message lists)."""
    results: dict[str, Any] = {}
    for e in span.events:
        if e.name == "gen_ai.choice":
            payload = {k: decode(v).value for k, v in e.attributes.items()}
            out.requested_calls += tuple(messages.requested_calls(payload))
        elif e.name == "gen_ai.assistant.message":
            results.clear()
        elif e.name == "gen_ai.tool.message":
            call_id = as_str(e.attributes.get("id") or e.attributes.get("tool_call_id"))
            if call_id is not None:
                result = given_result(e.attributes.get("content"))
                if result is not ABSENT:
                    results[call_id] = result
    add_tool_results(out, results)
