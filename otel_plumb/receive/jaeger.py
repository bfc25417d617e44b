"""Jaeger JSON (the UI's "Download JSON" and the query API's ``/api/traces`` form) -> SpanRecord.

One trace is ``{"traceID", "spans": [...], "processes": {...}}``; spans carry ``tags``, ``logs``
and ``references``. The OpenTelemetry-specific tags Jaeger uses to store what it has no field
for (``span.kind``, ``otel.status_code``, ``otel.scope.name``...) are mapped back to span fields,
as the Collector's Jaeger translator does.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from typing import Any

from otel_plumb.model.span import STATUS_ERROR, STATUS_OK, STATUS_UNSET, SpanEvent, SpanRecord

_HEX = frozenset("0123456789abcdef")
# What values of the wrong shape raise while a span is read.
_ERRORS = (TypeError, ValueError, AttributeError, KeyError, OverflowError)
_KINDS = {"internal": 1, "server": 2, "client": 3, "producer": 4, "consumer": 5}
_STATUS = {"OK": STATUS_OK, "ERROR": STATUS_ERROR, "UNSET": STATUS_UNSET}
# Tags that hold span fields rather than attributes.
_FIELD_TAGS = frozenset(
    {
        "span.kind",
        "otel.status_code",
        "otel.status_description",
        "otel.scope.name",
        "otel.scope.version",
        "otel.library.name",
        "otel.library.version",
        "internal.span.format",
    }
)


def is_jaeger_trace(obj: Mapping[str, Any]) -> bool:
    return isinstance(obj.get("spans"), list) and ("traceID" in obj or "processes" in obj)


def trace_records(trace: Mapping[str, Any]) -> Iterator[SpanRecord | str]:
    """The spans of one Jaeger trace; a span (or process) that cannot be read yields a message instead."""
    processes: dict[str, dict[str, Any]] = {}
    raw_processes = trace.get("processes")
    if isinstance(raw_processes, Mapping):
        for pid, proc in raw_processes.items():
            try:
                processes[pid] = _process_resource(proc)
            except _ERRORS as exc:
                yield f"Jaeger process {pid!r}: {exc}"
    for i, span in enumerate(trace.get("spans") or ()):
        try:
            yield _span_record(span, processes, trace.get("traceID"))
        except _ERRORS as exc:
            yield f"Jaeger span #{i}: {exc}"


def _process_resource(proc: Mapping[str, Any]) -> dict[str, Any]:
    resource = tags_dict(proc.get("tags") or ())
    if proc.get("serviceName") is not None:
        resource["service.name"] = str(proc["serviceName"])
    return resource


def tags_dict(tags: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tag in tags:
        out[str(tag["key"])] = _tag_value(tag)
    return out


def _tag_value(tag: Mapping[str, Any]) -> Any:
    value = tag.get("value")
    kind = str(tag.get("type", "string")).lower()
    if kind == "int64":
        return int(value)  # type: ignore[arg-type]
    if kind == "float64":
        return float(value)  # type: ignore[arg-type]
    if kind == "bool":
        return value if isinstance(value, bool) else str(value).lower() == "true"
    if kind == "binary" and isinstance(value, str):
        return base64.b64decode(value)
    return value


def _hex_id(value: Any, width: int, what: str) -> str:
    text = str(value or "").lower()
    if not text or len(text) > width or not all(c in _HEX for c in text):
        raise ValueError(f"{what} {value!r} is not an id of at most {width} hex digits")
    return text.rjust(width, "0")


def _span_record(span: Mapping[str, Any], processes: dict[str, dict[str, Any]], trace_id: Any) -> SpanRecord:
    tid = _hex_id(span.get("traceID") or trace_id, 32, "traceID")
    parent = None
    refs = span.get("references") or ()
    # The parent is the CHILD_OF reference; a span with only FOLLOWS_FROM links hangs from that.
    for ref_type in ("CHILD_OF", "FOLLOWS_FROM"):
        ref = next((r for r in refs if str(r.get("refType", "")).upper() == ref_type), None)
        if ref is not None:
            parent = _hex_id(ref.get("spanID"), 16, "parent spanID")
            break
    if parent is None and span.get("parentSpanID"):
        parent = _hex_id(span["parentSpanID"], 16, "parentSpanID")

    attributes = tags_dict(span.get("tags") or ())
    kind = _KINDS.get(str(attributes.get("span.kind", "")).lower(), 0)
    status_code = _STATUS.get(str(attributes.get("otel.status_code", "")).upper(), STATUS_UNSET)
    if attributes.get("error") is True:
        status_code = STATUS_ERROR
        del attributes["error"]
    status_message = str(attributes.get("otel.status_description", ""))
    scope_name = str(attributes.get("otel.scope.name", attributes.get("otel.library.name", "")))
    for key in _FIELD_TAGS.intersection(attributes):
        del attributes[key]

    start_us = int(span.get("startTime") or 0)
    duration_us = int(span.get("duration") or 0)
    events = []
    for log in span.get("logs") or ():
        fields = tags_dict(log.get("fields") or ())
        name = str(fields.pop("event", "log"))
        events.append(SpanEvent(name, int(log.get("timestamp") or 0) * 1000, fields))
    resource = processes.get(str(span.get("processID", "")))
    if resource is None and isinstance(span.get("process"), Mapping):
        resource = _process_resource(span["process"])
    return SpanRecord(
        tid,
        _hex_id(span.get("spanID"), 16, "spanID"),
        parent,
        str(span.get("operationName", "")),
        kind=kind,
        start_ns=start_us * 1000,
        end_ns=(start_us + duration_us) * 1000,
        status_code=status_code,
        status_message=status_message,
        attributes=attributes,
        events=events,
        resource=resource,
        scope_name=scope_name,
    )
