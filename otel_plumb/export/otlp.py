"""OTLP span export (gRPC or HTTP) from the on-disk queue, with retries and backoff.

Every batch is written to the SQLite queue before it counts as accepted, kept in a bounded
in-memory window for sending, and deleted only when the backend acknowledged it. Transient
failures (gRPC UNAVAILABLE, RESOURCE_EXHAUSTED, ...; HTTP 429/502/503/504; connection errors)
are retried with exponential backoff and jitter, honouring the backend's RetryInfo or
Retry-After; permanent refusals are counted as dropped, never retried forever.

The requests are the processor's own serialised ``ExportTraceServiceRequest`` bytes: the SDK's
OTLP exporters take SDK spans, not received protobuf spans, so only the wire protocol is shared
with them (the TraceService method over grpc.aio, and the ``/v1/traces`` POST over aiohttp).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gzip
import logging
import random
import time
from collections import deque
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import aiohttp
import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_plumb.export.metrics import Metrics
from otel_plumb.export.queue import DiskQueue
from otel_plumb.processor.config import OtlpExporterConfig, parse_hostport

log = logging.getLogger("otel_plumb.export")

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_RETRYABLE_GRPC = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
_RETRYABLE_HTTP = frozenset({429, 502, 503, 504})


class StateDirInUse(RuntimeError):
    """Another processor holds the same state directory: two senders would send every batch twice."""


@dataclass(slots=True)
class _Batch:
    batch_id: int
    body: bytes
    spans: int


@dataclass(slots=True)
class _Outcome:
    ok: bool
    retry: bool = False
    delay: float | None = None
    rejected: int = 0
    message: str = ""


def retry_delay_from_grpc(metadata: object) -> float | None:
    """The backend's RetryInfo, from google.rpc.Status details or the bare retryinfo header."""
    items: tuple[tuple[str, bytes], ...] = tuple(metadata or ())  # type: ignore[arg-type]
    for key, value in items:
        info = error_details_pb2.RetryInfo()
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(info.DESCRIPTOR):
                    detail.Unpack(info)
                    return float(info.retry_delay.ToTimedelta().total_seconds())
        elif key == "google.rpc.retryinfo-bin":
            info.ParseFromString(value)
            return float(info.retry_delay.ToTimedelta().total_seconds())
    return None


def retry_after_seconds(header: str | None) -> float | None:
    if not header:
        return None
    if header.strip().isdigit():
        return float(header.strip())
    try:
        return max(0.0, parsedate_to_datetime(header).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class OtlpExporter:
    def __init__(self, config: OtlpExporterConfig, metrics: Metrics, name: str = "otlp") -> None:
        self.config = config
        self.name = name
        self._metrics = metrics
        self._state_dir = Path(config.state_dir)
        self._queue = DiskQueue(self._state_dir / f"{name}-queue.sqlite")
        self._lock_file: IO[str] | None = None
        self._mem: deque[_Batch] = deque()
        self._mem_spans = 0
        self._inflight_spans = 0
        self._loaded_upto = 0
        # Spans accepted (on disk) and not yet acknowledged by the backend.
        self.queued_spans = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._load_lock = asyncio.Lock()
        self._senders: list[asyncio.Task[None]] = []
        self._channel: grpc.aio.Channel | None = None
        self._export: grpc.aio.UnaryUnaryMultiCallable[bytes, ExportTraceServiceResponse] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._url = ""
        self._gauge = metrics.export_queue.labels(name)

    @property
    def full(self) -> bool:
        return self.queued_spans >= self.config.queue.max_spans

    async def start(self) -> None:
        self._state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self._state_dir / f"{self.name}.lock", "w")  # noqa: SIM115 - held for the process life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self._lock_file.close()
            self._lock_file = None
            raise StateDirInUse(f"state directory {self._state_dir} is used by another otel-plumb process") from exc
        first, batches, spans = await self._queue.open()
        self._loaded_upto = first - 1
        self.queued_spans = spans
        self._update_gauge()
        if batches:
            log.info("export queue: %d spans in %d batches waiting from a previous run", spans, batches)
        scheme, _, rest = self.config.endpoint.partition("://")
        if scheme in ("grpc", "grpcs"):
            host, port = parse_hostport(rest.rstrip("/"))
            target = f"{host}:{port}"
            options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
            if scheme == "grpcs":
                self._channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(), options=options)
            else:
                self._channel = grpc.aio.insecure_channel(target, options=options)
            # Bytes in (already serialised, as stored on disk), the response decoded.
            self._export = self._channel.unary_unary(
                EXPORT_METHOD, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
            )
        else:
            # The OTLP/HTTP convention: a bare host:port means its /v1/traces.
            url = urlsplit(self.config.endpoint)
            self._url = url._replace(path=url.path if url.path.strip("/") else "/v1/traces").geturl()
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.timeout))
        self._senders = [asyncio.create_task(self._sender()) for _ in range(self.config.queue.concurrency)]
        self._wake.set()

    async def submit(
        self,
        batches: list[tuple[bytes, int]],
        done: list[tuple[int, bytes]] | None = None,
        released: list[int] | None = None,
    ) -> None:
        """Accept serialised requests (body, span count): on disk when this returns. ``done`` and
        ``released`` update the receive journal in the same transaction (see DiskQueue.put)."""
        ids = await self._queue.put(batches, done or [], released or [])
        for batch_id, (body, spans) in zip(ids, batches, strict=True):
            self.queued_spans += spans
            # Kept in memory only when every earlier batch is there too, so that the loader can
            # find the rest on disk in id order.
            if batch_id == self._loaded_upto + 1 and self._mem_spans + spans <= self.config.queue.memory_spans:
                self._mem.append(_Batch(batch_id, body, spans))
                self._mem_spans += spans
                self._loaded_upto = batch_id
        self._drained.clear()
        self._update_gauge()
        self._wake.set()

    async def journal(self, body: bytes) -> int:
        """Journal a received request until its spans are queued for export; returns its id."""
        return await self._queue.journal(body)

    async def release(self, journal_ids: list[int]) -> None:
        await self._queue.release(journal_ids)

    async def journaled(self) -> list[tuple[int, bytes, set[bytes]]]:
        return await self._queue.journaled()

    async def flush(self, timeout: float) -> bool:
        """Wait until the backend acknowledged everything accepted; False on timeout."""
        if self.queued_spans == 0:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), timeout)
        return self.queued_spans == 0

    async def stop(self) -> None:
        for task in self._senders:
            task.cancel()
        for task in self._senders:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._senders = []
        if self._channel is not None:
            await self._channel.close(None)
        if self._session is not None:
            await self._session.close()
        await self._queue.close()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
        if self.queued_spans:
            log.warning("export queue: %d spans left on disk for the next start", self.queued_spans)

    def _update_gauge(self) -> None:
        self._gauge.set(self.queued_spans)

    async def _take(self) -> _Batch:
        while True:
            if self._mem:
                batch = self._mem.popleft()
                self._mem_spans -= batch.spans
                self._inflight_spans += batch.spans
                return batch
            if self.queued_spans > self._inflight_spans:
                async with self._load_lock:
                    if not self._mem:
                        await self._load()
                if self._mem:
                    continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 1.0)

    async def _load(self) -> None:
        rows = await self._queue.load(self._loaded_upto, self.config.queue.memory_spans)
        for batch_id, body, spans in rows:
            if batch_id > self._loaded_upto:
                self._mem.append(_Batch(batch_id, body, spans))
                self._mem_spans += spans
                self._loaded_upto = batch_id

    async def _sender(self) -> None:
        while True:
            batch = await self._take()
            try:
                await self._deliver(batch)
            finally:
                self._inflight_spans -= batch.spans

    async def _deliver(self, batch: _Batch) -> None:
        retry = self.config.retry
        attempt = 0
        while True:
            outcome = await self._send(batch.body)
            if outcome.ok or not outcome.retry:
                break
            self._metrics.export_spans.labels(self.name, "retried").inc(batch.spans)
            wait = min(retry.max_interval, retry.initial_interval * retry.multiplier**attempt)
            wait *= random.uniform(1 - retry.jitter, 1 + retry.jitter)
            if outcome.delay is not None:
                wait = min(max(outcome.delay, 0.0), retry.max_interval)
            attempt += 1
            log.warning(
                "export to %s failed (%s); retry %d in %.2fs", self.config.endpoint, outcome.message, attempt, wait
            )
            await asyncio.sleep(wait)
        rejected = batch.spans if not outcome.ok else min(outcome.rejected, batch.spans)
        if rejected:
            log.error("backend refused %d spans: %s", rejected, outcome.message)
            self._metrics.export_spans.labels(self.name, "rejected").inc(rejected)
            self._metrics.spans_dropped.labels("export_rejected").inc(rejected)
        if batch.spans - rejected:
            self._metrics.export_spans.labels(self.name, "sent").inc(batch.spans - rejected)
        await self._queue.delete(batch.batch_id)
        self.queued_spans -= batch.spans
        self._update_gauge()
        if self.queued_spans == 0:
            self._drained.set()

    async def _send(self, body: bytes) -> _Outcome:
        headers = self.config.headers
        if self._export is not None:
            metadata = tuple((k.lower(), v) for k, v in headers.items())
            try:
                response = await self._export(
                    body,
                    timeout=self.config.timeout,
                    metadata=metadata,
                    compression=grpc.Compression.Gzip if self.config.compression == "gzip" else None,
                )
            except grpc.aio.AioRpcError as exc:
                return _Outcome(
                    ok=False,
                    retry=exc.code() in _RETRYABLE_GRPC,
                    delay=retry_delay_from_grpc(exc.trailing_metadata()),
                    message=f"{exc.code().name}: {exc.details()}",
                )
            ps = response.partial_success
            return _Outcome(ok=True, rejected=ps.rejected_spans, message=ps.error_message)
        assert self._session is not None
        http_headers = {"Content-Type": "application/x-protobuf", **headers}
        data = body
        if self.config.compression == "gzip":
            data = gzip.compress(body, compresslevel=1)
            http_headers["Content-Encoding"] = "gzip"
        try:
            async with self._session.post(self._url, data=data, headers=http_headers) as resp:
                payload = await resp.read()
                if 200 <= resp.status < 300:
                    partial = ExportTraceServiceResponse.FromString(payload).partial_success
                    return _Outcome(ok=True, rejected=partial.rejected_spans, message=partial.error_message)
                return _Outcome(
                    ok=False,
                    retry=resp.status in _RETRYABLE_HTTP,
                    delay=retry_after_seconds(resp.headers.get("Retry-After")),
                    message=f"HTTP {resp.status}",
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _Outcome(ok=False, retry=True, message=f"{type(exc).__name__}: {exc}")
        except DecodeError as exc:  # a 2xx we cannot read: not an OTLP backend's answer, try again later
            return _Outcome(ok=False, retry=True, message=f"unreadable response: {exc}")
