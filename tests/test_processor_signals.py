"""``otel-plumb run`` as a process: SIGTERM drains everything in flight; after SIGKILL the
on-disk queue delivers what was accepted once the processor is back."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from test_live_backpressure import trace_request
from test_live_support import (
    agent_provider,
    attribute,
    config,
    free_port,
    metric,
    run_agent,
    scrape,
    sent_spans,
    start_cli,
    strip_annotations,
    wait_until,
)

from otel_plumb.demo.agent import INVOICES
from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.demo.run import policy_path
from otel_plumb.processor import Processor
from otel_plumb.receive.otlp import ReceivedRequest


def _config(tmp_path: Path, idle_timeout: str, max_wait: str = "5m", mode: str = "annotate") -> Path:
    path = tmp_path / "otel-plumb.yaml"
    path.write_text(
        f"""
assembly:
  idle_timeout: {idle_timeout}
  max_wait: {max_wait}
  tick: 50ms
exporters:
  otlp:
    mode: {mode}
    endpoint: grpc://127.0.0.1:1   # replaced by --export-otlp
    retry: {{initial_interval: 50ms, max_interval: 200ms}}
logging: {{level: info}}
"""
    )
    return path


def _args(tmp_path: Path, idle_timeout: str, export: str, max_wait: str = "5m", mode: str = "annotate") -> list[str]:
    return [
        "--config", str(_config(tmp_path, idle_timeout, max_wait, mode)),
        "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
        "--export-otlp", export,
        "--state-dir", str(tmp_path / "state"),
        "--verdict-log", str(tmp_path / "verdicts.jsonl"),
        "--policy", str(policy_path()),
    ]  # fmt: skip


def _send(port: int) -> dict[str, object]:
    agent, memory = agent_provider(port)
    run_agent(agent)
    return dict(sent_spans(memory))


async def _restart_cutting_open_traces_short(
    tmp_path: Path, endpoint: str
) -> tuple[subprocess.Popen[str], dict[str, int], list[str]]:
    """The processor again on the same state directory, with max_wait 1s: a trace still open
    when the last one stopped is cut short (indeterminate, still exported)."""
    return await asyncio.to_thread(start_cli, _args(tmp_path, "200ms", endpoint, max_wait="1s"))


def _assert_each_once(backend: OtlpBackend, sent: set[bytes]) -> None:
    counts = Counter(s.span_id for s in backend.spans())
    assert set(counts) == sent and set(counts.values()) == {1}, "every span exactly once"


async def _stop(proc: subprocess.Popen[str], sig: signal.Signals) -> int:
    proc.send_signal(sig)
    return await asyncio.to_thread(proc.wait, 20)


async def test_sigterm_decides_and_exports_everything_in_flight(tmp_path: Path) -> None:
    backend = OtlpBackend()
    await backend.start(0)
    # idle_timeout far beyond the test: every trajectory is still in flight at SIGTERM.
    proc, ports, log = await asyncio.to_thread(start_cli, _args(tmp_path, "5m", backend.endpoint))
    try:
        sent = await asyncio.to_thread(_send, ports["grpc"])
        text = ""

        def received() -> bool:
            nonlocal text
            text = scrape(ports["metrics"])
            return metric(text, "plumb_spans_received_total") == len(sent)

        await wait_until(received, 10, "the processor to receive every span")
        assert metric(text, "plumb_traces_in_flight") == len(INVOICES)
        assert backend.span_count == 0
        assert await _stop(proc, signal.SIGTERM) == 0, "".join(log)
    finally:
        proc.kill()
        await backend.stop()
    counts = Counter(s.span_id.hex() for s in backend.spans())
    assert set(counts) == set(sent) and set(counts.values()) == {1}
    for span in backend.spans():
        assert strip_annotations(span) == sent[span.span_id.hex()]
    roots = [s for s in backend.spans() if not s.parent_span_id]
    assert sorted(attribute(r, "plumb.verdict") for r in roots) == ["conformant"] * 3 + ["violating"] * 3
    logged = [json.loads(line) for line in (tmp_path / "verdicts.jsonl").read_text().splitlines()]
    assert len(logged) == len(INVOICES) and all(r["complete"] for r in logged)


async def test_sigkill_while_backend_down_then_restart_delivers_what_was_accepted(tmp_path: Path) -> None:
    port = free_port()
    endpoint = f"grpc://127.0.0.1:{port}"
    proc, ports, log = await asyncio.to_thread(start_cli, _args(tmp_path, "200ms", endpoint))
    backend = OtlpBackend()
    try:
        sent = await asyncio.to_thread(_send, ports["grpc"])
        await wait_until(
            lambda: metric(scrape(ports["metrics"]), "plumb_export_queue_spans") == len(sent),
            10,
            "every span decided and queued on disk",
        )
        assert await _stop(proc, signal.SIGKILL) == -signal.SIGKILL
        await backend.start(port)
        proc, ports, log = await asyncio.to_thread(start_cli, _args(tmp_path, "200ms", endpoint))
        await wait_until(lambda: backend.span_count >= len(sent), 15, "the queue to be delivered after restart")
        await wait_until(
            lambda: metric(scrape(ports["metrics"]), "plumb_export_queue_spans") == 0, 5, "acknowledgements"
        )
        assert await _stop(proc, signal.SIGTERM) == 0, "".join(log)
    finally:
        proc.kill()
        await backend.stop()
    counts = Counter(s.span_id.hex() for s in backend.spans())
    assert set(counts) == set(sent) and set(counts.values()) == {1}
    roots = [s for s in backend.spans() if not s.parent_span_id]
    assert all(attribute(r, "plumb.verdict") in ("conformant", "violating") for r in roots)


async def test_sigkill_with_trajectories_in_flight_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """One request holds three complete traces (decided and queued on disk while the backend is
    down) and one still open (no root yet, only in the receive journal). After kill -9 and a
    restart, the queue and the journal deliver every span exactly once."""
    request = ExportTraceServiceRequest()
    for _ in range(3):
        request.MergeFrom(trace_request(tools=4))
    open_trace = trace_request(tools=3)
    del open_trace.resource_spans[0].scope_spans[0].spans[0]  # the root has not ended yet
    request.MergeFrom(open_trace)
    sent = {s.span_id for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans}
    assert len(sent) == 18
    port = free_port()
    endpoint = f"grpc://127.0.0.1:{port}"
    proc, ports, log = await asyncio.to_thread(start_cli, _args(tmp_path, "200ms", endpoint))
    backend = OtlpBackend()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports['grpc']}") as channel:
            await TraceServiceStub(channel).Export(request, timeout=10)
        await wait_until(
            lambda: metric(scrape(ports["metrics"]), "plumb_export_queue_spans") == 15, 10, "complete traces queued"
        )
        assert await _stop(proc, signal.SIGKILL) == -signal.SIGKILL
        await backend.start(port)
        proc, ports, log = await _restart_cutting_open_traces_short(tmp_path, endpoint)
        await wait_until(lambda: backend.span_count >= len(sent), 15, "queue and journal delivered")
        assert await _stop(proc, signal.SIGTERM) == 0, "".join(log)
    finally:
        proc.kill()
        await backend.stop()
    _assert_each_once(backend, sent)
    verdicts = [attribute(s, "plumb.verdict") for s in backend.spans() if attribute(s, "plumb.verdict")]
    # The policy applies to services "ap-*" only: these trajectories are unchecked, never "conformant".
    assert sorted(verdicts) == ["unchecked"] * 4


async def _export(port: int, request: ExportTraceServiceRequest) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await TraceServiceStub(channel).Export(request, timeout=10)


def _verdict_log(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "verdicts.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["annotate", "passthrough"])
async def test_a_resend_after_a_restart_is_a_duplicate_not_a_second_trajectory(tmp_path: Path, mode: str) -> None:
    """A client resends a request whose acknowledgement it did not get, to the processor
    restarted in between (a deploy): the trace was decided and forwarded by the first run, so
    its spans are duplicates, not a second trajectory made of them and forwarded again."""
    request = trace_request(tools=3)
    sent = {s.span_id for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans}
    backend = OtlpBackend()
    await backend.start(0)
    args = _args(tmp_path, "200ms", backend.endpoint, mode=mode)
    proc, ports, log = await asyncio.to_thread(start_cli, args)
    try:
        await _export(ports["grpc"], request)
        await wait_until(lambda: metric(scrape(ports["metrics"]), "plumb_trajectories_total") == 1, 10, "a decision")
        await wait_until(lambda: backend.span_count >= len(sent), 10, "the trace forwarded")
        # Acknowledged, so that no export is resent by the next run (export is at-least-once).
        await wait_until(lambda: metric(scrape(ports["metrics"]), "plumb_export_queue_spans") == 0, 10, "acks")
        assert await _stop(proc, signal.SIGTERM) == 0, "".join(log)
        proc, ports, log = await asyncio.to_thread(start_cli, args)
        await _export(ports["grpc"], request)
        await wait_until(
            lambda: metric(scrape(ports["metrics"]), "plumb_spans_dropped_total", reason="duplicate") == len(sent),
            10,
            "the resent spans counted as duplicates",
        )
        assert await _stop(proc, signal.SIGTERM) == 0, "".join(log)  # drains whatever it buffered
    finally:
        proc.kill()
        await backend.stop()
    counts = Counter(s.span_id for s in backend.spans() if s.span_id in sent)  # passthrough adds verdict spans
    assert set(counts) == sent and set(counts.values()) == {1}, "every span exactly once"
    assert len(_verdict_log(tmp_path)) == 1, "one trajectory, decided by the first run"
    assert len(backend.spans()) == len(sent) + (mode == "passthrough"), "one verdict span, in passthrough"


async def test_a_journaled_resend_replayed_after_sigkill_is_a_duplicate(tmp_path: Path) -> None:
    """A request holds a resend of a trace decided already and the spans of a trace still open.
    After kill -9, the journal replays that request: the decided trace's spans are duplicates
    (not forwarded again, no second trajectory of them), the open trace is decided once."""
    decided = trace_request(tools=3)
    open_trace = trace_request(tools=2)
    del open_trace.resource_spans[0].scope_spans[0].spans[0]  # the root has not ended yet
    mixed = ExportTraceServiceRequest()
    mixed.MergeFrom(decided)
    mixed.MergeFrom(open_trace)
    sent = {s.span_id for rs in mixed.resource_spans for ss in rs.scope_spans for s in ss.spans}
    backend = OtlpBackend()
    await backend.start(0)
    proc, ports, log = await asyncio.to_thread(start_cli, _args(tmp_path, "200ms", backend.endpoint))
    try:
        await _export(ports["grpc"], decided)
        await wait_until(lambda: backend.span_count >= 4, 10, "the first trace decided and forwarded")
        await wait_until(lambda: metric(scrape(ports["metrics"]), "plumb_export_queue_spans") == 0, 10, "acks")
        await _export(ports["grpc"], mixed)
        await wait_until(
            lambda: metric(scrape(ports["metrics"]), "plumb_traces_in_flight") == 1, 10, "the open trace buffered"
        )
        assert await _stop(proc, signal.SIGKILL) == -signal.SIGKILL
        proc, ports, log = await _restart_cutting_open_traces_short(tmp_path, backend.endpoint)
        await wait_until(lambda: backend.span_count >= len(sent), 15, "the open trace decided and forwarded")
        assert await _stop(proc, signal.SIGTERM) == 0, "".join(log)
    finally:
        proc.kill()
        await backend.stop()
    _assert_each_once(backend, sent)
    assert sorted(len(r["steps"]) for r in _verdict_log(tmp_path)) == [2, 4], "each trace decided once"


async def test_a_second_processor_on_the_same_port_or_state_dir_refuses_to_start(tmp_path: Path) -> None:
    proc, ports, log = await asyncio.to_thread(start_cli, _args(tmp_path, "1s", "grpc://127.0.0.1:1"))
    try:
        same_port = [
            *_args(tmp_path, "1s", "grpc://127.0.0.1:1"),
            *("--grpc", f"127.0.0.1:{ports['grpc']}", "--state-dir", str(tmp_path / "other-state")),
        ]
        same_state = _args(tmp_path, "1s", "grpc://127.0.0.1:1")
        for args, message in ((same_port, "cannot listen on"), (same_state, "used by another otel-plumb process")):
            second = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "otel_plumb", "run", *args],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert second.returncode == 2 and message in second.stderr, second.stderr
        assert await _stop(proc, signal.SIGTERM) == 0, "".join(log)
    finally:
        proc.kill()


async def test_stop_while_the_tick_hands_on_decisions_still_exports_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopping while the tick is queueing decided trajectories for export lets it finish:
    their spans reach the backend at shutdown, not at the next start."""
    backend = OtlpBackend()
    await backend.start(0)
    processor = Processor(config(tmp_path, backend.endpoint, assembly={"idle_timeout": 0.05, "tick": 0.02}))
    await processor.start()
    entered, go_on = asyncio.Event(), asyncio.Event()
    submit = processor._submit

    async def slow_submit(*args: Any, **kwargs: Any) -> None:
        entered.set()
        await go_on.wait()
        await submit(*args, **kwargs)

    monkeypatch.setattr(processor, "_submit", slow_submit)
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    root = spans.add(trace_id=b"T" * 16, span_id=b"R" * 8, name="GET /", start_time_unix_nano=1, end_time_unix_nano=9)
    spans.add(trace_id=b"T" * 16, span_id=b"C" * 8, parent_span_id=root.span_id, name="SELECT", start_time_unix_nano=2)
    try:
        await processor.ingest(ReceivedRequest.of(request), "grpc")
        async with asyncio.timeout(10):
            await entered.wait()  # the tick decided the trace and is handing it on
        stopping = asyncio.create_task(processor.stop(grace=10))
        await wait_until(lambda: processor._stopping, 5, "stop under way")
        go_on.set()
        assert await stopping
    finally:
        go_on.set()
        await processor.stop()
        await backend.stop()
    assert sorted(s.span_id for s in backend.spans()) == [b"C" * 8, b"R" * 8]
