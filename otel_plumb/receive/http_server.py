"""OTLP/HTTP receiver on aiohttp: POST /v1/traces with protobuf or JSON bodies, gzip allowed.

Errors follow the OTLP/HTTP spec: 400 with a google.rpc.Status body for a malformed request,
429 (overloaded) or 503 (shutting down) with Retry-After when the processor cannot take it,
and a partial-success response when some spans were refused.
"""

from __future__ import annotations

import json

from aiohttp import ClientPayloadError, web
from aiohttp.web_protocol import RequestPayloadError
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_plumb.receive.otlp_json import parse_request
from otel_plumb.receive.sink import SpanSink, Throttled

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


def _body(message: ExportTraceServiceResponse | status_pb2.Status, as_json: bool) -> bytes:
    if as_json:
        return json.dumps(json_format.MessageToDict(message)).encode()
    return message.SerializeToString()


def _error(status: int, code: int, message: str, as_json: bool, headers: dict[str, str] | None = None) -> web.Response:
    body = _body(status_pb2.Status(code=code, message=message), as_json)
    return web.Response(status=status, body=body, content_type=JSON if as_json else PROTOBUF, headers=headers)


def traces_app(sink: SpanSink, max_message_bytes: int, receiver: str = "http") -> web.Application:
    async def post_traces(request: web.Request) -> web.Response:
        as_json = request.content_type == JSON
        if request.content_type not in (JSON, PROTOBUF):
            return _error(415, code_pb2.INVALID_ARGUMENT, f"unsupported content type {request.content_type}", as_json)
        # aiohttp inflates gzip/deflate bodies itself and stops at client_max_size (413), so a
        # small compressed body cannot expand past the message size limit.
        try:
            raw = await request.read()
        except (ClientPayloadError, RequestPayloadError) as exc:  # e.g. a body that is not the gzip it claims
            sink.malformed(receiver, str(exc))
            return _error(400, code_pb2.INVALID_ARGUMENT, f"unreadable body: {exc}", as_json)
        try:
            message = parse_request(json.loads(raw)) if as_json else ExportTraceServiceRequest.FromString(raw)
        except (DecodeError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            sink.malformed(receiver, str(exc))
            return _error(400, code_pb2.INVALID_ARGUMENT, f"not an ExportTraceServiceRequest: {exc}", as_json)
        try:
            result = await sink.ingest(message, receiver, None if as_json else raw)
        except Throttled as exc:
            retry_after = str(max(1, round(exc.retry_after)))
            return _error(
                429 if exc.overloaded else 503,
                code_pb2.RESOURCE_EXHAUSTED if exc.overloaded else code_pb2.UNAVAILABLE,
                exc.reason,
                as_json,
                {"Retry-After": retry_after},
            )
        response = ExportTraceServiceResponse()
        if result.rejected_spans:
            response.partial_success.rejected_spans = result.rejected_spans
            response.partial_success.error_message = result.error_message
        return web.Response(body=_body(response, as_json), content_type=JSON if as_json else PROTOBUF)

    app = web.Application(client_max_size=max_message_bytes)
    app.router.add_post("/v1/traces", post_traces)
    return app
