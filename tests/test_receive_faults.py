"""Hostile input and connection floods on the live receivers, over real loopback sockets.

Each attack runs while a prober checks that the process keeps answering (``/healthz`` within
1 s, gRPC Export within 1 s), valid requests sent during and after it are taken and reach the
backend, and ``/metrics`` adds up (every refused request counted as malformed). Attacks that
need the processor's own memory or file-descriptor limits run ``otel-plumb run`` in a
subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import os
import resource
import subprocess
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
import zstandard
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from test_live_backpressure import trace_request
from test_live_support import config, metric, scrape, scrape_when_sent, start_cli, wait_until

from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.processor import Processor
from otel_plumb.receive.otlp_json import request_to_json

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SPANS_PER_REQUEST = 5  # trace_request(): a root and 4 tool spans


# ---- helpers -----------------------------------------------------------------------------------

# A probe of a process that keeps answering gets its answer well within this, even on a busy
# shared machine; a wedged event loop or a dead listener never does.
ANSWER_WITHIN = 5.0


class Prober:
    """Probes /healthz (a new connection each time) and sends a valid gRPC Export every
    ``interval`` while running; records the slowest answers and any failure."""

    def __init__(self, metrics_port: int, grpc_port: int | None = None, interval: float = 0.05) -> None:
        self.metrics_port, self.grpc_port, self.interval = metrics_port, grpc_port, interval
        self.health_max = 0.0
        self.grpc_max = 0.0
        self.probes = 0
        self.grpc_spans = 0
        self.failures: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def _run(self) -> None:
        connector = aiohttp.TCPConnector(force_close=True)
        async with contextlib.AsyncExitStack() as stack:
            session = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
            stub = None
            if self.grpc_port is not None:
                channel = await stack.enter_async_context(grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}"))
                stub = TraceServiceStub(channel)
            url = f"http://127.0.0.1:{self.metrics_port}/healthz"
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    async with asyncio.timeout(ANSWER_WITHIN), session.get(url) as resp:
                        assert resp.status == 200, resp.status
                except (TimeoutError, aiohttp.ClientError, AssertionError) as exc:
                    self.failures.append(f"healthz: {exc!r}")
                self.health_max = max(self.health_max, time.monotonic() - start)
                self.probes += 1
                if stub is not None:
                    start = time.monotonic()
                    try:
                        await stub.Export(trace_request(), timeout=ANSWER_WITHIN)
                        self.grpc_spans += SPANS_PER_REQUEST
                    except grpc.aio.AioRpcError as exc:
                        self.failures.append(f"grpc: {exc.code()} {exc.details()}")
                    self.grpc_max = max(self.grpc_max, time.monotonic() - start)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval)

    async def __aenter__(self) -> Prober:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._stop.set()  # the Export in flight finishes, so every span sent is known
        await self._task

    def check(self) -> None:
        assert self.probes >= 3, "the prober hardly ran"
        assert not self.failures, self.failures[:5]
        assert self.health_max < ANSWER_WITHIN, f"/healthz took {self.health_max:.2f}s"
        assert self.grpc_max < ANSWER_WITHIN, f"gRPC Export took {self.grpc_max:.2f}s"


@contextlib.asynccontextmanager
async def processor_with_backend(tmp_path: Path, **sections: Any) -> AsyncIterator[tuple[Processor, OtlpBackend]]:
    backend = OtlpBackend()
    await backend.start(0)
    processor = Processor(config(tmp_path, backend.endpoint, **sections))
    try:
        await processor.start()
        yield processor, backend
    finally:
        await processor.stop()
        await backend.stop()


async def post(session: aiohttp.ClientSession, port: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    async with session.post(f"http://127.0.0.1:{port}/v1/traces", data=body, headers=headers) as resp:
        return resp.status, await resp.read()


def status_message(body: bytes, as_json: bool) -> str:
    if as_json:
        return str(json.loads(body)["message"])
    return status_pb2.Status.FromString(body).message


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    key, size = (number << 3) | 2, len(payload)
    out = bytearray([key])
    while size > 0x7F:
        out.append(size & 0x7F | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out) + payload


def deep_protobuf(levels: int) -> bytes:
    """A request whose one span attribute is an AnyValue kvlist nested ``levels`` deep."""
    value = field(1, b"x")  # AnyValue.string_value
    for _ in range(levels):
        value = field(6, field(1, field(1, b"k") + field(2, value)))  # kvlist_value.values[0].value
    span = field(1, bytes(16)) + field(2, bytes(8)) + field(9, field(1, b"a") + field(2, value))
    return field(1, field(2, field(2, span)))  # resource_spans.scope_spans.spans


def start_run(
    config_data: dict[str, Any], tmp_path: Path, nofile: int | None = None
) -> tuple[subprocess.Popen[str], dict[str, int], list[str]]:
    """``otel-plumb run --config`` in a subprocess (with its open-file limit set to ``nofile``),
    returned once listening, with its ports and its log lines (read on a thread)."""
    path = tmp_path / "otel-plumb.yaml"
    path.write_text(yaml.safe_dump(config_data))
    return start_cli(["--config", str(path)], nofile=nofile)


def stop_run(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_config(tmp_path: Path, backend: OtlpBackend, **receivers: Any) -> dict[str, Any]:
    return {
        "receivers": {
            "grpc": {"endpoint": "127.0.0.1:0", **receivers.pop("grpc", {})},
            "http": {"endpoint": "127.0.0.1:0", **receivers.pop("http", {})},
            **receivers,
        },
        "metrics": {"endpoint": "127.0.0.1:0"},
        "assembly": {"idle_timeout": 0.3, "tick": 0.05},
        "exporters": {
            "otlp": {
                "endpoint": backend.endpoint,
                "state_dir": str(tmp_path / "state"),
                "retry": {"initial_interval": 0.05, "max_interval": 0.2},
            }
        },
        "shutdown": {"grace_period": 5},
    }


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def tracebacks(lines: list[str]) -> int:
    return sum("Traceback" in line for line in lines)


# ---- compressed bodies inflating past the limit --------------------------------------------------


def _bombs() -> dict[str, bytes]:
    """Each about 2 MiB or less, inflating to 2 GiB (gzip: 32 members of 64 MiB of zeros,
    zstd: one frame) or 256 MiB (deflate)."""
    zeros = bytes(64 << 20)
    member = gzip.compress(zeros, compresslevel=9)
    z = zstandard.ZstdCompressor(level=3).compressobj()
    frame = b"".join([*(z.compress(zeros) for _ in range(32)), z.flush()])
    d = zlib.compressobj(9)
    deflated = b"".join([*(d.compress(zeros) for _ in range(4)), d.flush()])
    return {"gzip": member * 32, "zstd": frame, "deflate": deflated}


async def test_compression_bombs_are_refused_within_the_limit_and_the_loop_keeps_answering(tmp_path: Path) -> None:
    bombs = await asyncio.to_thread(_bombs)
    assert len(bombs["gzip"]) < 2.2 * (1 << 20)
    backend = OtlpBackend()
    await backend.start(0)
    proc, ports, lines = start_run(run_config(tmp_path, backend), tmp_path)
    try:
        base_rss = peak_rss_mib(proc.pid)
        sent_http = 0
        statuses: list[int] = []
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with Prober(ports["metrics"], ports["grpc"]) as prober:
                start = time.monotonic()
                for _round in range(3):

                    async def bomb(encoding: str) -> int:
                        headers = {**PROTOBUF, "Content-Encoding": encoding}
                        return (await post(session, ports["http"], bombs[encoding], headers))[0]

                    # Four at a time, every encoding, while a valid gzip request goes in beside them.
                    valid = gzip.compress(trace_request().SerializeToString())
                    results = await asyncio.gather(
                        *(bomb(e) for e in ("gzip", "gzip", "zstd", "deflate")),
                        post(session, ports["http"], valid, {**PROTOBUF, "Content-Encoding": "gzip"}),
                    )
                    statuses += results[:4]
                    assert results[4][0] == 200
                    sent_http += SPANS_PER_REQUEST
                elapsed = time.monotonic() - start
            prober.check()
        assert statuses == [413] * 12
        assert elapsed < 10, f"12 bombs took {elapsed:.1f}s"
        # Inflating stops at the limit (16 MiB): four at once hold well under 1 GiB.
        assert peak_rss_mib(proc.pid) - base_rss < 300, (base_rss, peak_rss_mib(proc.pid))
        total = sent_http + prober.grpc_spans
        assert await backend.wait_for_spans(total, 15), (backend.span_count, total)
        text = await scrape_when_sent(ports["metrics"], total)
    finally:
        stop_run(proc)
        await backend.stop()
    assert metric(text, "plumb_spans_dropped_total", reason="malformed") == 12
    assert metric(text, "plumb_spans_received_total") == total
    assert metric(text, "plumb_export_spans_total", outcome="sent") == total
    assert tracebacks(lines) == 0, "".join(lines)
    assert sum("malformed OTLP request" in line for line in lines) <= 2  # one line per 10 s


# ---- unknown encodings and content types, malformed bodies however they fail ---------------------


def _malformed_protobuf() -> list[tuple[str, bytes]]:
    valid = trace_request().SerializeToString()
    return [
        ("protobuf garbage", b"\xff\xff\xff not protobuf"),
        ("protobuf truncated", valid[:-3]),
        ("protobuf string not UTF-8", valid.replace(b"load", b"\xff\xfe\xfd\xfc")),
        ("protobuf nested 2000 deep", deep_protobuf(2000)),
    ]


def _malformed_cases() -> list[tuple[str, dict[str, str], bytes, int]]:
    valid = trace_request().SerializeToString()
    valid_json = json.dumps(request_to_json(trace_request())).encode()
    n = 100_000
    return [
        ("snappy encoding", {**PROTOBUF, "Content-Encoding": "snappy"}, valid, 415),
        ("br encoding", {**JSON, "Content-Encoding": "br"}, valid_json, 415),
        ("gzip then lz4", {**PROTOBUF, "Content-Encoding": "gzip, lz4"}, valid, 415),
        ("text/plain", {"Content-Type": "text/plain"}, valid, 415),
        ("no content type", {}, valid, 415),
        ("JSON arrays 10^5 deep", JSON, b'{"resourceSpans":' + b"[" * n + b"]" * n + b"}", 400),
        ("JSON objects 10^5 deep", JSON, b'{"a":' * n + b"1" + b"}" * n, 400),
        ("JSON 600 deep", JSON, b'{"resourceSpans":' + b"[" * 600 + b"]" * 600 + b"}", 400),
        ("JSON not UTF-8", JSON, b'{"resourceSpans": "\xff\xfe\xfd"}', 400),
        ("JSON array", JSON, b"[1, 2]", 400),
        ("JSON wrong types", JSON, b'{"resourceSpans": 5}', 400),
        ("JSON bad ids", JSON, valid_json.replace(b'"traceId": "', b'"traceId": "zz'), 400),
        ("JSON truncated", JSON, valid_json[:-10], 400),
        *((name, PROTOBUF, body, 400) for name, body in _malformed_protobuf()),
        ("gzip truncated", {**PROTOBUF, "Content-Encoding": "gzip"}, gzip.compress(valid)[:-12], 400),
        ("gzip not gzip", {**PROTOBUF, "Content-Encoding": "gzip"}, b"plain bytes", 400),
        ("zstd not zstd", {**PROTOBUF, "Content-Encoding": "zstd"}, b"plain bytes", 400),
        ("deflate not deflate", {**PROTOBUF, "Content-Encoding": "deflate"}, b"\x00\x01plain", 400),
        ("over the size limit", PROTOBUF, bytes(2 << 20), 413),
    ]


async def test_malformed_bodies_are_400_or_415_counted_and_logged_at_a_rate_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cases = _malformed_cases()
    async with processor_with_backend(tmp_path, receivers={"max_message_mib": 1}) as (processor, backend):
        port = processor.http_port or 0
        sent = 0
        async with aiohttp.ClientSession() as session, Prober(processor.metrics_port or 0) as prober:
            for name, headers, body, expected in cases:
                status, answer = await post(session, port, body, headers)
                assert status == expected, (name, status, answer[:300])
                message = status_message(answer, headers.get("Content-Type") == JSON["Content-Type"])
                assert 0 < len(message) < 300, (name, message)
                if expected == 415:
                    assert "unsupported" in message, (name, message)
            assert "nested too deeply" in status_message(
                (await post(session, port, cases[5][2], JSON))[1], True
            )
            # A flood of them logs a line per interval, not one (or a traceback) each.
            flood = 200
            await asyncio.gather(*(post(session, port, b"\xff\xff", PROTOBUF) for _ in range(flood)))
            # Valid requests in every supported form are still taken (each a new trace).
            zstd = zstandard.ZstdCompressor().compress
            for encode, headers in (
                (lambda b: b, PROTOBUF),
                (gzip.compress, {**PROTOBUF, "Content-Encoding": "gzip"}),
                (zlib.compress, {**PROTOBUF, "Content-Encoding": "deflate"}),
                (lambda b: zlib.compress(b)[2:-4], {**PROTOBUF, "Content-Encoding": "deflate"}),  # raw deflate
                (zstd, {**PROTOBUF, "Content-Encoding": "zstd"}),
                (lambda b: gzip.compress(b) + gzip.compress(b""), {**PROTOBUF, "Content-Encoding": "x-gzip"}),
                (lambda b: b, JSON),
                (gzip.compress, {**JSON, "Content-Encoding": "gzip, identity"}),
            ):
                request = trace_request()
                as_json = headers["Content-Type"] == JSON["Content-Type"]
                plain = json.dumps(request_to_json(request)).encode() if as_json else request.SerializeToString()
                status, answer = await post(session, port, encode(plain), headers)
                assert status == 200, (headers, answer)
                sent += SPANS_PER_REQUEST
            # gRPC: the same bytes are refused and counted too.
            async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}") as channel:
                raw = channel.unary_unary(
                    EXPORT, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
                )
                for name, body in _malformed_protobuf():
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await raw(body, timeout=5)
                    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        prober.check()
        assert await backend.wait_for_spans(sent, 10), (backend.span_count, sent)
        text = await scrape_when_sent(processor.metrics_port or 0, sent)
    refused_grpc = len(_malformed_protobuf())
    assert metric(text, "plumb_spans_dropped_total", reason="malformed") == len(cases) + 1 + flood + refused_grpc
    assert metric(text, "plumb_spans_received_total") == sent
    assert metric(text, "plumb_export_spans_total", outcome="sent") == sent
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert sum("malformed OTLP request" in r.getMessage() for r in caplog.records) <= 4


# ---- idle connections, connection floods, running out of file descriptors ------------------------


async def _open_idle(port: int, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``count`` TCP connections that send nothing (those that fail to connect are not kept)."""
    pairs: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def one() -> None:
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(5):
                pairs.append(await asyncio.open_connection("127.0.0.1", port))

    for start in range(0, count, 200):
        await asyncio.gather(*(one() for _ in range(min(200, count - start))))
    return pairs


async def _server_holds_at_most(pid: int, fds: int, timeout: float) -> None:
    """Wait until the server process holds at most ``fds`` descriptors, at most ``timeout``.

    Counted on the server, not by reading each client socket to its end: a connection whose
    final ACK arrived while the listen queue was full is established on the client only. The
    server never accepted it and holds nothing for it, so it cannot close it; the kernel
    accepts it on a later SYN-ACK retry (up to a minute on), or drops it silently."""
    deadline = time.monotonic() + timeout
    while (held := open_fds(pid)) > fds:
        assert time.monotonic() < deadline, f"the server still holds {held} descriptors (at most {fds} expected)"
        await asyncio.sleep(0.1)


async def _valid_http(session: aiohttp.ClientSession, port: int) -> int:
    """Send one valid request, retrying a refusal (503 at the connection cap) a few times."""
    for _ in range(20):
        with contextlib.suppress(aiohttp.ClientError):
            status, _ = await post(session, port, trace_request().SerializeToString(), PROTOBUF)
            if status == 200:
                return SPANS_PER_REQUEST
            assert status == 503, status
        await asyncio.sleep(0.05)
    raise AssertionError("a valid request was never taken")


async def test_idle_connection_flood_is_bounded_closed_when_idle_and_logged_at_a_rate_limit(tmp_path: Path) -> None:
    nofile = 512
    backend = OtlpBackend()
    await backend.start(0)
    cfg = run_config(tmp_path, backend, http={"idle_timeout": 1.5}, grpc={"idle_timeout": 1.5})
    proc, ports, lines = start_run(cfg, tmp_path, nofile=nofile)
    pairs: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        sent = 0
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with Prober(ports["metrics"], ports["grpc"]) as prober:
                before = peak = open_fds(proc.pid)
                for _ in range(5):  # 2,000 idle connections in all, valid requests between
                    pairs += await _open_idle(ports["http"], 300)
                    pairs += await _open_idle(ports["grpc"], 100)
                    sent += await _valid_http(session, ports["http"])
                    peak = max(peak, open_fds(proc.pid))
                    assert peak < nofile
            prober.check()
            # Every idle connection is closed by the server: evicted at the cap, or after idle_timeout.
            assert peak > before + 200, (before, peak)  # the flood filled the caps (160 each)
            await _server_holds_at_most(proc.pid, before + 16, 10)
            sent += await _valid_http(session, ports["http"])
        total = sent + prober.grpc_spans
        assert await backend.wait_for_spans(total, 15), (backend.span_count, total)
        text = await scrape_when_sent(ports["metrics"], total)
    finally:
        for _, w in pairs:
            w.close()
        stop_run(proc)
        await backend.stop()
    log = "".join(lines)
    assert tracebacks(lines) == 0, log
    assert "Too many open files" not in log and "out of system resource" not in log, log
    assert "capped at" in log  # 1024 + 1024 connections do not fit in 512 descriptors
    assert sum("max_connections" in line for line in lines) <= 4, log  # rate-limited
    assert len(lines) < 40, log
    assert metric(text, "plumb_spans_received_total") == total
    assert metric(text, "plumb_export_spans_total", outcome="sent") == total
    assert metric(text, "plumb_spans_dropped_total", reason="malformed") == 0


async def test_running_out_of_file_descriptors_logs_a_line_not_a_traceback_and_recovers(tmp_path: Path) -> None:
    """The open-file limit lowered under a running processor (as when other files take the
    descriptors): accept() fails with EMFILE; the receiver closes idle connections to make
    room, logs a rate-limited line, and keeps answering."""
    backend = OtlpBackend()
    await backend.start(0)
    proc, ports, lines = start_run(run_config(tmp_path, backend, http={"idle_timeout": 30}), tmp_path)
    pairs: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        base = open_fds(proc.pid)
        limit = base + 150
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (limit, limit))
        sent = 0
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(4):
                pairs += await _open_idle(ports["http"], 250)
            await wait_until(lambda: any("cannot accept connections" in line for line in lines), 10, "EMFILE")
            # Still answering: probes and valid requests get through (idle connections make room).
            async with Prober(ports["metrics"], ports["grpc"], interval=0.1) as prober:
                pairs += await _open_idle(ports["http"], 200)
                for _ in range(3):
                    sent += await _valid_http(session, ports["http"])
                await wait_until(lambda: prober.probes >= 10, 10, "probes")
            prober.check()
        total = sent + prober.grpc_spans
        assert await backend.wait_for_spans(total, 15), (backend.span_count, total)
        text = await scrape_when_sent(ports["metrics"], total)
    finally:
        for _, w in pairs:
            w.close()
        stop_run(proc)
        await backend.stop()
    log = "".join(lines)
    assert tracebacks(lines) == 0, log
    assert 1 <= sum("cannot accept connections" in line for line in lines) <= 3, log
    assert len(lines) < 60, log
    assert metric(text, "plumb_spans_received_total") == total


# ---- a body that stops arriving ---------------------------------------------------------------


async def test_a_body_that_stops_arriving_is_refused_after_the_idle_timeout(tmp_path: Path) -> None:
    receivers = {"http": {"endpoint": "127.0.0.1:0", "idle_timeout": 0.5}}
    async with processor_with_backend(tmp_path, receivers=receivers) as (processor, _backend):
        reader, writer = await asyncio.open_connection("127.0.0.1", processor.http_port)
        writer.write(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: 1000\r\n\r\n" + b"\x0a" * 10
        )
        await writer.drain()
        async with asyncio.timeout(5):
            head = await reader.readline()
        assert b" 408 " in head, head
        writer.close()
        text = await asyncio.to_thread(scrape, processor.metrics_port or 0)
    assert metric(text, "plumb_spans_dropped_total", reason="malformed") == 1

