"""Pick the convention a span follows and read it.

Dispatch is a few dict lookups, not a trial of every reader: first the instrumentation scope
(frameworks that emit GenAI-shaped spans with their own extras), then marker attributes that
only one convention writes, in order, then well-known span names. A span matching nothing is
kept as kind ``other`` with convention ``unknown``.
"""

from __future__ import annotations

from otel_plumb.model.span import SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan
from otel_plumb.normalise import genai
from otel_plumb.normalise.common import Reader, base, finish

BY_SCOPE: dict[str, Reader] = {}

# (attribute, reader), most specific first: e.g. MCP spans also carry gen_ai.* attributes.
MARKERS: tuple[tuple[str, Reader], ...] = (
    ("gen_ai.operation.name", genai.read),
    ("gen_ai.tool.name", genai.read),
    ("gen_ai.request.model", genai.read),
)

BY_SPAN_NAME: dict[str, Reader] = {}


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
