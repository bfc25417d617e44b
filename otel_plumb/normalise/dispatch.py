"""Pick the convention a span follows and read it.

Dispatch is a few dict lookups, not a trial of every reader: first the instrumentation scope
(frameworks that emit GenAI-shaped spans with their own extras), then marker attributes that
only one convention writes, in order, then well-known span names. A span matching nothing is
kept as kind ``other`` with convention ``unknown``.
"""

from __future__ import annotations

from collections.abc import Collection

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan
from otel_plumb.normalise import frameworks, genai, observability, openinference, pydantic_ai, traceloop, vercel
from otel_plumb.normalise.common import Reader, Shape, base, finish

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
    reader = _scope_or_marker_reader(span.scope_name, span.attributes)
    return reader if reader is not None else BY_SPAN_NAME.get(span.name)


def _scope_or_marker_reader(scope_name: str, a: Collection[str]) -> Reader | None:
    reader = BY_SCOPE.get(scope_name)
    if reader is not None:
        return reader
    for key, marker_reader in MARKERS:
        if key in a:
            return marker_reader
    return None


# Spans of one instrumentation repeat the same scope and attribute keys: what dispatch and the
# shared fields need from those keys is worked out once per (scope, keys) and reused. Bounded,
# so odd key spaces (flattened message lists) cannot grow it forever.
_shapes: dict[tuple[str, tuple[str, ...]], tuple[Reader | None, Shape]] = {}
_SHAPES_MAX = 10_000


def normalise(span: SpanRecord) -> NormalisedSpan:
    cache_key = (span.scope_name, tuple(span.attributes))
    cached = _shapes.get(cache_key)
    if cached is None:
        if len(_shapes) >= _SHAPES_MAX:
            _shapes.clear()
        cached = _shapes[cache_key] = (_scope_or_marker_reader(*cache_key), Shape(cache_key[1]))
    reader, shape = cached
    out = base(span, shape)
    if reader is None:
        reader = BY_SPAN_NAME.get(span.name)
    if reader is not None:
        reader(span, out)
    finish(span, out, shape)
    return out
