"""A minimal OTLP/gRPC tracing backend on grpc.aio that keeps (or just counts) what it receives.

The demo sends its annotated spans here, and it stands in for Jaeger/Tempo in tests and in
``bench/live.py`` (where, with ``keep=False``, it is also the no-op receiver the processor's
throughput is compared with).
"""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_plumb.receive.grpc_server import SERVICE

_OK = ExportTraceServiceResponse().SerializeToString()


class OtlpBackend:
    def __init__(
        self, keep: bool = True, host: str = "127.0.0.1", credentials: grpc.ServerCredentials | None = None
    ) -> None:
        """``credentials``: serve over TLS (``grpc.ssl_server_credentials``), at a grpcs:// endpoint."""
        self.keep = keep
        self.host = host
        self.credentials = credentials
        self.requests: list[ExportTraceServiceRequest] = []
        self.span_count = 0
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Event()

    async def _export(self, raw: bytes, _context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        request = ExportTraceServiceRequest.FromString(raw)
        self.span_count += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        if self.keep:
            self.requests.append(request)
        self._changed.set()
        return _OK

    async def start(self, port: int | None = None) -> int:
        """Listen on ``port`` (default: the previous port, else a free one)."""
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        handler = grpc.unary_unary_rpc_method_handler(self._export)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        address = f"{self.host}:{port if port is not None else self.port}"
        if self.credentials is not None:
            self.port = server.add_secure_port(address, self.credentials)
        else:
            self.port = server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.host}:{port}")
        await server.start()
        self._server = server
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    @property
    def endpoint(self) -> str:
        return f"{'grpcs' if self.credentials is not None else 'grpc'}://{self.host}:{self.port}"

    def spans(self) -> list[Span]:
        return [span for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for span in ss.spans]

    async def wait_for_spans(self, count: int, timeout: float) -> bool:
        """True once at least ``count`` spans arrived; False at the deadline."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.span_count < count:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return self.span_count >= count
        return True
