"""Conventions of tracing backends that record whole inputs and outputs as JSON payloads.

- LangSmith (``langsmith.span.kind``: llm, chain, tool, retriever, ...): ``gen_ai.prompt`` holds
  the run's inputs and ``gen_ai.completion`` its outputs, both JSON; ``langsmith.trace.name``.
- MLflow (``mlflow.spanType``: TOOL, LLM, CHAT_MODEL, AGENT, CHAIN, ...): every attribute is
  JSON-encoded (the type itself is ``"\\"TOOL\\""``); ``mlflow.spanInputs`` / ``mlflow.spanOutputs``,
  ``mlflow.chat.tokenUsage``.
- Langfuse (``langfuse.observation.type``: tool, generation, agent, span, chain, ...):
  ``langfuse.observation.input`` / ``.output``, ``langfuse.observation.level`` ERROR with
  ``langfuse.observation.status_message``, ``langfuse.observation.usage_details``,
  ``langfuse.session.id``.

Tool inputs recorded by function decorators (``{"args": [...], "kwargs": {...}}``) are reduced
to the keyword arguments when there are no positional ones.
"""

from __future__ import annotations

from typing import Any, Final

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan, StepKind
from otel_plumb.normalise import genai
from otel_plumb.normalise.common import as_int, error_line, first_str, set_args, set_result
from otel_plumb.normalise.values import decode

LANGSMITH_KINDS: Final[dict[str, StepKind]] = {"tool": "tool", "llm": "llm", "chat_model": "llm"}
MLFLOW_KINDS: Final[dict[str, StepKind]] = {"TOOL": "tool", "LLM": "llm", "CHAT_MODEL": "llm", "AGENT": "agent"}
LANGFUSE_KINDS: Final[dict[str, StepKind]] = {"tool": "tool", "generation": "llm", "agent": "agent"}


def read_langsmith(span: SpanRecord, out: NormalisedSpan) -> None:
    a = span.attributes
    out.convention = "langsmith"
    out.kind = LANGSMITH_KINDS.get(str(a.get("langsmith.span.kind")).lower(), "other")
    out.name = first_str(a, ("langsmith.trace.name",)) or span.name
    _read_payloads(out, a, "gen_ai.prompt", "gen_ai.completion")
    if out.kind == "tool" and isinstance(out.result, dict) and set(out.result) == {"output"}:
        out.result = out.result["output"]  # LangSmith wraps a tool's non-dict return value
    if out.kind == "llm":
        out.name = first_str(a, ("gen_ai.request.model", "gen_ai.response.model")) or out.name


def read_mlflow(span: SpanRecord, out: NormalisedSpan) -> None:
    a = span.attributes
    out.convention = "mlflow"
    span_type = decode(a.get("mlflow.spanType")).value
    out.kind = MLFLOW_KINDS.get(span_type, "other") if isinstance(span_type, str) else "other"
    _read_payloads(out, a, "mlflow.spanInputs", "mlflow.spanOutputs")
    if out.kind == "llm":
        usage = decode(a.get("mlflow.chat.tokenUsage")).value
        if isinstance(usage, dict):
            out.tokens = _usage_total(usage, ("input_tokens", "output_tokens"), "total_tokens")


def read_langfuse(span: SpanRecord, out: NormalisedSpan) -> None:
    a = span.attributes
    out.convention = "langfuse"
    out.kind = LANGFUSE_KINDS.get(str(a.get("langfuse.observation.type")), "other")
    _read_payloads(out, a, "langfuse.observation.input", "langfuse.observation.output")
    if str(a.get("langfuse.observation.level")).upper() == "ERROR":
        message = first_str(a, ("langfuse.observation.status_message",)) or span.status_message
        out.error = error_line(message) if message else "error"
    if out.kind == "llm":
        out.name = first_str(a, ("langfuse.observation.model.name", "gen_ai.request.model")) or out.name
        usage = decode(a.get("langfuse.observation.usage_details")).value
        if isinstance(usage, dict):
            out.tokens = _usage_total(usage, ("input", "output"), "total")


def _read_payloads(out: NormalisedSpan, a: dict[str, Any], input_key: str, output_key: str) -> None:
    if out.kind == "tool":
        if input_key in a:
            set_args(out, a[input_key], input_key)
        if output_key in a:
            set_result(out, a[output_key], output_key)
    elif out.kind == "llm":
        if output_key in a:
            genai.read_output(out, a[output_key], output_key)
        if input_key in a:
            genai.read_input(out, a[input_key], input_key)
    elif out.kind == "agent":
        out.agent = out.name


def _usage_total(usage: dict[str, Any], parts: tuple[str, str], total_key: str) -> int | None:
    values = [as_int(usage.get(k)) for k in parts]
    if any(v is not None for v in values):
        return sum(v or 0 for v in values)
    return as_int(usage.get(total_key))
