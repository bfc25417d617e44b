"""Faults on the way out and on disk, over real sockets on 127.0.0.1: a backend answering with a
corrupt status trailer, a backend with the Collector's 4 MiB receive limit, a full disk under
the state directory, a corrupt queue file, a slow backend, SIGKILL with sends in flight.

Each test checks that the process keeps answering (``/healthz`` within 1 s during the fault),
that what was acknowledged is delivered (or dead-lettered and counted), and that the counts in
``/metrics`` add up: spans received = sent + counted drops + dead letters, with the queue gauge
at 0 once drained. The fake backends are grpc.aio servers defined here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from test_live_backpressure import trace_request
from test_live_support import config, free_port, metric, scrape, start_cli, wait_until

from otel_plumb.processor import Processor
from otel_plumb.receive.files import read_batches
from otel_plumb.receive.grpc_server import SERVICE
from otel_plumb.receive.otlp import ReceivedRequest
from otel_plumb.replay import replay

_OK = ExportTraceServiceResponse().SerializeToString()
# What a fake backend answers to one call: None (accepted), or a gRPC code, details and trailers.
Refusal = tuple[grpc.StatusCode, str, tuple[tuple[str, bytes | str], ...]]
Answer = Callable[[ExportTraceServiceRequest, int], Awaitable[Refusal | None]]


def span_ids(request: ExportTraceServiceRequest) -> list[bytes]:
    return [s.span_id for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


class FakeBackend:
    """An OTLP/gRPC TraceService on 127.0.0.1 answering each call as ``answer`` says. It counts
    the span ids it accepted, and those of every call that reached it (answered or not).
    ``store_first``: a call's spans are stored before ``answer`` runs (a backend that keeps the
    data but answers late, or never)."""

    def __init__(
        self, answer: Answer | None = None, max_receive_bytes: int = 64 << 20, store_first: bool = False
    ) -> None:
        self.answer = answer
        self.store_first = store_first
        self.max_receive_bytes = max_receive_bytes
        self.accepted: Counter[bytes] = Counter()
        self.arrived: Counter[bytes] = Counter()
        self.spans: dict[bytes, Span] = {}
        self.calls = 0
        self.port = 0
        self._server: grpc.aio.Server | None = None

    async def _export(self, raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        request = ExportTraceServiceRequest.FromString(raw)
        self.calls += 1
        self.arrived.update(span_ids(request))
        if self.store_first:
            self._store(request)
        refusal = await self.answer(request, self.calls) if self.answer is not None else None
        if refusal is not None:
            code, details, trailers = refusal
            await context.abort(code, details, trailing_metadata=trailers)
        if not self.store_first:
            self._store(request)
        return _OK

    def _store(self, request: ExportTraceServiceRequest) -> None:
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    self.accepted[span.span_id] += 1
                    self.spans[span.span_id] = span

    async def start(self, port: int = 0) -> str:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", self.max_receive_bytes)])
        handler = grpc.unary_unary_rpc_method_handler(self._export)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        self.port = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        self._server = server
        return f"grpc://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None


class HealthProbe:
    """GETs /healthz every 50 ms for as long as it runs; ``check`` asserts every answer was a
    200 within 1 s."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
            while True:
                began = time.monotonic()
                try:
                    async with session.get(f"http://127.0.0.1:{self.port}/healthz") as resp:
                        await resp.read()
                        if resp.status != 200:
                            self.failures.append(f"HTTP {resp.status}")
                except (aiohttp.ClientError, TimeoutError) as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                self.latencies.append(time.monotonic() - began)
                await asyncio.sleep(0.05)

    def __enter__(self) -> HealthProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def check(self) -> None:
        assert self.latencies, "no /healthz probe ran"
        assert not self.failures, self.failures[:3]
        assert max(self.latencies) < 1.0, f"/healthz took {max(self.latencies):.2f}s"


def balance(text: str) -> tuple[float, float]:
    """(spans received, spans accounted for: sent + counted drops + dead letters)."""
    received = metric(text, "plumb_spans_received_total")
    sent = metric(text, "plumb_export_spans_total", outcome="sent")
    dead = metric(text, "plumb_export_spans_total", outcome="dead_letter")
    dropped = metric(text, "plumb_spans_dropped_total")
    return received, sent + dead + dropped


async def get(port: int, path: str) -> tuple[int, str]:
    """GET on the metrics endpoint without blocking the loop (the processor may share it)."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as resp,
    ):
        return resp.status, await resp.text()


async def metrics_text(port: int) -> str:
    return (await get(port, "/metrics"))[1]


async def readyz(port: int) -> int:
    return (await get(port, "/readyz"))[0]


async def poll(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def assert_drained_and_balanced(port: int) -> str:
    text = ""

    async def settled() -> bool:
        nonlocal text
        text = await metrics_text(port)
        received, accounted = balance(text)
        return received == accounted and metric(text, "plumb_export_queue_spans") == 0

    await poll(settled, 15, "the export queue drained and the counts adding up")
    return text


async def export_retrying(stub: TraceServiceStub, request: ExportTraceServiceRequest, deadline: float) -> list[str]:
    """Send as an OTLP SDK exporter does: retry what the server calls retryable. Returns the
    codes of the refusals seen before it was taken."""
    refused: list[str] = []
    while True:
        try:
            await stub.Export(request, timeout=5)
            return refused
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED), exc
            refused.append(exc.code().name)
            assert time.monotonic() < deadline, f"still refused at the deadline: {exc.details()}"
            await asyncio.sleep(0.1)


# ---- a corrupt grpc-status-details-bin trailer ----------------------------------------------------


async def test_corrupt_status_trailer_is_a_failed_attempt_not_a_dead_sender(tmp_path: Path) -> None:
    """Before: the sender died on an unlogged DecodeError, its batch stuck until a restart and
    SIGTERM waited the full grace. Now each such answer is one counted, retried failure."""
    corrupt = 4

    async def answer(_request: ExportTraceServiceRequest, call: int) -> Refusal | None:
        if call <= corrupt:
            return grpc.StatusCode.UNAVAILABLE, "overloaded", (("grpc-status-details-bin", b"\xff\xfe\x00garbage"),)
        return None

    backend = FakeBackend(answer)
    endpoint = await backend.start()
    # concurrency 1: the same sender meets every corrupt answer.
    processor = Processor(config(tmp_path, endpoint, exporters={"otlp": {
        "endpoint": endpoint, "state_dir": str(tmp_path / "state"),
        "retry": {"initial_interval": 0.05, "max_interval": 0.2}, "queue": {"concurrency": 1, "batch_spans": 5},
    }}))  # fmt: skip
    await processor.start()
    try:
        assert processor.metrics_port and processor.grpc_port
        requests = [trace_request(tools=4) for _ in range(6)]
        sent = {i for r in requests for i in span_ids(r)}
        with HealthProbe(processor.metrics_port) as probe:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}") as channel:
                stub = TraceServiceStub(channel)
                for request in requests:
                    await stub.Export(request, timeout=5)
            await wait_until(lambda: set(backend.accepted) == sent, 15, "every span delivered")
            text = await assert_drained_and_balanced(processor.metrics_port)
        probe.check()
        assert metric(text, "plumb_export_errors_total", error="UNAVAILABLE") == corrupt
        assert metric(text, "plumb_export_spans_total", outcome="sent") == len(sent)
        assert set(backend.accepted.values()) == {1}
        began = time.monotonic()
        assert await processor.stop(grace=5)
        assert time.monotonic() - began < 2, "stopping waited on a sender"
    finally:
        await processor.stop(grace=0)
        await backend.stop()


# ---- a backend with the Collector's 4 MiB receive limit ------------------------------------------

_BIG_ARGS_POLICY = """
policy: short-mail
invariants:
  - id: short-body
    arg_matches: {tool: send_email, arg: body, regex: '^short$'}
"""


def big_call(body_bytes: int) -> ExportTraceServiceRequest:
    """One trace whose send_email call carries a ``body`` argument of ``body_bytes`` characters,
    which the policy refuses (so the verdict quotes it)."""
    request = trace_request(tools=1)
    tool = request.resource_spans[0].scope_spans[0].spans[1]
    for a in tool.attributes:
        if a.key == "gen_ai.tool.name":
            a.value.string_value = "send_email"
    tool.attributes.add(key="gen_ai.tool.call.arguments").value.string_value = json.dumps({"body": "x" * body_bytes})
    return request


async def test_4mib_backend_gets_bounded_batches_and_a_span_too_big_alone_is_dead_lettered(tmp_path: Path) -> None:
    """Before: a 1.5 MiB request with a refused argument was exported as 4.6 MB (the value
    copied into message and got), refused with RESOURCE_EXHAUSTED and retried for ever, two such
    batches blocking both senders. Now annotations are cut, batches stay under max_batch_bytes,
    and a span refused even alone goes to the dead-letter file, counted."""
    backend = FakeBackend(max_receive_bytes=4 << 20)  # the Collector's default
    endpoint = await backend.start()
    policy = tmp_path / "policy.yaml"
    policy.write_text(_BIG_ARGS_POLICY)
    dead_letters = tmp_path / "dead-letters.otlp"
    processor = Processor(config(tmp_path, endpoint, policies=[str(policy)], exporters={"otlp": {
        "endpoint": endpoint, "state_dir": str(tmp_path / "state"), "dead_letter_file": str(dead_letters),
        "retry": {"initial_interval": 0.05, "max_interval": 0.2},
    }}))  # fmt: skip
    await processor.start()
    try:
        assert processor.metrics_port and processor.grpc_port
        fitting = [big_call(int(1.5 * (1 << 20))) for _ in range(4)]  # 6 MiB together
        too_big = big_call(5 << 20)  # one span over the backend's limit on its own
        received = {s.span_id: s for r in fitting for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans}
        with HealthProbe(processor.metrics_port) as probe:
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{processor.grpc_port}", options=[("grpc.max_send_message_length", 16 << 20)]
            ) as channel:
                stub = TraceServiceStub(channel)
                for request in [*fitting, too_big]:
                    await stub.Export(request, timeout=10)
            await wait_until(lambda: set(backend.accepted) >= set(received), 20, "the fitting spans delivered")
            text = await assert_drained_and_balanced(processor.metrics_port)
        probe.check()
        assert set(backend.accepted.values()) == {1}
        assert metric(text, "plumb_violations_total", invariant="short-body") == 5
        for span_id, original in received.items():
            out = backend.spans[span_id]
            assert out.ByteSize() < original.ByteSize() + 8192, "an annotated span is not much bigger"
            for event in out.events:
                got = next(a.value.string_value for a in event.attributes if a.key == "got")
                assert len(got) < 1100 and got.endswith("more characters]")
        # The 5 MiB tool span was refused alone: a dead letter, counted, in the file; its root went on.
        big_id = too_big.resource_spans[0].scope_spans[0].spans[1].span_id
        assert big_id not in backend.accepted
        assert too_big.resource_spans[0].scope_spans[0].spans[0].span_id in backend.accepted
        assert metric(text, "plumb_export_spans_total", outcome="dead_letter") == 1
        assert metric(text, "plumb_export_errors_total", error="RESOURCE_EXHAUSTED") >= 1
        records = [item for batch in read_batches(dead_letters) for item in batch]
        assert [getattr(r, "span_id", None) for r in records] == [big_id.hex()]
        assert len(replay([dead_letters]).trajectories) == 1, "otel-plumb replay reads the dead letters"
    finally:
        await processor.stop(grace=2)
        await backend.stop()


async def test_a_batch_refused_as_too_large_is_sent_in_halves(tmp_path: Path) -> None:
    """RESOURCE_EXHAUSTED without RetryInfo is the backend's size limit, not back-pressure: the
    batch is halved until each part fits, never retried as it is."""
    backend = FakeBackend(max_receive_bytes=1 << 20)
    endpoint = await backend.start()
    processor = Processor(config(tmp_path, endpoint, exporters={"otlp": {
        "endpoint": endpoint, "state_dir": str(tmp_path / "state"),
        "retry": {"initial_interval": 0.05, "max_interval": 0.2},
        "queue": {"max_batch_bytes": 64 << 20, "concurrency": 1},
    }}))  # fmt: skip
    await processor.start()
    try:
        assert processor.metrics_port
        requests = [big_call(200_000) for _ in range(12)]  # about 2.4 MB in one batch
        sent = {i for r in requests for i in span_ids(r)}
        combined = ExportTraceServiceRequest()
        for r in requests:
            combined.MergeFrom(r)
        with HealthProbe(processor.metrics_port) as probe:
            await processor.ingest(ReceivedRequest.of(combined), "grpc")
            await wait_until(lambda: set(backend.accepted) == sent, 20, "every span delivered in parts")
            text = await assert_drained_and_balanced(processor.metrics_port)
        probe.check()
        assert set(backend.accepted.values()) == {1}
        assert 1 <= metric(text, "plumb_export_errors_total", error="RESOURCE_EXHAUSTED") <= 3
        assert metric(text, "plumb_export_spans_total", outcome="dead_letter") == 0
    finally:
        await processor.stop(grace=2)
        await backend.stop()


async def test_http_413_is_a_size_limit_too(tmp_path: Path) -> None:
    """Over OTLP/HTTP the backend's size limit is a 413: halved the same way, down to a span
    too big alone, which is a dead letter."""
    limit = 300_000
    received: Counter[bytes] = Counter()

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        if len(body) > limit:
            return web.Response(status=413)
        received.update(span_ids(ExportTraceServiceRequest.FromString(body)))
        return web.Response(body=_OK, content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    processor = Processor(config(tmp_path, exporters={"otlp": {
        "endpoint": f"http://127.0.0.1:{port}", "state_dir": str(tmp_path / "state"),
        "retry": {"initial_interval": 0.05, "max_interval": 0.2}, "queue": {"concurrency": 1},
    }}))  # fmt: skip
    await processor.start()
    try:
        assert processor.metrics_port
        fitting = [big_call(100_000) for _ in range(8)]
        too_big = big_call(400_000)
        combined = ExportTraceServiceRequest()
        for r in [*fitting, too_big]:
            combined.MergeFrom(r)
        with HealthProbe(processor.metrics_port) as probe:
            await processor.ingest(ReceivedRequest.of(combined), "grpc")
            text = await assert_drained_and_balanced(processor.metrics_port)
        probe.check()
        big_id = too_big.resource_spans[0].scope_spans[0].spans[1].span_id
        assert set(received) == {i for r in [*fitting, too_big] for i in span_ids(r)} - {big_id}
        assert set(received.values()) == {1}
        assert metric(text, "plumb_export_spans_total", outcome="dead_letter") == 1
        assert metric(text, "plumb_export_errors_total", error="http_413") >= 2
    finally:
        await processor.stop(grace=2)
        await runner.cleanup()


async def test_a_batch_failing_past_max_elapsed_time_is_dead_lettered(tmp_path: Path) -> None:
    async def unavailable(_request: ExportTraceServiceRequest, _call: int) -> Refusal | None:
        return grpc.StatusCode.UNAVAILABLE, "down for maintenance", ()

    backend = FakeBackend(unavailable)
    endpoint = await backend.start()
    dead_letters = tmp_path / "dead.otlp"
    processor = Processor(config(tmp_path, endpoint, exporters={"otlp": {
        "endpoint": endpoint, "state_dir": str(tmp_path / "state"), "dead_letter_file": str(dead_letters),
        "retry": {"initial_interval": 0.05, "max_interval": 0.1, "max_elapsed_time": 0.5},
    }}))  # fmt: skip
    await processor.start()
    try:
        assert processor.metrics_port
        request = trace_request(tools=3)
        await processor.ingest(ReceivedRequest.of(request), "grpc")
        text = await assert_drained_and_balanced(processor.metrics_port)
        assert metric(text, "plumb_export_spans_total", outcome="dead_letter") == 4
        assert metric(text, "plumb_export_spans_total", outcome="retried") >= 4
        assert not backend.accepted
        records = [item for batch in read_batches(dead_letters) for item in batch]
        assert sorted(r.span_id for r in records) == sorted(i.hex() for i in span_ids(request))  # type: ignore[union-attr]
    finally:
        await processor.stop(grace=0)
        await backend.stop()


# ---- a full disk under the state directory ------------------------------------------------------


class DiskFault:
    """Real write failures under the state directory, switched on and off. ``full``: a small
    tmpfs filled to the last block (ENOSPC; needs root to mount). ``fsize``: the process's
    RLIMIT_FSIZE lowered below every file's size (EFBIG on each write; any user)."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self._saved: tuple[int, int] | None = None

    def __enter__(self) -> DiskFault:
        self.path.mkdir(parents=True, exist_ok=True)
        if self.kind == "full":
            result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(self.path)],
                                    capture_output=True, text=True, check=False)  # fmt: skip
            if result.returncode != 0:
                pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.strip()}")
        return self

    def __exit__(self, *_exc: object) -> None:
        self.heal()
        if self.kind == "full":
            subprocess.run(["umount", "-l", str(self.path)], check=False)

    def break_(self) -> None:
        if self.kind == "full":
            with contextlib.suppress(OSError), open(self.path / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            with contextlib.suppress(OSError), open(self.path / "filler2", "wb") as f:  # the last blocks
                while True:
                    f.write(b"\0" * 512)
                    f.flush()
        else:
            self._saved = resource.getrlimit(resource.RLIMIT_FSIZE)
            # Python ignores SIGXFSZ: a write past the limit fails with EFBIG.
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, self._saved[1]))

    def heal(self) -> None:
        if self.kind == "full":
            for name in ("filler", "filler2"):
                (self.path / name).unlink(missing_ok=True)
        elif self._saved is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, self._saved)
            self._saved = None


@pytest.mark.parametrize("fault", ["full", "fsize"])
async def test_full_disk_refuses_retryably_keeps_what_it_took_and_recovers(tmp_path: Path, fault: str) -> None:
    """Before: ingest answered UNKNOWN (clients drop), 4,680 of 6,620 acknowledged spans were not
    exported until a restart, and the queue gauge said 0. Now the client hears UNAVAILABLE (HTTP:
    503 with Retry-After) and retries, decided spans that could not be queued are held and counted
    in the gauge, /readyz says 503 while storage fails, and once space is back all is delivered."""
    backend = FakeBackend()
    endpoint = await backend.start()
    with DiskFault(fault, tmp_path / "disk") as disk_fault:
        disk = disk_fault.path
        exporter = {"endpoint": endpoint, "state_dir": str(disk / "state"),
                    "retry": {"initial_interval": 0.05, "max_interval": 0.2}}  # fmt: skip
        processor = Processor(config(tmp_path, endpoint, assembly={"idle_timeout": 0.5, "tick": 0.05},
                                     exporters={"otlp": exporter}))  # fmt: skip
        await processor.start()
        try:
            assert processor.metrics_port and processor.grpc_port and processor.http_port
            # Taken while there is room; decided after the disk filled up.
            early = [big_call(100_000) for _ in range(10)]
            later = [big_call(200_000) for _ in range(20)]
            sent = {i for r in [*early, *later] for i in span_ids(r)}
            with HealthProbe(processor.metrics_port) as probe:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}") as channel:
                    stub = TraceServiceStub(channel)
                    for request in early:
                        await stub.Export(request, timeout=5)
                    disk_fault.break_()
                    deadline = time.monotonic() + 30
                    clients = [asyncio.create_task(export_retrying(stub, r, deadline)) for r in later]
                    not_ready = False

                    async def storage_failing() -> bool:
                        nonlocal not_ready
                        not_ready = not_ready or await readyz(processor.metrics_port) == 503  # type: ignore[arg-type]
                        text = await metrics_text(processor.metrics_port)  # type: ignore[arg-type]
                        # The early traces are decided now; their spans cannot be queued: held.
                        return not_ready and metric(text, "plumb_storage_errors_total", operation="queue") > 0

                    while not await storage_failing():
                        assert time.monotonic() < deadline, "storage never failed"
                        await asyncio.sleep(0.05)
                    text = await metrics_text(processor.metrics_port)
                    assert metric(text, "plumb_export_queue_spans") > 0, "held spans are in the queue gauge"
                    assert metric(text, "plumb_storage_errors_total", operation="journal") > 0
                    async with aiohttp.ClientSession() as session:
                        url = f"http://127.0.0.1:{processor.http_port}/v1/traces"
                        body = big_call(300_000).SerializeToString()
                        headers = {"Content-Type": "application/x-protobuf"}
                        async with session.post(url, data=body, headers=headers) as r:
                            assert r.status == 503 and r.headers.get("Retry-After"), r.status
                    # Space comes back: every client gets through, the held spans are written.
                    disk_fault.heal()
                    refusals = await asyncio.gather(*clients)
                await wait_until(lambda: set(backend.accepted) == sent, 20, "every acknowledged span delivered")
                text = await assert_drained_and_balanced(processor.metrics_port)
                for _ in range(40):
                    if await readyz(processor.metrics_port) == 200:
                        break
                    await asyncio.sleep(0.1)
                assert await readyz(processor.metrics_port) == 200, "ready again once storage works"
            probe.check()
            assert any(refusals), "some requests were refused while the disk was full"
            assert {code for r in refusals for code in r} == {"UNAVAILABLE"}
            assert set(backend.accepted.values()) == {1}
            assert metric(text, "plumb_storage_errors_total") > 0
        finally:
            await processor.stop(grace=2)
            await backend.stop()


# ---- a corrupt queue file -------------------------------------------------------------------------


def _cli_args(tmp_path: Path, endpoint: str, *extra: str) -> list[str]:
    cfg = tmp_path / "otel-plumb.yaml"
    cfg.write_text(
        "assembly: {idle_timeout: 200ms, tick: 50ms}\n"
        "exporters:\n  otlp:\n    endpoint: grpc://127.0.0.1:1\n"
        "    retry: {initial_interval: 50ms, max_interval: 200ms}\n" + "".join(extra)
    )
    return [
        "--config", str(cfg), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
        "--export-otlp", endpoint, "--state-dir", str(tmp_path / "state"),
    ]  # fmt: skip


async def _stop_cli(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    return await asyncio.to_thread(proc.wait, 20)


async def _export(port: int, requests: list[ExportTraceServiceRequest]) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = TraceServiceStub(channel)
        for request in requests:
            await stub.Export(request, timeout=5)


async def test_corrupt_queue_file_is_moved_aside_and_a_fresh_queue_started(tmp_path: Path) -> None:
    """Before: exit 1 with a traceback. Now: a loud log line, plumb_queue_reset_total, the file
    kept as <name>.corrupt-<timestamp>, and the processor runs on a fresh queue."""
    backend = FakeBackend()
    endpoint = await backend.start()
    proc, ports, log = await asyncio.to_thread(start_cli, _cli_args(tmp_path, endpoint))
    try:
        await _export(ports["grpc"], [trace_request()])
        await wait_until(lambda: len(backend.accepted) == 5, 10, "the first run's spans delivered")
        assert await _stop_cli(proc) == 0, "".join(log)
        queue = tmp_path / "state" / "otlp-queue.sqlite"
        assert queue.exists()
        with open(queue, "r+b") as f:
            f.write(os.urandom(queue.stat().st_size))
        proc, ports, log = await asyncio.to_thread(start_cli, _cli_args(tmp_path, endpoint))
        with HealthProbe(ports["metrics"]) as probe:
            requests = [trace_request() for _ in range(3)]
            await _export(ports["grpc"], requests)
            sent = {i for r in requests for i in span_ids(r)}
            await wait_until(lambda: sent <= set(backend.accepted), 10, "spans delivered through the fresh queue")
            text = await assert_drained_and_balanced(ports["metrics"])
        probe.check()
        assert metric(text, "plumb_queue_reset_total") == 1
        assert any("EXPORT QUEUE CORRUPT" in line for line in log), "".join(log)
        assert not any("Traceback" in line for line in log), "".join(log)
        aside = list((tmp_path / "state").glob("otlp-queue.sqlite.corrupt-*"))
        assert [p.name for p in aside if not p.name.endswith(("-wal", "-shm", "-segments"))], aside
        # Its segment files go with it: a fresh index must not point into them.
        assert [p for p in aside if p.name.endswith("-segments") and p.is_dir()], aside
        assert await _stop_cli(proc) == 0, "".join(log)
    finally:
        proc.kill()
        await backend.stop()


async def test_a_damaged_batch_is_reported_and_not_sent_and_the_rest_is_after_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A queued batch whose bytes in its segment no longer match its checksum (what an OS crash
    can leave) is never sent as spans: it is logged, counted as a read failure and as dropped
    spans, and every other queued batch still reaches the backend."""
    down = True

    async def answer(_request: ExportTraceServiceRequest, _call: int) -> Refusal | None:
        return (grpc.StatusCode.UNAVAILABLE, "down", ()) if down else None

    backend = FakeBackend(answer)
    endpoint = await backend.start()
    state = tmp_path / "state"
    processor = Processor(config(tmp_path, endpoint))
    await processor.start()
    try:
        assert processor.exporter is not None
        exporter = processor.exporter
        for queued, request in enumerate([trace_request() for _ in range(3)], start=1):
            await processor.ingest(ReceivedRequest.of(request), "grpc")  # decided alone: a batch of its own
            await wait_until(lambda: exporter.queued_spans == 5 * queued, 10, "the trace queued")  # noqa: B023
    finally:
        await processor.stop(grace=0.2)
    with sqlite3.connect(state / "otlp-queue.sqlite") as db:
        rows = db.execute("SELECT segment, offset, length FROM batch_entries ORDER BY id").fetchall()
    assert len(rows) == 3
    [segment_file] = (state / "otlp-queue.sqlite-segments" / "batches").glob("*.seg")
    spans = []
    with open(segment_file, "r+b") as f:
        for _segment, offset, length in rows:
            f.seek(offset)
            spans.append(set(span_ids(ExportTraceServiceRequest.FromString(f.read(length)))))
        f.seek(rows[1][1] + rows[1][2] // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))

    down = False
    backend.arrived.clear()  # what the refused calls carried
    processor = Processor(config(tmp_path, endpoint))
    await processor.start()
    try:
        assert processor.metrics_port
        await wait_until(lambda: set(backend.accepted) == spans[0] | spans[2], 10, "the intact batches sent")
        text = await metrics_text(processor.metrics_port)
        assert metric(text, "plumb_storage_errors_total", operation="batches_read") == 1
        assert metric(text, "plumb_spans_dropped_total", reason="export_unreadable") == 5
        assert metric(text, "plumb_export_queue_spans") == 0
        assert not spans[1] & set(backend.arrived), "no span of the damaged batch was sent"
        assert any(
            "UNREADABLE BATCHES" in r.getMessage() and "checksum mismatch" in r.getMessage() for r in caplog.records
        )
    finally:
        await processor.stop(grace=1)
        await backend.stop()


async def test_a_journaled_request_this_version_cannot_read_is_reported_and_dropped_not_a_failed_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes read back intact from the journal that are no request (written by another version):
    the processor starts, reports them once and drops them, and takes requests as before."""
    backend = FakeBackend()
    endpoint = await backend.start()
    processor = Processor(config(tmp_path, endpoint))
    await processor.start()
    try:
        assert processor.exporter is not None
        await processor.exporter.journal(b"\xff\xff\xff not a request")
    finally:
        await processor.stop(grace=0.2)
    try:
        for start in range(2):
            processor = Processor(config(tmp_path, endpoint, assembly={"idle_timeout": 0.1, "tick": 0.05}))
            await processor.start()
            try:
                assert processor.metrics_port
                request = trace_request()
                await processor.ingest(ReceivedRequest.of(request), "grpc")
                await wait_until(lambda: set(span_ids(request)) <= set(backend.accepted), 10, "the new trace sent")  # noqa: B023
                text = await metrics_text(processor.metrics_port)
                # Reported on the first start only: it was dropped then.
                assert metric(text, "plumb_storage_errors_total", operation="journal_read") == (1 - start)
            finally:
                await processor.stop(grace=1)
    finally:
        await backend.stop()
    unreadable = [r.getMessage() for r in caplog.records if "UNREADABLE JOURNAL" in r.getMessage()]
    assert len(unreadable) == 1 and "not an ExportTraceServiceRequest" in unreadable[0], unreadable


# ---- at-least-once: a slow backend, SIGKILL with sends in flight ---------------------------------


async def test_slow_backend_duplicates_only_what_it_answered_late(tmp_path: Path) -> None:
    """The documented guarantee is at-least-once: a backend that keeps a request but answers
    after the exporter's timeout gets it again. Every acknowledged span arrives; the duplicates
    are exactly the spans of the late answers."""
    late: Counter[bytes] = Counter()

    async def answer(request: ExportTraceServiceRequest, call: int) -> Refusal | None:
        if call <= 2:
            late.update(span_ids(request))
            await asyncio.sleep(0.6)  # beyond the timeout: the exporter has given up on this call
        return None

    backend = FakeBackend(answer, store_first=True)
    endpoint = await backend.start()
    processor = Processor(config(tmp_path, endpoint, exporters={"otlp": {
        "endpoint": endpoint, "state_dir": str(tmp_path / "state"), "timeout": 0.2,
        "retry": {"initial_interval": 0.05, "max_interval": 0.2}, "queue": {"batch_spans": 10},
    }}))  # fmt: skip
    await processor.start()
    try:
        assert processor.metrics_port
        requests = [trace_request(tools=4) for _ in range(8)]
        sent = {i for r in requests for i in span_ids(r)}
        with HealthProbe(processor.metrics_port) as probe:
            for request in requests:
                await processor.ingest(ReceivedRequest.of(request), "grpc")
            await wait_until(lambda: set(backend.accepted) == sent, 15, "every span delivered")
            text = await assert_drained_and_balanced(processor.metrics_port)
        probe.check()
        duplicates = {i: n for i, n in backend.accepted.items() if n > 1}
        assert set(duplicates) == set(late) and late, "the duplicates are the spans answered late"
        assert all(n == 2 for n in duplicates.values())
        assert metric(text, "plumb_export_spans_total", outcome="sent") == len(sent)
    finally:
        await processor.stop(grace=2)
        await backend.stop()


async def test_sigkill_with_sends_in_flight_duplicates_at_most_what_was_in_flight(tmp_path: Path) -> None:
    """kill -9 while the backend holds requests unanswered: after the restart those batches are
    sent again (they were never acknowledged), so the backend may see them twice; nothing else
    is duplicated and nothing acknowledged is lost."""
    release = asyncio.Event()

    async def hold(_request: ExportTraceServiceRequest, _call: int) -> Refusal | None:
        await release.wait()
        return None

    backend = FakeBackend(hold, store_first=True)
    port = free_port()
    endpoint = await backend.start(port)
    requests = [trace_request(tools=4) for _ in range(20)]
    sent = {i for r in requests for i in span_ids(r)}
    extra = "    queue: {batch_spans: 10, concurrency: 2}\n"
    proc, ports, log = await asyncio.to_thread(start_cli, _cli_args(tmp_path, endpoint, extra))
    try:
        await _export(ports["grpc"], requests)
        await wait_until(lambda: backend.calls >= 2, 10, "both senders' batches held at the backend")
        in_flight = set(backend.arrived)
        assert await asyncio.to_thread(lambda: (proc.kill(), proc.wait(10))[1]) == -signal.SIGKILL
        # The backend kept what it held; its answers come too late (the sender is gone).
        release.set()
        backend.answer = None
        proc, ports, log = await asyncio.to_thread(start_cli, _cli_args(tmp_path, endpoint, extra))
        await wait_until(lambda: set(backend.accepted) == sent, 20, "every acknowledged span delivered")
        await wait_until(
            lambda: metric(scrape(ports["metrics"]), "plumb_export_queue_spans") == 0, 10, "the queue drained"
        )
        assert await _stop_cli(proc) == 0, "".join(log)
    finally:
        proc.kill()
        await backend.stop()
    duplicates = {i for i, n in backend.accepted.items() if n > 1}
    assert duplicates <= in_flight, "only what was in flight at the kill is sent twice"
    assert max(backend.accepted.values()) <= 2
    assert len(in_flight) <= 2 * 10, "bounded by concurrency x batch_spans"
