"""OTLP span export (gRPC or HTTP) from the on-disk queue, with retries and backoff.

Every batch is written to the on-disk queue before it counts as accepted, kept in a bounded
in-memory window for sending, and deleted only when the backend acknowledged it. Transient
failures (gRPC UNAVAILABLE, RESOURCE_EXHAUSTED, ...; HTTP 429/502/503/504; connection errors)
are retried with exponential backoff and jitter, honouring the backend's RetryInfo or
Retry-After; permanent refusals are counted as dropped, never retried forever. A batch the
backend refuses as too large (gRPC RESOURCE_EXHAUSTED without RetryInfo, HTTP 413) is halved
and the halves sent; a single span still refused, or a batch still failing after
``retry.max_elapsed_time``, is given up as a dead letter: counted, and appended to the
dead-letter file when one is configured. No error of a send stops a sender: whatever fails is
logged (at a bounded rate), counted, and the batch is tried again.

Storage failures (a full disk, an I/O error) raise ``StorageError`` to the caller, are counted
in ``plumb_storage_errors_total{operation}`` and make ``storage_ok`` false until a periodic test
write succeeds again.

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
import sqlite3
import struct
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

from otel_plumb import tls
from otel_plumb.configtypes import parse_hostport
from otel_plumb.export.annotate import halve_request, split_request
from otel_plumb.export.config import OtlpExporterConfig
from otel_plumb.export.metrics import Metrics
from otel_plumb.export.queue import DiskQueue
from otel_plumb.ratelimit import RateLimitedLog

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
# While storage is failing, how often a test write is tried.
STORAGE_PROBE_INTERVAL_S = 1.0


class StateDirInUse(RuntimeError):
    """Another processor holds the same state directory: two senders would send every batch twice."""


class StorageError(RuntimeError):
    """A write or read of the on-disk queue or journal failed (disk full, I/O error); retryable."""

    def __init__(self, operation: str, cause: BaseException) -> None:
        super().__init__(f"{operation}: {cause}")
        self.operation = operation


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
    # The backend refused the request for its size: send it in halves.
    too_large: bool = False
    # For plumb_export_errors_total: the gRPC code, HTTP status or exception.
    error: str = ""


def retry_delay_from_grpc(metadata: object) -> float | None:
    """The backend's RetryInfo, from google.rpc.Status details or the bare retryinfo header."""
    items: tuple[tuple[str, bytes], ...] = tuple(metadata or ())  # type: ignore[arg-type]
    for key, value in items:
        info = error_details_pb2.RetryInfo()
        # A trailer that does not decode says nothing about when to retry: ignored.
        try:
            if key == "grpc-status-details-bin":
                status = status_pb2.Status.FromString(value)
                for detail in status.details:
                    if detail.Is(info.DESCRIPTOR):
                        detail.Unpack(info)
                        return float(info.retry_delay.ToTimedelta().total_seconds())
            elif key == "google.rpc.retryinfo-bin":
                info.ParseFromString(value)
                return float(info.retry_delay.ToTimedelta().total_seconds())
        except (DecodeError, TypeError, ValueError, OverflowError):
            continue
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
        # Bytes of the queued requests (on disk): bounded by queue.max_bytes like spans by max_spans.
        self.queued_bytes = 0
        # Spans accepted but not yet on disk: the caller holds them while storage is failing.
        self.held_spans = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._load_lock = asyncio.Lock()
        self._senders: list[asyncio.Task[None]] = []
        self._channel: grpc.aio.Channel | None = None
        self._export: grpc.aio.UnaryUnaryMultiCallable[bytes, ExportTraceServiceResponse] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._url = ""
        self._server_hostname: str | None = None
        self._gauge = metrics.export_queue.labels(name)
        self._log = RateLimitedLog(log)
        # Acknowledged batches whose deletion from the queue failed (retried with the next one).
        self._undeleted: list[int] = []
        self.storage_ok = True
        self._probe_task: asyncio.Task[None] | None = None
        for outcome in ("sent", "retried", "rejected", "dead_letter"):
            metrics.export_spans.labels(name, outcome)

    @property
    def full(self) -> bool:
        q = self.config.queue
        return self.queued_spans + self.held_spans >= q.max_spans or self.queued_bytes >= q.max_bytes

    async def start(self) -> None:
        # The queue holds span content: a state directory made here is readable by its owner only
        # (one that exists, a mounted volume, keeps the permissions it was given).
        self._state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock_file = open(self._state_dir / f"{self.name}.lock", "w")  # noqa: SIM115 - held for the process life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self._lock_file.close()
            self._lock_file = None
            raise StateDirInUse(f"state directory {self._state_dir} is used by another otel-plumb process") from exc
        first, batches, spans, size = await self._queue.open()
        if self._queue.moved_aside is not None:
            aside, why = self._queue.moved_aside
            self._metrics.queue_resets.inc()
            log.error(
                "EXPORT QUEUE CORRUPT: %s could not be read (%s); moved aside to %s and started a fresh queue. "
                "Its spans and journaled requests are not sent; read them from that file if it can be repaired",
                self._queue.path, why, aside,
            )  # fmt: skip
        self._loaded_upto = first - 1
        self.queued_spans = spans
        self.queued_bytes = size
        self._update_gauge()
        if batches:
            log.info("export queue: %d spans in %d batches waiting from a previous run", spans, batches)
        scheme, _, rest = self.config.endpoint.partition("://")
        if scheme in ("grpc", "grpcs"):
            host, port = parse_hostport(rest.rstrip("/"))
            target = f"{host}:{port}"
            options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
            if scheme == "grpcs":
                credentials, tls_options = tls.grpc_channel_credentials(self.config.tls, "exporters.otlp.tls")
                self._channel = grpc.aio.secure_channel(target, credentials, options=[*options, *tls_options])
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
            connector = None
            if url.scheme == "https":
                connector = aiohttp.TCPConnector(ssl=tls.client_context(self.config.tls, "exporters.otlp.tls"))
                self._server_hostname = self.config.tls.server_name_override if self.config.tls else None
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.timeout), connector=connector
            )
        self._senders = [asyncio.create_task(self._sender()) for _ in range(self.config.queue.concurrency)]
        self._wake.set()

    # ---- storage --------------------------------------------------------------------------------

    def _storage_failed(self, operation: str, exc: BaseException) -> StorageError:
        self._metrics.storage_errors.labels(operation).inc()
        self._log.error(
            f"storage:{operation}",
            "state directory %s: %s failed (%s: %s); requests are refused as retryable until it works again",
            self._state_dir, operation, type(exc).__name__, exc,
        )  # fmt: skip
        if self.storage_ok:
            self.storage_ok = False
            if self._probe_task is None or self._probe_task.done():
                self._probe_task = asyncio.get_running_loop().create_task(self._probe_storage())
        return StorageError(operation, exc)

    async def _probe_storage(self) -> None:
        """While storage is failing: a test write every second; the first that works ends it."""
        while not self.storage_ok:
            await asyncio.sleep(STORAGE_PROBE_INTERVAL_S)
            try:
                await self._queue.probe()
            except (sqlite3.Error, OSError) as exc:
                self._log.warning("storage:probe", "state directory %s still failing: %s", self._state_dir, exc)
                continue
            self.storage_ok = True
            log.warning("state directory %s works again", self._state_dir)

    async def submit(
        self,
        batches: list[tuple[bytes, int]],
        done: list[tuple[int, bytes]] | None = None,
        released: list[int] | None = None,
        decided: list[tuple[str, float, str]] | None = None,
    ) -> None:
        """Accept serialised requests (body, span count): on disk when this returns. ``done`` and
        ``released`` update the receive journal, and ``decided`` the decided traces' memory, in
        the same transaction (see DiskQueue.put). Raises ``StorageError`` when the write failed
        (nothing of it was taken)."""
        q = self.config.queue
        bounded: list[tuple[bytes, int]] = []
        for body, spans in batches:
            if len(body) > q.max_batch_bytes and spans > 1:
                bounded.extend(split_request(body, q.batch_spans, q.max_batch_bytes))
            else:
                bounded.append((body, spans))
        try:
            ids = await self._queue.put(bounded, done or [], released or [], decided or [])
        except (sqlite3.Error, OSError) as exc:
            raise self._storage_failed("queue", exc) from exc
        for batch_id, (body, spans) in zip(ids, bounded, strict=True):
            self.queued_spans += spans
            self.queued_bytes += len(body)
            # Kept in memory only when every earlier batch is there too, so that the loader can
            # find the rest on disk in id order.
            if batch_id == self._loaded_upto + 1 and self._mem_spans + spans <= q.memory_spans:
                self._mem.append(_Batch(batch_id, body, spans))
                self._mem_spans += spans
                self._loaded_upto = batch_id
        self._drained.clear()
        self._update_gauge()
        self._wake.set()

    async def journal(self, body: bytes) -> int:
        """Journal a received request until its spans are queued for export; returns its id.
        Raises ``StorageError`` when the write failed."""
        try:
            return await self._queue.journal(body)
        except (sqlite3.Error, OSError) as exc:
            raise self._storage_failed("journal", exc) from exc

    async def decided(self, since: float, limit: int) -> list[tuple[str, float, str]]:
        """The traces whose spans were queued as decided, at ``since`` or later (``time.time()``),
        the ``limit`` last, oldest first: (trace id, time, span ids, 16 hex characters each)."""
        try:
            return await self._queue.decided(since, limit)
        except (sqlite3.Error, OSError) as exc:
            raise self._storage_failed("decided", exc) from exc

    async def forget_decided(self, before: float, keep: int) -> None:
        try:
            await self._queue.forget_decided(before, keep)
        except (sqlite3.Error, OSError) as exc:
            raise self._storage_failed("decided", exc) from exc

    async def release(self, journal_ids: list[int]) -> None:
        try:
            await self._queue.release(journal_ids)
        except (sqlite3.Error, OSError) as exc:
            raise self._storage_failed("release", exc) from exc

    async def journaled(self) -> list[tuple[int, bytes, set[bytes]]]:
        """Journaled requests left by a previous run; those that cannot be read back are logged,
        counted (``operation="journal_read"``) and dropped."""
        entries = await self._queue.journaled()
        self._report_unreadable()
        return entries

    def _report_unreadable(self) -> None:
        """Bodies the queue could not read back (a damaged or lost segment file): dropped there;
        logged, counted, and taken out of the queue's counts here."""
        for lost in self._queue.unreadable:
            self._metrics.storage_errors.labels(f"{lost.table}_read").inc()
            batch = lost.table == "batches"
            if batch:
                self.queued_spans -= lost.spans
                self.queued_bytes -= lost.length
                self._metrics.spans_dropped.labels("export_unreadable").inc(lost.spans)
            log.error(
                "UNREADABLE %s: %s %d (%s) is dropped; %s", lost.table.upper(),
                "batch" if batch else "journaled request", lost.row_id, lost.why,
                f"its {lost.spans} spans are not sent" if batch else "its spans cannot be replayed",
            )  # fmt: skip
        self._queue.unreadable.clear()
        self._update_gauge()

    def hold(self, spans: int) -> None:
        """The caller holds ``spans`` more (or, negative, fewer) accepted spans that could not be
        written yet: they count in the queue gauge and against ``queue.max_spans``."""
        self.held_spans += spans
        self._update_gauge()

    async def flush(self, timeout: float) -> bool:
        """Wait until the backend acknowledged everything accepted; False on timeout."""
        if self.queued_spans == 0:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), timeout)
        return self.queued_spans == 0

    async def stop(self) -> None:
        tasks = [*self._senders, *([self._probe_task] if self._probe_task is not None else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:  # a sender never ends by itself; if one did, stopping must not fail on it
                log.exception("export sender ended with an error")
        self._senders, self._probe_task = [], None
        if self._undeleted:
            with contextlib.suppress(sqlite3.Error, OSError):
                await self._queue.delete(self._undeleted)
                self._undeleted = []
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
        self._gauge.set(self.queued_spans + self.held_spans)

    # ---- sending --------------------------------------------------------------------------------

    async def _take(self) -> _Batch:
        while True:
            if self._mem:
                batch = self._mem.popleft()
                self._mem_spans -= batch.spans
                self._inflight_spans += batch.spans
                return batch
            if self.queued_spans > self._inflight_spans:
                try:
                    async with self._load_lock:
                        if not self._mem:
                            await self._load()
                except (sqlite3.Error, OSError) as exc:
                    self._storage_failed("load", exc)
                    await asyncio.sleep(STORAGE_PROBE_INTERVAL_S)
                    continue
                if self._mem:
                    continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 1.0)

    async def _load(self) -> None:
        rows = await self._queue.load(self._loaded_upto, self.config.queue.memory_spans)
        self._report_unreadable()
        for batch_id, body, spans in rows:
            if batch_id > self._loaded_upto:
                self._mem.append(_Batch(batch_id, body, spans))
                self._mem_spans += spans
                self._loaded_upto = batch_id

    async def _sender(self) -> None:
        failures = 0
        while True:
            batch = await self._take()
            try:
                await self._deliver(batch)
                failures = 0
            except Exception as exc:  # nothing may end a sender: the batch goes back
                failures += 1
                self._metrics.export_errors.labels(self.name, type(exc).__name__).inc()
                self._log.error(
                    "sender", "export of batch %d failed unexpectedly (%s: %s); back to the queue",
                    batch.batch_id, type(exc).__name__, exc,
                )  # fmt: skip
                self._mem.appendleft(batch)
                self._mem_spans += batch.spans
                self._inflight_spans -= batch.spans
                await asyncio.sleep(self._backoff(failures - 1))
                continue
            self._inflight_spans -= batch.spans

    def _backoff(self, attempt: int) -> float:
        retry = self.config.retry
        wait = min(retry.max_interval, retry.initial_interval * retry.multiplier ** min(attempt, 64))
        return float(wait * random.uniform(1 - retry.jitter, 1 + retry.jitter))

    async def _deliver(self, batch: _Batch) -> None:
        """Send one queued batch until it is acknowledged, refused or given up; then delete it."""
        started = time.monotonic()
        sent = rejected = dead = 0
        # Parts still to send (a batch refused as too large is sent in halves), last first.
        parts = [(batch.body, batch.spans)]
        while parts:
            body, spans = parts.pop()
            result, count = await self._deliver_part(body, spans, started, parts)
            if result == "sent":
                sent += spans - count
                rejected += count
            elif result == "rejected":
                rejected += count
            elif result == "dead":
                dead += count
        labels = self._metrics.export_spans.labels
        if rejected:
            labels(self.name, "rejected").inc(rejected)
            self._metrics.spans_dropped.labels("export_rejected").inc(rejected)
        if dead:
            labels(self.name, "dead_letter").inc(dead)
        if sent:
            labels(self.name, "sent").inc(sent)
        self.queued_spans -= batch.spans
        self.queued_bytes -= len(batch.body)
        self._update_gauge()
        # Acknowledged: a failed delete only means it may be sent again after a restart.
        ids = [*self._undeleted, batch.batch_id]
        try:
            await self._queue.delete(ids)
            self._undeleted = []
        except (sqlite3.Error, OSError) as exc:
            self._undeleted = ids
            self._storage_failed("delete", exc)
        if self.queued_spans == 0:
            self._drained.set()

    async def _deliver_part(
        self, body: bytes, spans: int, started: float, parts: list[tuple[bytes, int]]
    ) -> tuple[str, int]:
        """One request until it is settled: ("sent", spans rejected by partial success),
        ("rejected", n), ("dead", n), or ("split", 0) with its halves pushed onto ``parts``."""
        retry = self.config.retry
        attempt = 0
        while True:
            try:
                outcome = await self._send(body)
            except Exception as exc:  # whatever a send raises is a failed attempt
                what = type(exc).__name__
                outcome = _Outcome(ok=False, retry=True, message=f"{what}: {exc}", error=what)
            if outcome.ok:
                if outcome.rejected:
                    self._log.error("partial", "backend refused %d spans: %s", outcome.rejected, outcome.message)
                return "sent", min(outcome.rejected, spans)
            self._metrics.export_errors.labels(self.name, outcome.error or "error").inc()
            if outcome.too_large:
                if spans > 1:
                    self._log.warning(
                        "split", "backend refused %d spans, %d bytes as too large (%s); sending them in halves",
                        spans, len(body), outcome.message,
                    )  # fmt: skip
                    parts.extend(reversed(halve_request(body, spans)))
                    return "split", 0
                await self._dead_letter(body, spans, f"refused as too large even alone ({outcome.message})")
                return "dead", spans
            if not outcome.retry:
                self._log.error("rejected", "backend refused %d spans: %s", spans, outcome.message)
                return "rejected", spans
            wait = self._backoff(attempt)
            if outcome.delay is not None:
                wait = min(max(outcome.delay, 0.0), retry.max_interval)
            limit = retry.max_elapsed_time
            if limit and time.monotonic() + wait - started > limit:
                await self._dead_letter(body, spans, f"still failing after {limit:g}s ({outcome.message})")
                return "dead", spans
            self._metrics.export_spans.labels(self.name, "retried").inc(spans)
            attempt += 1
            self._log.warning(
                "retry", "export to %s failed (%s); retry %d in %.2fs",
                self.config.endpoint, outcome.message, attempt, wait,
            )  # fmt: skip
            await asyncio.sleep(wait)

    async def _dead_letter(self, body: bytes, spans: int, why: str) -> None:
        path = self.config.dead_letter_file
        self._log.error(
            "dead_letter", "gave up on %d spans (%d bytes): %s%s",
            spans, len(body), why, f"; appended to {path}" if path else "",
        )  # fmt: skip
        if not path:
            return
        try:
            await asyncio.to_thread(_append_record, Path(path), body)
        except OSError as exc:
            self._storage_failed("dead_letter", exc)

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
                code = exc.code()
                delay = retry_delay_from_grpc(exc.trailing_metadata())
                # RESOURCE_EXHAUSTED is retryable only with RetryInfo (the OTLP spec); without
                # it, it is the backend's message size limit.
                too_large = code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is None
                return _Outcome(
                    ok=False,
                    retry=code in _RETRYABLE_GRPC and not too_large,
                    delay=delay,
                    message=f"{code.name}: {exc.details()}",
                    too_large=too_large,
                    error=code.name,
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
            async with self._session.post(
                self._url, data=data, headers=http_headers, server_hostname=self._server_hostname
            ) as resp:
                payload = await resp.read()
                if 200 <= resp.status < 300:
                    partial = ExportTraceServiceResponse.FromString(payload).partial_success
                    return _Outcome(ok=True, rejected=partial.rejected_spans, message=partial.error_message)
                return _Outcome(
                    ok=False,
                    retry=resp.status in _RETRYABLE_HTTP,
                    delay=retry_after_seconds(resp.headers.get("Retry-After")),
                    message=f"HTTP {resp.status}",
                    too_large=resp.status == 413,
                    error=f"http_{resp.status}",
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _Outcome(ok=False, retry=True, message=f"{type(exc).__name__}: {exc}", error=type(exc).__name__)
        except DecodeError as exc:  # a 2xx we cannot read: not an OTLP backend's answer, try again later
            return _Outcome(ok=False, retry=True, message=f"unreadable response: {exc}", error="unreadable_response")


def _append_record(path: Path, body: bytes) -> None:
    """One record of the Collector file exporter's protobuf format: 4-byte big-endian length, request."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(struct.pack(">I", len(body)) + body)
        f.flush()
