"""Vercel AI SDK telemetry (``ai.operationId``).

``ai.toolCall`` spans: ``ai.toolCall.name``, ``ai.toolCall.id``, ``ai.toolCall.args`` (newer
releases ``ai.toolCall.input``), ``ai.toolCall.result`` (``ai.toolCall.output``); model calls
(``ai.generateText.doGenerate``, ``ai.streamText.doStream``, ...): ``ai.response.toolCalls``
(JSON list of ``{toolCallId, toolName, args | input}``) and ``ai.prompt.messages`` (tool
results as ``tool-result`` parts). The outer ``ai.generateText`` / ``ai.streamText`` span runs
the whole multi-step loop: it is the agent step, named by ``ai.telemetry.functionId``. Newer
releases also write OTel GenAI attributes, read when the ``ai.*`` ones are missing.
"""

from __future__ import annotations

from typing import Final

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan
from otel_plumb.normalise import genai
from otel_plumb.normalise.common import as_str, first_str, set_first_args, set_first_result

_MODEL_CALLS: Final = frozenset(
    {
        "ai.generateText.doGenerate",
        "ai.streamText.doStream",
        "ai.generateObject.doGenerate",
        "ai.streamObject.doStream",
    }
)
_LOOPS: Final = frozenset({"ai.generateText", "ai.streamText", "ai.generateObject", "ai.streamObject"})


def read(span: SpanRecord, out: NormalisedSpan) -> None:
    a = span.attributes
    op = as_str(a.get("ai.operationId")) or ""
    out.convention = "vercel_ai"
    if op == "ai.toolCall" or "ai.toolCall.name" in a:
        out.kind = "tool"
        out.name = first_str(a, ("ai.toolCall.name", "gen_ai.tool.name")) or span.name
        out.tool_call_id = first_str(a, ("ai.toolCall.id", "gen_ai.tool.call.id"))
        set_first_args(out, a, ("ai.toolCall.args", "ai.toolCall.input", *genai.ARGS_KEYS))
        set_first_result(out, a, ("ai.toolCall.result", "ai.toolCall.output", *genai.RESULT_KEYS))
    elif op in _MODEL_CALLS:
        out.kind = "llm"
        out.name = first_str(a, ("ai.model.id", "gen_ai.request.model")) or span.name
        for key in ("ai.response.toolCalls", "gen_ai.output.messages"):
            if key in a:
                genai.read_output(out, a[key], key)
                break
        for key in ("ai.prompt.messages", "gen_ai.input.messages"):
            if key in a:
                genai.read_input(out, a[key], key)
                break
    elif op in _LOOPS:
        out.kind = "agent"
        out.name = first_str(a, ("ai.telemetry.functionId", "gen_ai.agent.name")) or op
        out.agent = out.name
    else:
        out.kind = "other"
