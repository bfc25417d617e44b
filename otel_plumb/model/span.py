"""A span as received, whatever the input format (OTLP protobuf, OTLP/JSON, Jaeger JSON)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

# OTLP Span.SpanKind and Status.StatusCode numbers, kept as ints (as on the wire).
SPAN_KIND_NAMES: Final[tuple[str, ...]] = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
SPAN_KIND_SERVER: Final = 2
SPAN_KIND_CLIENT: Final = 3
STATUS_UNSET: Final = 0
STATUS_OK: Final = 1
STATUS_ERROR: Final = 2


class SpanEvent:
    __slots__ = ("attributes", "name", "time_ns")

    def __init__(self, name: str, time_ns: int, attributes: dict[str, Any]) -> None:
        self.name = name
        self.time_ns = time_ns
        self.attributes = attributes

    def __repr__(self) -> str:
        return f"SpanEvent({self.name!r}, {self.time_ns}, {self.attributes!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by its fields, so that the compiled class and the plain one read each other's.
        return SpanEvent, (self.name, self.time_ns, self.attributes)


class SpanRecord:
    """One span. Ids are lowercase hex; attribute values are plain Python values
    (str, int, float, bool, bytes, list, dict), decoded from OTLP ``AnyValue``. ``dropped``: how
    many attributes and events the SDK dropped from it (its span limits), its events' dropped
    attributes included: what the span holds may be cut."""

    __slots__ = (
        "attributes",
        "dropped",
        "end_ns",
        "events",
        "kind",
        "name",
        "parent_span_id",
        "resource",
        "scope_name",
        "span_id",
        "start_ns",
        "status_code",
        "status_message",
        "trace_id",
    )

    def __init__(
        self,
        trace_id: str,
        span_id: str,
        parent_span_id: str | None,
        name: str,
        *,
        kind: int = 0,
        start_ns: int = 0,
        end_ns: int = 0,
        status_code: int = STATUS_UNSET,
        status_message: str = "",
        attributes: dict[str, Any] | None = None,
        events: list[SpanEvent] | None = None,
        resource: Mapping[str, Any] | None = None,
        scope_name: str = "",
        dropped: int = 0,
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = parent_span_id or None
        self.name = name
        self.kind = kind
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.status_code = status_code
        self.status_message = status_message
        self.attributes = attributes if attributes is not None else {}
        self.events = events if events is not None else []
        # Shared by all spans of one ResourceSpans: never mutate.
        self.resource: Mapping[str, Any] = resource if resource is not None else {}
        self.scope_name = scope_name
        self.dropped = dropped

    @property
    def is_root(self) -> bool:
        return self.parent_span_id is None

    def __repr__(self) -> str:
        return f"SpanRecord({self.name!r}, trace={self.trace_id}, span={self.span_id})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by its fields, so that the compiled class and the plain one read each other's.
        return decoded, (
            self.trace_id, self.span_id, self.parent_span_id, self.name, self.kind, self.start_ns, self.end_ns,
            self.status_code, self.status_message, self.attributes, self.events, self.resource, self.scope_name,
            self.dropped,
        )  # fmt: skip


# 60 bits of the hash: an int below 2**60 is two 30-bit digits (32 bytes), a full hash three (48
# with the allocator's rounding), and one is kept per buffered span.
_FINGERPRINT_MASK: Final = (1 << 60) - 1
# The fingerprint of a span whose content is not known (remembered across a restart by its ids
# only: ``hash`` of text differs from one process to the next). No span's fingerprint is negative.
UNKNOWN_FINGERPRINT: Final = -1


def fingerprint(span: SpanRecord) -> int:
    """What tells a resent copy of a span from a different span with the same ids. Cheap on
    purpose (it runs for every span): name, times, status, attribute keys and event count.
    (The compiled decoder works it out as it reads each span, the same way.)"""
    return _FINGERPRINT_MASK & hash(
        (span.name, span.start_ns, span.end_ns, span.status_code, span.status_message, tuple(span.attributes),
         len(span.events))
    )  # fmt: skip


def decoded(
    trace_id: str, span_id: str, parent_span_id: str | None, name: str, kind: int, start_ns: int, end_ns: int,
    status_code: int, status_message: str, attributes: dict[str, Any], events: list[SpanEvent],
    resource: Mapping[str, Any], scope_name: str, dropped: int,
) -> SpanRecord:  # fmt: skip
    """A record from every field, by position: how the compiled decoder makes one when the core is
    compiled too (a compiled class's fields are no slots it can fill, and a call of the class
    would match keyword arguments for every span)."""
    return SpanRecord(
        trace_id, span_id, parent_span_id, name, kind=kind, start_ns=start_ns, end_ns=end_ns,
        status_code=status_code, status_message=status_message, attributes=attributes, events=events,
        resource=resource, scope_name=scope_name, dropped=dropped,
    )  # fmt: skip
