"""OpenLLMetry / Traceloop.

Decorated spans (``@tool``, ``@agent``, ``@workflow``, ``@task``) carry ``traceloop.span.kind``,
``traceloop.entity.name``, and ``traceloop.entity.input`` / ``.output`` as JSON; the input of a
decorated function is ``{"args": [...], "kwargs": {...}}``. Model spans (``llm.request.type``)
flatten messages: ``gen_ai.completion.N.tool_calls.M.name`` / ``.arguments`` / ``.id`` are the
requested calls, ``gen_ai.prompt.N.role == "tool"`` with ``.tool_call_id`` / ``.content`` the
results given back.
"""

from __future__ import annotations

from typing import Any, Final

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan, StepKind
from otel_plumb.normalise import genai
from otel_plumb.normalise.common import (
    add_tool_results,
    as_str,
    first_str,
    flat_calls,
    flat_results,
    flattened,
    set_args,
    set_first_result,
)
from otel_plumb.normalise.values import decode

KINDS: Final[dict[str, StepKind]] = {"tool": "tool", "agent": "agent"}


def read(span: SpanRecord, out: NormalisedSpan) -> None:
    a = span.attributes
    out.convention = "traceloop"
    raw_kind = a.get("traceloop.span.kind")
    if raw_kind is None:
        _read_llm(span, out, a)
        return
    out.kind = KINDS.get(str(raw_kind), "other")
    entity = as_str(a.get("traceloop.entity.name"))
    suffix = f".{raw_kind}"  # span names are "<entity>.<kind>"
    out.name = entity or (span.name[: -len(suffix)] if span.name.endswith(suffix) else span.name)
    if out.kind == "agent":
        out.agent = out.name
    elif out.kind == "tool":
        _read_input(out, a)
        set_first_result(out, a, ("traceloop.entity.output",))


def _read_input(out: NormalisedSpan, a: dict[str, Any]) -> None:
    key = "traceloop.entity.input"
    if key in a:
        set_args(out, a[key], key)
        if out.tool_call_id is None:
            out.tool_call_id = _callback_call_id(a[key])


def _callback_call_id(raw: Any) -> str | None:
    """LangChain's callback payload names the model's tool call: ``{"kwargs": {"tool_call_id": ...}}``."""
    payload = decode(raw).value
    kwargs = payload.get("kwargs") if isinstance(payload, dict) else None
    return as_str(kwargs.get("tool_call_id")) if isinstance(kwargs, dict) else None


def _read_llm(span: SpanRecord, out: NormalisedSpan, a: dict[str, Any]) -> None:
    out.kind = "llm"
    out.name = first_str(a, ("gen_ai.request.model", "gen_ai.response.model")) or span.name
    completions = flattened(a, "gen_ai.completion.")
    out.requested_calls += tuple(flat_calls(completions, "tool_calls.", ("name", "arguments", "id")))
    prompts = flattened(a, "gen_ai.prompt.")
    add_tool_results(out, flat_results(prompts, "role", "tool_call_id", "content"))
    if not completions and "gen_ai.output.messages" in a:  # newer releases write the GenAI attributes
        genai.read_llm(span, out, a)
