"""Pick the convention a span follows and read it. (Minimal: OTel GenAI execute_tool only.)"""

from __future__ import annotations

import json
from typing import Any

from otel_plumb.model.span import STATUS_ERROR, SpanRecord
from otel_plumb.model.trajectory import NormalisedSpan


def normalise(span: SpanRecord) -> NormalisedSpan:
    a = span.attributes
    out = NormalisedSpan(
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent_span_id,
        span_name=span.name,
        start_ns=span.start_ns,
        end_ns=span.end_ns,
        kind="other",
        name=span.name,
        convention="unknown",
    )
    if a.get("gen_ai.operation.name") == "execute_tool":
        out.kind, out.convention = "tool", "otel_genai"
        out.name = str(a.get("gen_ai.tool.name", span.name))
        raw: Any = a.get("gen_ai.tool.call.arguments")
        if isinstance(raw, str):
            out.args, out.args_status, out.args_source = json.loads(raw), "captured", "gen_ai.tool.call.arguments"
    if span.status_code == STATUS_ERROR:
        out.error = span.status_message or "error"
    return out
