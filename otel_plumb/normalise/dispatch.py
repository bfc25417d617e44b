"""Pick the convention a span follows and read it.

Dispatch is a few dict lookups, not a trial of every reader: first the instrumentation scope
(frameworks that emit GenAI-shaped spans with their own extras), then marker attributes that
only one convention writes, in order, then well-known span names. A span matching nothing is
kept as kind ``other``: with convention ``unrecognised`` when it looks like an agent's (its
attribute keys or name speak of tools, agents, model calls) so the trajectory can say that
tool calls may be hidden in it, else ``unknown`` (application spans, and HTTP, database,
messaging and RPC spans, which their own semantic conventions identify).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan
from otel_plumb.normalise import frameworks, genai, observability, openinference, pydantic_ai, traceloop, vercel
from otel_plumb.normalise.common import Reader, Shape, base, finish
from otel_plumb.normalise.hints import framework_of

# Frameworks whose spans look like OTel GenAI but carry their payloads elsewhere.
BY_SCOPE: Final[dict[str, Reader]] = {
    "pydantic-ai": pydantic_ai.read,
    "strands.telemetry.tracer": frameworks.read_strands,
    "strands-agents": frameworks.read_strands,
    "gcp.vertex.agent": frameworks.read_adk,
    "ai": vercel.read,
    "semantic_kernel.functions.kernel_function": frameworks.read_semantic_kernel,
    "autogen SingleThreadedAgentRuntime": frameworks.read_autogen_runtime,
}

# (attribute, reader), most specific first: payload conventions before the GenAI attributes
# they often carry too, MCP before GenAI (its tool spans also have gen_ai.tool.name).
MARKERS: Final[tuple[tuple[str, Reader], ...]] = (
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
BY_SPAN_NAME: Final[dict[str, Reader]] = {"running tool": pydantic_ai.read, "agent run": pydantic_ai.read}


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


# Attribute namespaces of the HTTP, database, messaging and RPC semantic conventions: such a span
# is a plain client, server or messaging span whatever its name says ("POST /v1/chat/completions",
# an agent runtime's "process <agent>" message delivery).
INFRASTRUCTURE_PREFIXES: Final = ("http.", "url.", "db.", "messaging.", "rpc.")


def _infrastructure(keys: Collection[str]) -> bool:
    return any(k.startswith(INFRASTRUCTURE_PREFIXES) for k in keys)
# What an agent framework's own spans speak of, in attribute keys or span names.
_AGENTIC_KEY: Final = re.compile(r"tool|agent|llm|prompt|completion|handoff|crew", re.IGNORECASE)
_AGENTIC_NAME: Final = re.compile(
    r"(?<![a-z])(tools?|agents?|llm|completions?|handoffs?|crews?)(?![a-z])", re.IGNORECASE
)


def _unrecognised_keys(keys: tuple[str, ...]) -> bool:
    """No convention reads the span, and its attributes look like an agent framework's."""
    if _infrastructure(keys):
        return False
    return any(_AGENTIC_KEY.search(k) for k in keys if not k.startswith("plumb."))


# Spans of one instrumentation repeat the same scope and attribute keys: what dispatch and the
# shared fields need from those keys, and the framework the scope names, are worked out once per
# (scope, keys) and reused. Bounded, so odd key spaces (flattened message lists) cannot grow it
# forever.
_shapes: Final[dict[tuple[str, tuple[str, ...]], tuple[Reader | None, Shape, bool, bool, str | None]]] = {}
_SHAPES_MAX: Final = 10_000


def normalise(span: SpanRecord) -> NormalisedSpan:
    # Compiled, list(d.keys()) is one C loop over the dict, tuple(d) an iterator's call per key.
    cache_key = (span.scope_name, tuple(list(span.attributes.keys())))
    cached = _shapes.get(cache_key)
    if cached is None:
        if len(_shapes) >= _SHAPES_MAX:
            _shapes.clear()
        scope, keys = cache_key
        cached = _shapes[cache_key] = (
            _scope_or_marker_reader(scope, keys), Shape(keys), _unrecognised_keys(keys), _infrastructure(keys),
            framework_of(scope),
        )  # fmt: skip
    reader, shape, agentic_keys, infrastructure, framework = cached
    out = base(span, shape)
    if reader is None:
        reader = BY_SPAN_NAME.get(span.name)
    if reader is not None:
        reader(span, out)
    elif agentic_keys or (not infrastructure and _AGENTIC_NAME.search(span.name)):
        out.convention = "unrecognised"
        namespaces = sorted({k.split(".", 1)[0] for k in span.attributes}) or ["none"]
        out.problems += (f"unrecognised span {span.name!r}: attribute namespaces {', '.join(namespaces[:10])}",)
    finish(span, out, shape)
    out.framework = framework
    return out
