"""OTLP/HTTP receiver on aiohttp: POST /v1/traces with protobuf or JSON bodies, gzip, deflate
or zstd allowed.

Errors follow the OTLP/HTTP spec: 400 with a google.rpc.Status body for a malformed request,
413 for one over the size limit, 415 for a content type or encoding not supported, 429
(overloaded) or 503 (shutting down) with Retry-After when the processor cannot take it, and a
partial-success response when some spans were refused. Every refused request is counted as
malformed (``SpanSink.malformed``), whatever made it fail.

Bodies are read and inflated here, not by aiohttp: the compressed body is read up to the size
limit, then inflated in bounded chunks (yielding to the event loop between them) and refused
as soon as it passes the limit, so a small compressed body cannot expand past the limit nor
hold the loop. Large bodies are decoded on a worker thread, a few at a time.
"""

from __future__ import annotations

import asyncio
import io
import json
import zlib
from collections.abc import Sequence
from typing import Any

import zstandard
from aiohttp import web
from google.protobuf import json_format
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_plumb.model.text import parse_json
from otel_plumb.receive.otlp import ReceivedRequest
from otel_plumb.receive.otlp_json import parse_request
from otel_plumb.receive.sink import SpanSink, Throttled

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
ENCODINGS = ("gzip", "x-gzip", "deflate", "zstd", "identity")
# Bytes inflated per step before the event loop gets a turn.
INFLATE_CHUNK = 256 * 1024
# Bodies at least this big are decoded on a worker thread (JSON is slow to decode in Python).
THREAD_JSON_BYTES = 64 * 1024
THREAD_PROTOBUF_BYTES = 1024 * 1024
# Requests inflating or decoding at once: bounds the memory held to this many times the limit.
DECODE_CONCURRENCY = 4
# zstd frames may ask for a window this big at most (RFC 9659 asks decoders for 8 MiB).
ZSTD_MAX_WINDOW = 8 * 1024 * 1024
_REASON_CHARS = 200


class Refused(Exception):
    """A request answered with an error status; ``reason`` is short and goes to the client."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _short(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, MemoryError):
        return "out of memory decoding it"
    text = str(exc) or type(exc).__name__
    return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS] + "..."


def content_codings(header: str) -> list[str]:
    """The codings of a Content-Encoding header, in the order they were applied; 415 if unknown."""
    codings = [c.strip().lower() for c in header.split(",") if c.strip()]
    unknown = [c for c in codings if c not in ENCODINGS]
    if unknown:
        raise Refused(415, f"unsupported content encoding {unknown[0]!r} (supported: gzip, deflate, zstd, identity)")
    return [c for c in codings if c != "identity"]


async def read_raw(request: web.Request, limit: int, timeout: float) -> bytes:
    """The body as sent, refused (413) as soon as it passes ``limit`` bytes; ``timeout``: the
    longest wait for the next chunk (408 past it)."""
    if request.content_length is not None and request.content_length > limit:
        raise Refused(413, f"request body of {request.content_length} bytes is over the limit of {limit}")
    parts: list[bytes] = []
    size = 0
    while True:
        try:
            async with asyncio.timeout(timeout or None):
                chunk = await request.content.readany()
        except TimeoutError:
            raise Refused(408, f"no body data for {timeout:g}s") from None
        except Exception as exc:  # e.g. a connection lost mid-body, a bad chunked encoding
            raise Refused(400, f"unreadable body: {_short(exc)}") from exc
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"request body is over the limit of {limit} bytes")
        parts.append(chunk)


async def inflate(coding: str, data: bytes, limit: int) -> bytes:
    """``data`` decoded from ``coding``, in bounded chunks; 413 as soon as it passes ``limit``."""
    if coding == "zstd":
        return await _unzstd(data, limit)
    if coding in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    else:  # deflate: zlib-wrapped as HTTP says, or raw deflate as some clients send
        zlib_header = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
        wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
    out = bytearray()
    pending: bytes = data
    while pending:
        d = zlib.decompressobj(wbits)
        try:
            while not d.eof:
                before = len(pending)
                chunk = d.decompress(pending, min(INFLATE_CHUNK, limit + 1 - len(out)))
                pending = d.unconsumed_tail
                out += chunk
                if len(out) > limit:
                    raise Refused(413, f"request body inflates past the limit of {limit} bytes")
                if not chunk and len(pending) == before:
                    raise Refused(400, f"truncated {coding} body")
                await asyncio.sleep(0)
        except zlib.error as exc:
            raise Refused(400, f"not a valid {coding} body: {exc}") from exc
        pending = d.unused_data
        if wbits != 16 + zlib.MAX_WBITS and pending:  # gzip may have several members; deflate not
            raise Refused(400, f"data after the end of the {coding} body")
    return bytes(out)


async def _unzstd(data: bytes, limit: int) -> bytes:
    out = bytearray()
    try:
        reader = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).stream_reader(
            io.BytesIO(data), read_across_frames=True
        )
        while True:
            chunk = reader.read(min(INFLATE_CHUNK, limit + 1 - len(out)))
            if not chunk:
                return bytes(out)
            out += chunk
            if len(out) > limit:
                raise Refused(413, f"request body inflates past the limit of {limit} bytes")
            await asyncio.sleep(0)
    except zstandard.ZstdError as exc:
        raise Refused(400, f"not a valid zstd body: {exc}") from exc


def decode(raw: bytes, as_json: bool) -> ReceivedRequest:
    """The request in ``raw``; 400 with a short reason however decoding fails (RecursionError,
    MemoryError, UnicodeDecodeError, DecodeError, ...)."""
    try:
        if not as_json:
            return ReceivedRequest.parse(raw)
        obj = parse_json(raw)
        if not isinstance(obj, dict):
            raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
        return ReceivedRequest.of(parse_request(obj))
    except Exception as exc:  # any failure to decode is the client's malformed body
        raise Refused(400, f"not an ExportTraceServiceRequest: {_short(exc)}") from None


def _body(message: ExportTraceServiceResponse | status_pb2.Status, as_json: bool) -> bytes:
    if as_json:
        return json.dumps(json_format.MessageToDict(message)).encode()
    return message.SerializeToString()


def _error(status: int, code: int, message: str, as_json: bool, headers: dict[str, str] | None = None) -> web.Response:
    body = _body(status_pb2.Status(code=code, message=message), as_json)
    return web.Response(status=status, body=body, content_type=JSON if as_json else PROTOBUF, headers=headers)


_CODES = {400: code_pb2.INVALID_ARGUMENT, 408: code_pb2.DEADLINE_EXCEEDED, 413: code_pb2.RESOURCE_EXHAUSTED}


def traces_app(
    sink: SpanSink,
    max_message_bytes: int,
    receiver: str = "http",
    body_timeout: float = 60.0,
    middlewares: Sequence[Any] = (),
) -> web.Application:
    """The /v1/traces application. Serve it with ``auto_decompress=False`` (see
    ``connections.serve``): bodies are inflated here, within the limit."""
    decoding = asyncio.Semaphore(DECODE_CONCURRENCY)

    async def read_request(request: web.Request, as_json: bool) -> ReceivedRequest:
        if request.content_type not in (JSON, PROTOBUF):
            raise Refused(415, f"unsupported content type {request.content_type!r} (use {PROTOBUF} or {JSON})")
        codings = content_codings(request.headers.get("Content-Encoding", ""))
        raw = await read_raw(request, max_message_bytes, body_timeout)
        sink.admit()
        async with decoding:
            for coding in reversed(codings):
                raw = await inflate(coding, raw, max_message_bytes)
            if len(raw) >= (THREAD_JSON_BYTES if as_json else THREAD_PROTOBUF_BYTES):
                message = await asyncio.to_thread(decode, raw, as_json)
            else:
                message = decode(raw, as_json)
        return message

    async def post_traces(request: web.Request) -> web.Response:
        as_json = request.content_type == JSON
        try:
            message = await read_request(request, as_json)
            result = await sink.ingest(message, receiver)
        except Refused as exc:
            sink.malformed(receiver, exc.reason)
            refusal = _error(exc.status, _CODES.get(exc.status, code_pb2.INVALID_ARGUMENT), exc.reason, as_json)
            if exc.status in (408, 413):  # the rest of the body is not worth reading
                refusal.force_close()
            return refusal
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

    app = web.Application(client_max_size=max_message_bytes, middlewares=list(middlewares))
    app.router.add_post("/v1/traces", post_traces)
    return app
