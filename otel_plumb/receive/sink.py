"""What the receivers hand requests to (the processor), and how it says "not now"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from otel_plumb.receive.otlp import ReceivedRequest


class Throttled(Exception):
    """The request was not taken; the client should retry after ``retry_after`` seconds.

    ``overloaded`` is True for back-pressure (buffers or export queue full) and False while
    shutting down; the receivers map it to RESOURCE_EXHAUSTED/429 or UNAVAILABLE/503.
    """

    def __init__(self, retry_after: float, reason: str, overloaded: bool = True) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.reason = reason
        self.overloaded = overloaded


@dataclass(slots=True)
class IngestResult:
    """OTLP partial success: how many spans of the request were refused, and why."""

    rejected_spans: int = 0
    error_message: str = ""


class SpanSink(Protocol):
    def admit(self) -> None:
        """Raise Throttled if no request can be taken now. The receivers ask before decoding a
        request, so that under overload a refusal costs no decoding; ``ingest`` asks again."""
        ...

    async def ingest(self, request: ReceivedRequest, receiver: str) -> IngestResult:
        """Take every span of the request, or raise Throttled before taking any."""
        ...

    def malformed(self, receiver: str, reason: str) -> None:
        """Count a request that could not be decoded."""
        ...
