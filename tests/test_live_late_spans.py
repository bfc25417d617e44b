"""Spans of one trace from two processes, over the real OTLP exporters: the agent's process
sends its spans (the root among them) at once, the sub-agent's process later than
``idle_timeout``, as a BatchSpanProcessor does. A failure such a late span clears is held for
``confirm_wait`` and never reported; a failure it does not clear is reported after the wait."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import set_span_in_context
from test_live_support import config, metric, scrape, wait_until, watch_records

from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.export.otlp import StorageError
from otel_plumb.processor import Processor
from otel_plumb.receive.otlp import ReceivedRequest

POLICY = """
policy: checks
invariants:
  - {id: dup-check, must_call: check_duplicate}
"""


def _provider(port: int, service: str, *, at_once: bool) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
    # The sub-agent's process: its batch goes when the test flushes it (its schedule delay is long).
    if at_once:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
    return provider


def run_agent(port: int, *, sub_agent_checks: bool) -> TracerProvider:
    """The agent (its own process's provider) asks a sub-agent in another process to check the
    invoice; that sub-agent calls check_duplicate if ``sub_agent_checks``. Returns the
    sub-agent's provider, its spans not yet sent."""
    front, checker = _provider(port, "ap-front", at_once=True), _provider(port, "ap-checker", at_once=False)
    agent, remote = front.get_tracer("ap-front"), checker.get_tracer("ap-checker")
    invoke = {"gen_ai.operation.name": "invoke_agent"}
    with agent.start_as_current_span("invoke_agent ap-agent", attributes={**invoke, "gen_ai.agent.name": "ap-agent"}):
        tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "ask_checker"}
        with agent.start_as_current_span("execute_tool ask_checker", attributes=tool) as ask:
            # The sub-agent's spans: children of the tool call, recorded by the other process.
            sub = {**invoke, "gen_ai.agent.name": "checker"}
            with remote.start_as_current_span("invoke_agent checker", set_span_in_context(ask), attributes=sub):
                name = "check_duplicate" if sub_agent_checks else "lookup_vendor"
                tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
                with remote.start_as_current_span(f"execute_tool {name}", attributes=tool):
                    pass
    front.shutdown()
    return checker


async def _run(tmp_path: Path, *, confirm_wait: float, sub_agent_checks: bool) -> tuple[list[dict[str, Any]], str]:
    path = tmp_path / "checks.yaml"
    path.write_text(POLICY)
    processor = Processor(config(tmp_path, policies=[str(path)], assembly={"confirm_wait": confirm_wait}))
    await processor.start()
    try:
        async with watch_records(processor) as records:
            checker = await asyncio.to_thread(run_agent, processor.grpc_port or 0, sub_agent_checks=sub_agent_checks)
            if confirm_wait:
                await wait_until(lambda: processor.intake.traces_waiting == 1, 10, "the failing trajectory to wait")
                assert records == []  # nothing said of it while it waits
                waiting = await asyncio.to_thread(scrape, processor.metrics_port)
                assert metric(waiting, "plumb_traces_waiting") == 1 and metric(waiting, "plumb_violations_total") == 0
            else:
                await wait_until(lambda: records, 10, "the verdict without the sub-agent's spans")
            await asyncio.to_thread(checker.shutdown)  # the other process's batch, late
            await wait_until(lambda: any(r["decision"] == "final" for r in records), 10, "the final verdict")
            text = await asyncio.to_thread(scrape, processor.metrics_port)
    finally:
        await processor.stop()
    return records, text


async def test_a_late_span_that_clears_the_failure_is_waited_for(tmp_path: Path) -> None:
    records, text = await _run(tmp_path, confirm_wait=5.0, sub_agent_checks=True)
    assert [(r["decision"], r["status"]) for r in records] == [("final", "conformant")]
    assert metric(text, "plumb_violations_total") == 0
    assert metric(text, "plumb_spans_unchecked_total") == 0  # no span was late for its verdict
    assert metric(text, "plumb_confirm_waits_total", kind="final", outcome="cleared") == 1
    assert metric(text, "plumb_traces_waiting") == 0


async def test_without_the_wait_the_verdict_misses_the_sub_agents_call(tmp_path: Path) -> None:
    # What the wait prevents: a page for a call that happened.
    records, text = await _run(tmp_path, confirm_wait=0, sub_agent_checks=True)
    assert [(r["decision"], r["status"]) for r in records] == [("final", "violating")]
    assert metric(text, "plumb_spans_unchecked_total", reason="late") == 2


async def test_a_failure_no_late_span_clears_is_reported_after_the_wait(tmp_path: Path) -> None:
    records, text = await _run(tmp_path, confirm_wait=5.0, sub_agent_checks=False)
    assert [(r["decision"], r["status"]) for r in records] == [("final", "violating")]
    assert [v["invariant"] for v in records[0]["verdicts"] if v["verdict"] == "fail"] == ["dup-check"]
    assert metric(text, "plumb_violations_total", invariant="dup-check") == 1
    assert metric(text, "plumb_confirm_waits_total", kind="final", outcome="stood") == 1


async def test_a_late_span_of_a_trace_evicted_earlier_in_its_request_survives_a_storage_failure(
    tmp_path: Path,
) -> None:
    """One request: a span of trace T, spans of two other traces (T is evicted to make room:
    max_traces 2), then another span of T, late. The late span goes out in the same write as
    T's decision. Storage fails for every write after that one and still fails at shutdown; the
    next start replays the journaled request: every span reaches the backend once."""
    backend = OtlpBackend()
    await backend.start(0)
    request = ExportTraceServiceRequest()
    trace_ids = [bytes([n]) * 16 for n in (1, 2, 3, 1)]  # T, X, Y, T again
    for n, trace_id in enumerate(trace_ids):
        rs = request.resource_spans.add()
        rs.resource.attributes.add(key="service.name").value.string_value = "svc"
        rs.scope_spans.add().spans.add(
            trace_id=trace_id, span_id=bytes([n + 1]) * 8, name=f"span {n}", start_time_unix_nano=1_000,
            end_time_unix_nano=2_000,
        )  # fmt: skip
    sent = {bytes([n + 1]) * 8 for n in range(4)}
    cfg = config(tmp_path, backend.endpoint, assembly={"max_traces": 2, "confirm_wait": 0})
    processor = Processor(cfg)
    await processor.start()
    writes = 0
    submit = processor.exporter.submit  # type: ignore[union-attr]

    async def filling_up(*args: Any, **kwargs: Any) -> None:
        nonlocal writes
        writes += 1
        if writes > 1:  # the disk is full from the second write on
            raise StorageError("queue", OSError(28, "No space left on device"))
        await submit(*args, **kwargs)

    processor.exporter.submit = filling_up  # type: ignore[union-attr,method-assign]
    try:
        await processor.ingest(ReceivedRequest.parse(request.SerializeToString()), "grpc")
    finally:
        await processor.stop(1.0)  # the other traces are held: storage still fails
    processor = Processor(cfg)
    await processor.start()  # the journal replays the request
    try:
        await wait_until(lambda: {s.span_id for s in backend.spans()} == sent, 15, "every span forwarded")
    finally:
        await processor.stop()
        await backend.stop()
    assert sorted(s.span_id for s in backend.spans()) == sorted(sent), "each span once"
