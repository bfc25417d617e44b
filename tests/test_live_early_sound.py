"""Early verdicts over the real OTLP exporter: the SDK exports each span when it ends (here one
request per span, the finest split), so of two tool calls run in parallel the one that started
first may arrive last. A ``precedes`` failure seen before it arrives is not reported; one that
holds is, while the run is still going (once it has held for ``confirm_wait``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import set_span_in_context
from test_live_support import config, metric, scrape, wait_until, watch_records

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


def start_parallel_agent(tracer: Any, *, lookup_first: bool, pay_only: bool = False,
                         lookup_ends_first: bool = False) -> tuple[Any, int]:  # fmt: skip
    """One agent run up to its root: a model turn, then lookup_invoice and schedule_payment in
    parallel (lookup_invoice started first, if ``lookup_first``, and ended last unless
    ``lookup_ends_first``; left out with ``pay_only``), then the model again. Returns the root,
    not ended, and when it ends."""
    ms = 1_000_000
    t0 = 1_700_000_000_000 * ms
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "ap-agent"}
    root = tracer.start_span("invoke_agent ap-agent", start_time=t0, attributes=attributes)
    _chat(tracer, root, t0 + 1 * ms, t0 + 5 * ms)
    lookup, pay = (t0 + 6 * ms, t0 + 7 * ms) if lookup_first else (t0 + 7 * ms, t0 + 6 * ms)
    # Each ends (and is exported, one request per span) in the order they end.
    calls = [("schedule_payment", pay, t0 + 9 * ms)]
    if not pay_only:
        calls.append(("lookup_invoice", lookup, t0 + (8 if lookup_ends_first else 20) * ms))
    for name, start, end in sorted(calls, key=lambda c: c[2]):
        _tool(tracer, root, name, start, end)
    _chat(tracer, root, t0 + 21 * ms, t0 + 25 * ms)
    return root, t0 + 30 * ms


class HeldBack(SpanExporter):
    """The real exporter, with the first ``held`` spans sent after the two that follow them:
    a batch that failed and was sent again after the next one (a sender's retry)."""

    def __init__(self, exporter: SpanExporter, held: int) -> None:
        self.exporter, self.held, self.waiting = exporter, held, list[ReadableSpan]()
        self.after = 2

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if len(self.waiting) < self.held:
            self.waiting.extend(spans)
            return SpanExportResult.SUCCESS
        result = self.exporter.export(spans)
        self.after -= 1
        if self.waiting and self.after == 0:
            result, self.waiting, self.held = self.exporter.export(self.waiting), [], 0
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()


async def _run(tmp_path: Path, *, lookup_first: bool, held: int = 0, confirm_wait: float = 0.3,
               lookup_ends_first: bool = False) -> tuple[list[dict[str, Any]], str]:  # fmt: skip
    """The records the Watch stream published (early and final) for the run and for a second
    run that pays without a lookup, and the metrics. The roots end once the second run's early
    verdict is out: the first run's, if any, is out by then."""
    path = tmp_path / "order.yaml"
    path.write_text(POLICY)
    processor = Processor(config(tmp_path, policies=[str(path)], assembly={"confirm_wait": confirm_wait}))
    provider = TracerProvider(resource=Resource.create({"service.name": "ap-parallel"}))
    await processor.start()
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{processor.grpc_port}", insecure=True)
    provider.add_span_processor(SimpleSpanProcessor(HeldBack(exporter, held)))
    tracer = provider.get_tracer("ap-parallel")
    try:
        async with watch_records(processor) as records:
            run, end = await asyncio.to_thread(start_parallel_agent, tracer, lookup_first=lookup_first,
                                               lookup_ends_first=lookup_ends_first)  # fmt: skip
            other, other_end = await asyncio.to_thread(start_parallel_agent, tracer, lookup_first=True, pay_only=True)
            other_id = format(other.get_span_context().trace_id, "032x")
            await wait_until(lambda: any(r["trace_id"] == other_id for r in records), 10, "the second run's early")
            await asyncio.to_thread(run.end, end_time=end)
            await asyncio.to_thread(other.end, end_time=other_end)
            await wait_until(lambda: sum(r["decision"] == "final" for r in records) == 2, 10, "the final verdicts")
            text = await asyncio.to_thread(scrape, processor.metrics_port)
    finally:
        await asyncio.to_thread(provider.shutdown)
        await processor.stop()
    trace_id = format(run.get_span_context().trace_id, "032x")
    assert [(r["decision"], r["status"]) for r in records if r["trace_id"] == other_id] == [
        ("early", "violating"), ("final", "violating")
    ]
    return [r for r in records if r["trace_id"] == trace_id], text


async def test_a_parallel_call_that_started_first_and_arrives_last_is_waited_for(tmp_path: Path) -> None:
    records, text = await _run(tmp_path, lookup_first=True)
    assert [(r["decision"], r["status"]) for r in records] == [("final", "conformant")]
    assert metric(text, "plumb_violations_total") == 1  # the second run's


async def test_the_failure_is_reported_early_once_the_turn_is_over(tmp_path: Path) -> None:
    # schedule_payment started first: the failure is real, and the next model call shows the
    # turn is over before the root arrives.
    records, text = await _run(tmp_path, lookup_first=False)
    assert [(r["decision"], r["status"]) for r in records] == [("early", "violating"), ("final", "violating")]
    assert [v["invariant"] for v in records[0]["verdicts"]] == ["lookup-before-pay"]
    assert metric(text, "plumb_violations_total", invariant="lookup-before-pay") == 2  # with the second run's


async def test_a_batch_sent_again_after_the_next_one_is_waited_for(tmp_path: Path) -> None:
    # lookup_invoice ends before schedule_payment, but its batch (with the first model call) is
    # sent again after the one holding the payment and the next model call: the payment's turn
    # looks over, with no lookup yet. Held for confirm_wait, the failure is seen to be undone.
    records, text = await _run(tmp_path, lookup_first=True, lookup_ends_first=True, held=2)
    assert [(r["decision"], r["status"]) for r in records] == [("final", "conformant")]
    assert metric(text, "plumb_violations_total") == 1  # the second run's
    assert metric(text, "plumb_confirm_waits_total", kind="early", outcome="cleared") == 1
    assert metric(text, "plumb_confirm_waits_total", kind="early", outcome="stood") == 1  # the second run's


async def test_without_the_wait_the_reordered_batch_is_a_false_early_verdict(tmp_path: Path) -> None:
    # What confirm_wait prevents: an early verdict the final verdict takes back.
    records, _ = await _run(tmp_path, lookup_first=True, lookup_ends_first=True, held=2, confirm_wait=0)
    assert [(r["decision"], r["status"]) for r in records] == [("early", "violating"), ("final", "conformant")]
