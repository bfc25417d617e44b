"""Early verdicts over the real OTLP exporter: the SDK exports each span when it ends (here one
request per span, the finest split), so of two tool calls run in parallel the one that started
first may arrive last. A ``precedes`` failure seen before it arrives is not reported."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import set_span_in_context
from test_live_support import config, metric, scrape, wait_until

from otel_plumb.processor import Processor

POLICY = """
policy: order
invariants:
  - {id: lookup-before-pay, precedes: {first: lookup_invoice, then: schedule_payment}}
"""


def _tool(tracer: Any, parent: Any, name: str, start: int, end: int) -> None:
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
    span = tracer.start_span(f"execute_tool {name}", set_span_in_context(parent), start_time=start,
                             attributes=attributes)
    span.end(end_time=end)


def _chat(tracer: Any, parent: Any, start: int, end: int) -> None:
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "demo-model"}
    span = tracer.start_span("chat demo-model", set_span_in_context(parent), start_time=start, attributes=attributes)
    span.end(end_time=end)


def run_parallel_agent(port: int, *, lookup_first: bool) -> None:
    """One agent run: a model turn, then lookup_invoice and schedule_payment in parallel
    (lookup_invoice started first, if ``lookup_first``, and ends last), then the model again."""
    provider = TracerProvider(resource=Resource.create({"service.name": "ap-parallel"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)))
    tracer = provider.get_tracer("ap-parallel")
    ms = 1_000_000
    t0 = 1_700_000_000_000 * ms
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "ap-agent"}
    root = tracer.start_span("invoke_agent ap-agent", start_time=t0, attributes=attributes)
    _chat(tracer, root, t0 + 1 * ms, t0 + 5 * ms)
    lookup, pay = (t0 + 6 * ms, t0 + 7 * ms) if lookup_first else (t0 + 7 * ms, t0 + 6 * ms)
    _tool(tracer, root, "schedule_payment", pay, t0 + 9 * ms)  # ends first, so exported first
    _tool(tracer, root, "lookup_invoice", lookup, t0 + 20 * ms)
    _chat(tracer, root, t0 + 21 * ms, t0 + 25 * ms)
    root.end(end_time=t0 + 30 * ms)
    provider.shutdown()


async def _run(tmp_path: Path, *, lookup_first: bool) -> tuple[list[dict[str, Any]], str]:
    """The records the Watch stream published for the run (early and final), and the metrics."""
    path = tmp_path / "order.yaml"
    path.write_text(POLICY)
    processor = Processor(config(tmp_path, policies=[str(path)]))
    records: list[dict[str, Any]] = []

    async def watch() -> None:
        async for record in processor.hub.subscribe():
            records.append(record)

    await processor.start()
    watching = asyncio.create_task(watch())
    try:
        await asyncio.to_thread(run_parallel_agent, processor.grpc_port or 0, lookup_first=lookup_first)
        await wait_until(lambda: any(r["decision"] == "final" for r in records), 10, "the final verdict")
        text = await asyncio.to_thread(scrape, processor.metrics_port)
    finally:
        watching.cancel()
        await processor.stop()
    return records, text


async def test_a_parallel_call_that_started_first_and_arrives_last_is_waited_for(tmp_path: Path) -> None:
    records, text = await _run(tmp_path, lookup_first=True)
    assert [(r["decision"], r["status"]) for r in records] == [("final", "conformant")]
    assert metric(text, "plumb_violations_total") == 0


async def test_the_failure_is_reported_early_once_the_turn_is_over(tmp_path: Path) -> None:
    # schedule_payment started first: the failure is real, and the next model call shows the
    # turn is over before the root arrives.
    records, text = await _run(tmp_path, lookup_first=False)
    assert [(r["decision"], r["status"]) for r in records] == [("early", "violating"), ("final", "violating")]
    assert [v["invariant"] for v in records[0]["verdicts"]] == ["lookup-before-pay"]
    assert metric(text, "plumb_violations_total", invariant="lookup-before-pay") == 1
