"""Pydantic AI (scope ``pydantic-ai``), every instrumentation data format.

- version 3 and later: OTel GenAI attributes (``execute_tool <tool>`` spans with
  ``gen_ai.tool.call.arguments`` / ``.result``, ``invoke_agent <agent>``, ``chat <model>``).
- version 2: ``running tool`` spans with ``tool_arguments`` / ``tool_response``, ``agent run``.
- version 1 (older releases): the same span names, and model messages as a JSON list of GenAI
  events in the ``events`` attribute (``event_mode="attributes"``) instead of
  ``gen_ai.input.messages`` / ``gen_ai.output.messages``.

Logfire-style attributes (``logfire.msg`` "running tool: <name>") name the tool when nothing else does.
"""

from __future__ import annotations

from typing import Any, Final

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan, StepKind
from otel_plumb.normalise import genai, messages
from otel_plumb.normalise.common import add_tool_results, as_str, name_after, set_args, set_result
from otel_plumb.normalise.values import ABSENT, decode, given_result

_TOOL_MSG_PREFIX: Final = "running tool: "


def read(span: SpanRecord, out: NormalisedSpan) -> None:
    a = span.attributes
    genai.read_as(span, out, "pydantic_ai", None if "gen_ai.operation.name" in a else _legacy_kind(span))
    if out.agent is None:
        out.agent = as_str(a.get("agent_name"))
    if out.kind == "tool":
        if out.name == span.name:
            msg = as_str(a.get("logfire.msg"))
            out.name = (name_after(msg, _TOOL_MSG_PREFIX) if msg else None) or out.name
        if out.args_status == "absent" and "tool_arguments" in a:
            set_args(out, a["tool_arguments"], "tool_arguments")
        if out.result_status == "absent" and "tool_response" in a:
            set_result(out, a["tool_response"], "tool_response")
    elif out.kind == "agent":
        out.name = out.agent or out.name
    elif out.kind == "llm" and "events" in a and "gen_ai.output.messages" not in a:
        _read_events_attribute(out, a["events"])


def _legacy_kind(span: SpanRecord) -> StepKind | None:
    """Version 1 spans carry no gen_ai.operation.name: the span name says what they are."""
    if span.name == "running tool" or "tool_arguments" in span.attributes:
        return "tool"
    if span.name == "agent run" or "agent_name" in span.attributes:
        return "agent"
    return None


def _read_events_attribute(out: NormalisedSpan, raw: Any) -> None:
    d = decode(raw)
    if d.status == "undecodable":
        out.problems += (f"events: {d.reason}",)
    if d.status != "captured" or not isinstance(d.value, list):
        return
    results: dict[str, Any] = {}
    for event in d.value:
        if not isinstance(event, dict):
            continue
        name = event.get("event.name")
        if name == "gen_ai.choice":
            out.requested_calls += tuple(messages.requested_calls(event))
        elif name == "gen_ai.tool.message":
            call_id = as_str(event.get("id"))
            if call_id is not None:
                result = given_result(event.get("content"))
                if result is not ABSENT:
                    results[call_id] = result
    add_tool_results(out, results)
