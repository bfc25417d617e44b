"""OTLP/gRPC receiver on grpc.aio: TraceService/Export.

The method is registered with a generic handler taking raw bytes rather than through the
generated servicer, so that an undecodable request is answered INVALID_ARGUMENT and counted
(the generated stub would fail inside gRPC, uncounted). Throttling follows the OTLP spec:
RESOURCE_EXHAUSTED (overloaded) or UNAVAILABLE (shutting down) with a google.rpc.RetryInfo in
the status details, which the OTel SDK exporters and the Collector honour.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_plumb.receive.otlp import ReceivedRequest
from otel_plumb.receive.sink import SpanSink, Throttled

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


def retry_status(exc: Throttled) -> tuple[grpc.StatusCode, str, tuple[tuple[str, bytes], ...]]:
    """Code, message and trailing metadata of a throttling answer carrying RetryInfo."""
    info = error_details_pb2.RetryInfo()
    info.retry_delay.CopyFrom(Duration(seconds=int(exc.retry_after), nanos=int(exc.retry_after % 1 * 1e9)))
    status = status_pb2.Status(
        code=code_pb2.RESOURCE_EXHAUSTED if exc.overloaded else code_pb2.UNAVAILABLE, message=exc.reason
    )
    status.details.add().Pack(info)
    standard = rpc_status.to_status(status)
    # Also the bare RetryInfo header the OTel Python exporter reads.
    metadata = (*standard.trailing_metadata, ("google.rpc.retryinfo-bin", info.SerializeToString()))
    return standard.code, standard.details, metadata


def trace_service_handler(sink: SpanSink, receiver: str = "grpc") -> grpc.GenericRpcHandler[bytes, bytes]:
    async def export(raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        try:
            sink.admit()
            try:
                request = ReceivedRequest.parse(raw)
            except (DecodeError, RecursionError, MemoryError, ValueError) as exc:
                sink.malformed(receiver, str(exc) or type(exc).__name__)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not an ExportTraceServiceRequest: {exc}")
            result = await sink.ingest(request, receiver)
        except Throttled as exc:
            code, message, metadata = retry_status(exc)
            await context.abort(code, message, trailing_metadata=metadata)
        response = ExportTraceServiceResponse()
        if result.rejected_spans:
            response.partial_success.rejected_spans = result.rejected_spans
            response.partial_success.error_message = result.error_message
        return response.SerializeToString()

    handler: Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], Awaitable[bytes]] = export
    return grpc.method_handlers_generic_handler(
        SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(handler)}
    )


def server_options(
    max_message_bytes: int,
    idle_timeout: float = 60.0,
    max_connections: int = 1024,
    max_concurrent_streams: int = 100,
) -> list[tuple[str, int]]:
    """The gRPC server's channel args: message size, and connections bounded in number and
    closed when idle (GOAWAY after ``idle_timeout`` without a call; 0 keeps them). A connection
    that does not complete the HTTP/2 handshake is dropped after 10 s, or ``idle_timeout`` if
    shorter."""
    handshake_timeout = min(10.0, idle_timeout) if idle_timeout > 0 else 10.0
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # A second process on the same port must fail to start, not share the traffic.
        ("grpc.so_reuseport", 0),
        ("grpc.max_allowed_incoming_connections", max_connections),
        ("grpc.max_concurrent_streams", max_concurrent_streams),
        ("grpc.server_handshake_timeout_ms", max(1, int(handshake_timeout * 1000))),
    ]
    if idle_timeout > 0:
        options.append(("grpc.max_connection_idle_ms", max(1, int(idle_timeout * 1000))))
    return options


def create_server(
    max_message_bytes: int, interceptors: Sequence[grpc.aio.ServerInterceptor[Any, Any]] = (), **limits: float
) -> grpc.aio.Server:
    """See ``server_options`` for ``limits``; ``interceptors`` see every call (receive.auth)."""
    return grpc.aio.server(
        interceptors=list(interceptors) or None,
        options=server_options(max_message_bytes, **limits),  # type: ignore[arg-type]
    )
