"""Pick the convention a span follows and read it.

Dispatch is a few dict lookups, not a trial of every reader: first the instrumentation scope
(frameworks that emit GenAI-shaped spans with their own extras), then marker attributes that
only one convention writes, in order, then well-known span names. A span matching nothing is
kept as kind ``other`` with convention ``unknown``.
"""

from __future__ import annotations

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan
from otel_plumb.normalise import frameworks, genai, observability, openinference, pydantic_ai, traceloop, vercel
from otel_plumb.normalise.common import Reader, base, finish

# Frameworks whose spans look like OTel GenAI but carry their payloads elsewhere.
BY_SCOPE: dict[str, Reader] = {
    "pydantic-ai": pydantic_ai.read,
    "strands.telemetry.tracer": frameworks.read_strands,
    "strands-agents": frameworks.read_strands,
    "gcp.vertex.agent": frameworks.read_adk,
    "ai": vercel.read,
}

# (attribute, reader), most specific first: payload conventions before the GenAI attributes
# they often carry too, MCP before GenAI (its tool spans also have gen_ai.tool.name).
MARKERS: tuple[tuple[str, Reader], ...] = (
    ("openinference.span.kind", openinference.read),
    ("langfuse.observation.type", observability.read_langfuse),
    ("mlflow.spanType", observability.read_mlflow),
    ("langsmith.span.kind", observability.read_langsmith),
    ("traceloop.span.kind", traceloop.read),
    ("ai.operationId", vercel.read),
    ("ai.toolCall.name", vercel.read),
    ("mcp.method.name", frameworks.read_mcp),
    ("gcp.vertex.agent.tool_call_args", frameworks.read_adk),
    ("gcp.vertex.agent.llm_request", frameworks.read_adk),
    ("tool_arguments", pydantic_ai.read),
    ("llm.request.type", traceloop.read),
    ("gen_ai.operation.name", genai.read),
    ("gen_ai.tool.name", genai.read),
    ("gen_ai.request.model", genai.read),
)

# Span names that identify a convention when no attribute does (pydantic-ai data format 1).
BY_SPAN_NAME: dict[str, Reader] = {"running tool": pydantic_ai.read, "agent run": pydantic_ai.read}


def reader_for(span: SpanRecord) -> Reader | None:
    reader = BY_SCOPE.get(span.scope_name)
    if reader is not None:
        return reader
    a = span.attributes
    for key, marker_reader in MARKERS:
        if key in a:
            return marker_reader
    return BY_SPAN_NAME.get(span.name)


def normalise(span: SpanRecord) -> NormalisedSpan:
    out = base(span)
    reader = reader_for(span)
    if reader is not None:
        reader(span, out)
    finish(span, out)
    return out
