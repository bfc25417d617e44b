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
from typing import Any, Final

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan
from otel_plumb.normalise import frameworks, genai, observability, openinference, pydantic_ai, traceloop, vercel
from otel_plumb.normalise.common import Reader, Shape, base, finish, mark_cut
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
INFRASTRUCTURE_PREFIXES: Final[tuple[str, ...]] = ("http.", "url.", "db.", "messaging.", "rpc.")


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


class Dispatch:
    """How the spans of one scope and attribute key sequence are read, worked out once: the
    convention's reader (None: none by scope or attribute), what the shared fields take from the
    keys (``Shape``), whether the keys look like an agent framework's or like infrastructure, and
    the framework the scope names."""

    __slots__ = ("agentic_keys", "framework", "infrastructure", "keys", "reader", "shape")

    def __init__(self, scope: str, keys: tuple[str, ...]) -> None:
        self.keys = keys
        self.reader = _scope_or_marker_reader(scope, keys)
        self.shape = Shape(keys)
        self.agentic_keys = _unrecognised_keys(keys)
        self.infrastructure = _infrastructure(keys)
        self.framework = framework_of(scope)


class DispatchCache:
    """The ``Dispatch`` of each (scope, attribute keys in order) seen, found by scope and first
    key, then by comparing the span's keys in order with each candidate's. Spans of one
    instrumentation repeat a few key sequences, their keys mostly the same string objects (the
    decoder's cached strings), so comparing them is cheaper than building, hashing and comparing
    a tuple of them (measured: about 550 instructions fewer a span of an HTTP client, 800 a span
    of agent traces). Bounded: at most ``candidates`` a (scope, first key), the newest first,
    and ``limit`` in all (then it starts again), so that odd key spaces (flattened message
    lists, hostile input) neither grow it nor cost a span more than ``candidates`` comparisons."""

    __slots__ = ("by_scope", "candidates", "limit", "size")

    def __init__(self, candidates: int = 8, limit: int = 10_000) -> None:
        self.by_scope: dict[str, dict[str, list[Dispatch]]] = {}
        self.candidates = candidates
        self.limit = limit
        self.size = 0

    def find(self, scope: str, attributes: dict[str, Any]) -> Dispatch:
        first = ""
        for key in attributes:
            first = key
            break
        n = len(attributes)
        by_first = self.by_scope.get(scope)
        bucket = by_first.get(first) if by_first is not None else None
        if bucket is not None:
            for known in bucket:
                if len(known.keys) == n and _in_order(attributes, known.keys):
                    return known
        if self.size >= self.limit:
            self.by_scope.clear()
            self.size = 0
            by_first = bucket = None
        if by_first is None:
            by_first = self.by_scope[scope] = {}
        if bucket is None:
            bucket = by_first[first] = []
        found = Dispatch(scope, tuple(attributes))
        if len(bucket) >= self.candidates:
            bucket.pop()
        else:
            self.size += 1
        bucket.insert(0, found)
        return found


def _in_order(attributes: dict[str, Any], keys: tuple[str, ...]) -> bool:
    """Whether ``attributes`` has ``keys`` in this order (its size is ``len(keys)``)."""
    return all(key == keys[i] for i, key in enumerate(attributes))


_dispatches: Final = DispatchCache()


def normalise(span: SpanRecord) -> NormalisedSpan:
    dispatch = _dispatches.find(span.scope_name, span.attributes)
    shape = dispatch.shape
    out = base(span, shape)
    reader = dispatch.reader
    if reader is None:
        reader = BY_SPAN_NAME.get(span.name)
    if reader is not None:
        reader(span, out)
    elif dispatch.agentic_keys or (not dispatch.infrastructure and _AGENTIC_NAME.search(span.name)):
        out.convention = "unrecognised"
        namespaces = sorted({k.split(".", 1)[0] for k in span.attributes}) or ["none"]
        out.problems += (f"unrecognised span {span.name!r}: attribute namespaces {', '.join(namespaces[:10])}",)
    finish(span, out, shape)
    out.framework = dispatch.framework
    if span.dropped:
        mark_cut(span, out)
    return out
