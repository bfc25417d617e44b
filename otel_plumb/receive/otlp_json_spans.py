"""OTLP/JSON (a decoded ``ExportTraceServiceRequest`` object) -> SpanRecords, without protobuf.

Trace files are mostly OTLP/JSON (the Collector file exporter's default), and going through
``json_format.ParseDict`` and back out of protobuf costs ten times more than reading the
dicts. This reader accepts what protobuf's JSON parser accepts for these messages: lowerCamelCase
or proto (snake_case) field names, enum names or numbers, 64-bit integers as numbers or
strings, ``NaN``/``Infinity`` doubles, standard or URL-safe base64 bytes. Ids are hex, as
OTLP/JSON specifies, or base64 as plain proto3 JSON (and Grafana Tempo, whose ``batches`` are
read as ``resourceSpans``) writes them. Unknown fields are ignored. A span that cannot be read is reported on its
own, and the other spans of the request are kept.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Any, Final

from otel_plumb.model.span import SpanEvent, SpanRecord

_KINDS = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
_STATUS_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_HEX = frozenset("0123456789abcdefABCDEF")
# What a span with values of the wrong shape raises while being read.
_SPAN_ERRORS = (TypeError, ValueError, AttributeError, KeyError, binascii.Error, OverflowError, RecursionError)
_DOUBLE_WORDS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def request_spans(obj: dict[str, Any]) -> Iterator[SpanRecord | str]:
    """The spans of one request; a span (or resource) that cannot be read yields a message."""
    for rs in _list(obj, "resourceSpans", "resource_spans") or _list(obj, "batches", "batches"):
        try:
            resource_obj = _dict(rs, "resource", "resource")
            resource = attributes(resource_obj.get("attributes"))
            scopes = _list(rs, "scopeSpans", "scope_spans") or _list(
                rs, "instrumentationLibrarySpans", "instrumentation_library_spans"
            )
        except (TypeError, ValueError, AttributeError, binascii.Error) as exc:
            yield f"resourceSpans: {exc}"
            continue
        for ss in scopes:
            try:
                scope = _dict(ss, "scope", "scope") or _dict(ss, "instrumentationLibrary", "instrumentation_library")
                scope_name = _str(scope.get("name"), "scope.name")
                spans = _list(ss, "spans", "spans")
            except (TypeError, ValueError, AttributeError) as exc:
                yield f"scopeSpans: {exc}"
                continue
            for span in spans:
                try:
                    yield span_record(span, resource, scope_name)
                except _SPAN_ERRORS as exc:
                    name = span.get("name") if isinstance(span, dict) else None
                    yield f"span {name!r}: {exc}"


def span_record(span: dict[str, Any], resource: dict[str, Any], scope_name: str) -> SpanRecord:
    g = span.get
    status = _first(g("status"), None) or {}
    if not isinstance(status, dict):
        raise ValueError(f"status is not an object: {status!r}")
    raw_events = _first(g("events"), None)
    events = [_event(e) for e in raw_events] if raw_events else None
    parent = _first(g("parentSpanId"), g("parent_span_id"))
    return SpanRecord(
        _hex(_first(g("traceId"), g("trace_id")), 32, "traceId"),
        _hex(_first(g("spanId"), g("span_id")), 16, "spanId"),
        _hex(parent, 16, "parentSpanId") if parent else None,
        _str(g("name"), "name"),
        kind=_enum(g("kind"), _KINDS, "kind"),
        start_ns=_int(_first(g("startTimeUnixNano"), g("start_time_unix_nano")), "startTimeUnixNano"),
        end_ns=_int(_first(g("endTimeUnixNano"), g("end_time_unix_nano")), "endTimeUnixNano"),
        status_code=_enum(status.get("code"), _STATUS_CODES, "status.code"),
        status_message=_str(status.get("message"), "status.message"),
        attributes=attributes(g("attributes")),
        events=events,
        resource=resource,
        scope_name=scope_name,
        dropped=_dropped(span) + sum(_dropped(e) for e in raw_events) if raw_events else _dropped(span),
    )


def _dropped(item: dict[str, Any]) -> int:
    """What the SDK dropped from a span or an event (its attribute and event count limits)."""
    g = item.get
    total = 0
    for camel, snake in _DROPPED_KEYS:
        n = _int(_first(g(camel), g(snake)), camel)
        if n < 0:
            raise ValueError(f"{camel} is negative: {n}")
        total += n
    return total


_DROPPED_KEYS: Final[tuple[tuple[str, str], ...]] = (
    ("droppedAttributesCount", "dropped_attributes_count"),
    ("droppedEventsCount", "dropped_events_count"),
)


def attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if kvs is None:
        return out
    if not isinstance(kvs, list):
        raise ValueError(f"attributes is not a list: {type(kvs).__name__}")
    for kv in kvs:
        key = kv.get("key", "")  # proto3 JSON leaves out an empty key
        if type(key) is not str:
            raise ValueError(f"attribute key is not a string: {key!r}")
        value = kv.get("value")
        # The hot path: plain strings, read without a call.
        s = value.get("stringValue") if type(value) is dict else None
        out[key] = s if type(s) is str else any_value(value)
    return out


def any_value(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"attribute value is not an object: {value!r}")
    for field, v in value.items():
        if field in ("stringValue", "string_value"):
            return _str(v, field)
        if field in ("intValue", "int_value"):
            return _int(v, field)
        if field in ("boolValue", "bool_value"):
            if type(v) is not bool:
                raise ValueError(f"{field} is not a boolean: {v!r}")
            return v
        if field in ("doubleValue", "double_value"):
            return _double(v, field)
        if field in ("bytesValue", "bytes_value"):
            return _bytes(v, field)
        if field in ("arrayValue", "array_value"):
            return [any_value(x) for x in _list(v or {}, "values", "values")]
        if field in ("kvlistValue", "kvlist_value"):
            return attributes(_list(v or {}, "values", "values"))
    return None


def _event(e: Any) -> SpanEvent:
    if not isinstance(e, dict):
        raise ValueError(f"event is not an object: {e!r}")
    return SpanEvent(
        _str(e.get("name"), "event name"),
        _int(_first(e.get("timeUnixNano"), e.get("time_unix_nano")), "event timeUnixNano"),
        attributes(e.get("attributes")),
    )


def _first(a: Any, b: Any) -> Any:
    return b if a is None else a


def _list(obj: Any, camel: str, snake: str) -> list[Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"expected an object, got {type(obj).__name__}")
    value = _first(obj.get(camel), obj.get(snake))
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{camel} is not a list")
    return value


def _dict(obj: Any, camel: str, snake: str) -> dict[str, Any]:
    value = _first(obj.get(camel), obj.get(snake))
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{camel} is not an object")
    return value


def _str(value: Any, what: str) -> str:
    if value is None:
        return ""
    if type(value) is not str:
        raise ValueError(f"{what} is not a string: {value!r}")
    return value


def _int(value: Any, what: str) -> int:
    if type(value) is int:
        return value
    if value is None:
        return 0
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    elif isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError(f"{what} is not an integer: {value!r}")


def _double(value: Any, what: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        word = _DOUBLE_WORDS.get(value)
        if word is not None:
            return word
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError(f"{what} is not a number: {value!r}")


def _bytes(value: Any, what: str) -> bytes:
    if type(value) is not str:
        raise ValueError(f"{what} is not base64 text: {value!r}")
    padded = value + "=" * (-len(value) % 4)
    if "-" in value or "_" in value:
        return base64.urlsafe_b64decode(padded)
    return base64.b64decode(padded, validate=True)


def _enum(value: Any, names: dict[str, int], what: str) -> int:
    if type(value) is int:
        return value
    if value is None:
        return 0
    if isinstance(value, str):
        number = names.get(value)
        if number is not None:
            return number
        if value.lstrip("-").isdigit():
            return int(value)
    raise ValueError(f"{what}: unknown value {value!r}")


def _hex(value: Any, width: int, what: str) -> str:
    if type(value) is str:
        if len(value) == width and _HEX.issuperset(value):
            return value.lower()
        # base64 of the id's bytes: 24 characters for a trace id, 12 for a span id
        if len(value) == (width // 2 + 2) // 3 * 4:
            try:
                raw = base64.b64decode(value, altchars=b"-_", validate=True)
            except binascii.Error:
                raw = b""
            if len(raw) == width // 2:
                return raw.hex()
    raise ValueError(f"{what} is not {width} hex digits: {value!r}")
