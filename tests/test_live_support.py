"""Helpers for the live processor tests (no tests here): configs on free loopback ports, an
instrumented agent on the real OTLP exporters, /metrics scraping, and waiting with deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from otel_plumb.demo.agent import INVOICES, run_all
from otel_plumb.model import Decided
from otel_plumb.processor import Processor, ProcessorConfig, load_config

ROOT_KEYS = ("plumb.verdict", "plumb.policy", "plumb.violations.count", "plumb.violations.ids")
ANNOTATION_KEYS = frozenset((*ROOT_KEYS, "plumb.violation.ids"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(tmp_path: Path, backend_endpoint: str | None = None, **sections: Any) -> ProcessorConfig:
    data: dict[str, Any] = {
        "receivers": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}},
        "metrics": {"endpoint": "127.0.0.1:0"},
        "assembly": {"idle_timeout": 0.3, "confirm_wait": 0.3, "tick": 0.05},
        "verdict_log": {"path": str(tmp_path / "verdicts.jsonl")},
        "shutdown": {"grace_period": 5},
    }
    if backend_endpoint is not None:
        data["exporters"] = {
            "otlp": {"endpoint": backend_endpoint, "state_dir": str(tmp_path / "state"),
                     "retry": {"initial_interval": 0.05, "max_interval": 0.2}}
        }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return load_config(None, data)


def agent_provider(port: int, protocol: str = "grpc") -> tuple[TracerProvider, InMemorySpanExporter]:
    """A TracerProvider exporting to the processor over the real OTLP exporter, and a copy of
    every span it sent (to compare with what arrives downstream)."""
    provider = TracerProvider(resource=Resource.create({"service.name": f"ap-service-{protocol}"}))
    exporter: GrpcSpanExporter | HttpSpanExporter
    if protocol == "grpc":
        exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
    else:
        exporter = HttpSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=50))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def run_agent(provider: TracerProvider) -> None:
    """The bundled agent works through every invoice; its spans are flushed and the provider shut
    down. Blocking: call it through ``asyncio.to_thread`` from a test's event loop."""
    run_all(provider)
    provider.force_flush()
    provider.shutdown()


async def decide_demo_agent(processor: Processor, deadline: float = 30.0) -> list[Decided]:
    """The bundled agent's traces into a started processor over the real OTLP exporter; returns
    the decisions once every trajectory is decided."""
    decided: list[Decided] = []
    processor.on_decided(decided.append)
    provider, _ = agent_provider(processor.grpc_port or 0)
    await asyncio.to_thread(run_agent, provider)
    await wait_until(lambda: len(decided) == len(INVOICES), deadline, "every trajectory decided")
    return decided


@contextlib.asynccontextmanager
async def watch_records(processor: Processor) -> AsyncIterator[list[dict[str, Any]]]:
    """The records the processor's Watch stream publishes (early and final) while in the block."""
    records: list[dict[str, Any]] = []

    async def watch() -> None:
        async for record in processor.hub.subscribe():
            records.append(record)

    watching = asyncio.create_task(watch())
    try:
        yield records
    finally:
        watching.cancel()


def sent_spans(memory: InMemorySpanExporter) -> dict[str, Span]:
    """What the SDK put on the wire, by span id (hex)."""
    request = encode_spans(memory.get_finished_spans())
    return {
        span.span_id.hex(): span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
    }


def strip_annotations(span: Span) -> Span:
    """The span without the documented annotations: it must equal what the agent sent."""
    out = Span()
    out.CopyFrom(span)
    del out.attributes[:]
    out.attributes.extend(a for a in span.attributes if a.key not in ANNOTATION_KEYS)
    del out.events[:]
    out.events.extend(e for e in span.events if e.name != "plumb.violation")
    return out


def attribute(span: Span, key: str) -> Any:
    for a in span.attributes:
        if a.key == key:
            kind = a.value.WhichOneof("value")
            if kind == "array_value":
                return [v.string_value for v in a.value.array_value.values]
            return getattr(a.value, kind) if kind else None
    return None


def scrape(port: int, accept: str = "text/plain") -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=5) as resp:
        body: bytes = resp.read()
    return body.decode()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def scrape_when_sent(metrics_port: int, total: int, timeout: float = 15) -> str:
    """/metrics once the exporter counts ``total`` spans sent (the backend may have them a
    moment before the exporter has counted its acknowledgement)."""
    deadline = time.monotonic() + timeout
    while True:
        text = await asyncio.to_thread(scrape, metrics_port)
        if metric(text, "plumb_export_spans_total", outcome="sent") >= total or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.05)


async def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def start_cli(
    args: list[str],
    env: dict[str, str] | None = None,
    nofile: int | None = None,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[str], dict[str, int], list[str]]:
    """``otel-plumb run ARGS`` in a subprocess (in ``cwd``, default this one); returns it once
    listening, with its ports and its log lines (read on a thread for the process's life, so the
    pipe never fills). ``nofile`` lowers the child's open-file limit.

    The limit is set by the child's own first statement rather than a ``preexec_fn``: running
    Python between fork and exec in a process whose gRPC threads are busy can leave the child
    with gRPC's poller broken."""
    command = [sys.executable, "-m", "otel_plumb", "run", *args]
    if nofile is not None:
        command = [
            sys.executable,
            "-c",
            "import resource, runpy, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile})); "
            "sys.argv = ['otel-plumb', *sys.argv[1:]]; "
            "runpy.run_module('otel_plumb', run_name='__main__')",
            "run",
            *args,
        ]
    proc = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    lines: list[str] = []
    ports: dict[str, int] = {}
    listening = threading.Event()

    def read() -> None:
        for line in proc.stderr or ():
            lines.append(line)
            m = re.search(r"otlp grpc [\d.]+:(\d+), otlp http [\d.]+:(\d+), metrics [\d.]+:(\d+)", line)
            if m:
                ports.update(grpc=int(m.group(1)), http=int(m.group(2)), metrics=int(m.group(3)))
                listening.set()
        listening.set()  # the process ended

    threading.Thread(target=read, daemon=True).start()
    if not listening.wait(20) or not ports:
        proc.kill()
        proc.wait()
        raise AssertionError("otel-plumb run did not start:\n" + "".join(lines))
    return proc, ports, lines


class _Orders(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"order": self.path.rsplit("/", 1)[-1]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def orders_server() -> Iterator[str]:
    """A plain HTTP service on 127.0.0.1 answering every GET with a small JSON body: its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Orders)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def http_service(provider: Any, base: str, traces: Sequence[Sequence[str]]) -> None:
    """A service that is no agent: per trace, one span of its own around the real httpx
    instrumentation's client spans for each path; its spans are flushed and the provider shut
    down. Blocking: call it through ``asyncio.to_thread``."""
    import httpx
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    instrumentor = HTTPXClientInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        tracer = provider.get_tracer("orders-app")
        with httpx.Client(base_url=base) as client:
            for paths in traces:
                with tracer.start_as_current_span("sync_orders"):
                    for path in paths:
                        client.get(path).raise_for_status()
    finally:
        instrumentor.uninstrument()
    provider.force_flush()
    provider.shutdown()
