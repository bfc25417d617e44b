"""At-least-once delivery over real sockets: the OTel SDK's OTLP exporters send every batch
twice (as they do when an acknowledgement is lost), and the backend still gets every span once,
with the verdicts of a single delivery; without a policy every trajectory is unchecked."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_live_support import attribute, config, metric, scrape, wait_until

from otel_plumb.demo.agent import INVOICES, run_all
from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.demo.run import policy_path
from otel_plumb.model import Decided
from otel_plumb.processor import Processor

# What the bundled agent's invoices mean (otel_plumb/demo/agent.py): three deliberate faults.
VIOLATING = {"INV-1002", "INV-1003", "INV-1004"}


def _agent_spans() -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "ap-service"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    run_all(provider)
    provider.shutdown()
    return list(memory.get_finished_spans())


def _send_twice(spans: list[ReadableSpan], grpc_port: int, http_port: int) -> None:
    """Each batch is exported twice, the resend arriving after the next batch (a retried export),
    half over gRPC and half over HTTP."""
    grpc_exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True)
    http_exporter = HttpSpanExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces")
    batches = [spans[i : i + 10] for i in range(0, len(spans), 10)]
    for n, batch in enumerate(batches):
        exporter = grpc_exporter if n % 2 else http_exporter
        assert exporter.export(batch) is SpanExportResult.SUCCESS
        if n:
            previous = grpc_exporter if (n - 1) % 2 else http_exporter
            assert previous.export(batches[n - 1]) is SpanExportResult.SUCCESS
    assert http_exporter.export(batches[-1]) is SpanExportResult.SUCCESS
    grpc_exporter.shutdown()
    http_exporter.shutdown()


async def _run(tmp_path: Path, policies: list[str]) -> tuple[list[Decided], OtlpBackend, str, int]:
    backend = OtlpBackend()
    await backend.start(0)
    processor = Processor(config(tmp_path, backend.endpoint, policies=policies))
    decided: list[Decided] = []
    processor.on_decided(decided.append)
    await processor.start()
    spans = await asyncio.to_thread(_agent_spans)
    try:
        assert processor.grpc_port and processor.http_port and processor.metrics_port
        await asyncio.to_thread(_send_twice, spans, processor.grpc_port, processor.http_port)
        await wait_until(lambda: len(decided) >= len(INVOICES), 15, "every trajectory decided")
        await wait_until(lambda: backend.span_count >= len(spans), 15, "every span exported")
        text = await asyncio.to_thread(scrape, processor.metrics_port)
    finally:
        await processor.stop()
        await backend.stop()
    return decided, backend, text, len(spans)


async def test_a_batch_sent_twice_is_one_step_one_export_and_the_same_verdicts(tmp_path: Path) -> None:
    decided, backend, text, sent = await _run(tmp_path, [str(policy_path())])
    by_key = {d.key: d for d in decided}
    assert len(decided) == len(INVOICES) == len(by_key), "a resend is not a second trajectory"
    assert {k for k, d in by_key.items() if d.status == "violating"} == VIOLATING
    assert {k for k, d in by_key.items() if d.status == "conformant"} == {i.invoice_id for i in INVOICES} - VIOLATING
    # INV-1003 pays twice: exactly one extra payment, not four.
    payments = [s for s in by_key["INV-1003"].trajectory.tool_steps if s.name == "schedule_payment"]
    assert len(payments) == 2
    counts = Counter(s.span_id for s in backend.spans())
    assert len(counts) == sent and set(counts.values()) == {1}, "every span downstream exactly once"
    assert metric(text, "plumb_spans_dropped_total", reason="duplicate") == sent
    assert metric(text, "plumb_violations_total", invariant="pay-once") == 1
    log = [json.loads(line) for line in (tmp_path / "verdicts.jsonl").read_text().splitlines()]
    assert sorted(r["key"] for r in log) == sorted(i.invoice_id for i in INVOICES)


async def test_run_without_a_policy_reports_unchecked_never_conformant(tmp_path: Path) -> None:
    decided, backend, text, _ = await _run(tmp_path, [])
    assert {d.status for d in decided} == {"unchecked"}
    assert metric(text, "plumb_trajectories_total", status="unchecked") == len(INVOICES)
    assert metric(text, "plumb_trajectories_total", status="conformant") == 0
    log = [json.loads(line) for line in (tmp_path / "verdicts.jsonl").read_text().splitlines()]
    assert {r["status"] for r in log} == {"unchecked"}
    roots = [s for s in backend.spans() if not s.parent_span_id]
    assert {attribute(r, "plumb.verdict") for r in roots} == {"unchecked"}


def _in_conversation(spans: list[ReadableSpan], conversation: str) -> list[ReadableSpan]:
    """The spans as a part of one conversation (``gen_ai.conversation.id`` on each)."""
    return [_with_attribute(s, "gen_ai.conversation.id", conversation) for s in spans]


def _with_attribute(s: ReadableSpan, key: str, value: str) -> ReadableSpan:
    return ReadableSpan(
        name=s.name, context=s.context, parent=s.parent, resource=s.resource, kind=s.kind, status=s.status,
        attributes={**(s.attributes or {}), key: value}, events=s.events, links=s.links, start_time=s.start_time,
        end_time=s.end_time, instrumentation_scope=s.instrumentation_scope,
    )  # fmt: skip


async def test_a_span_that_comes_after_its_trace_went_idle_is_in_the_sessions_verdict(tmp_path: Path) -> None:
    """``group_by: session``: the run that pays twice (INV-1003) sends its second payment's span
    after the rest of the trace went idle (a tool that ran longer than idle_timeout). The session
    is still open: the span is taken in, and the session pays twice, as in one delivery."""
    backend = OtlpBackend()
    await backend.start(0)
    processor = Processor(config(tmp_path, backend.endpoint, policies=[str(policy_path())],
                                 assembly={"group_by": "session", "session_idle_timeout": 1.5}))  # fmt: skip
    decided: list[Decided] = []
    processor.on_decided(decided.append)
    await processor.start()
    spans = await asyncio.to_thread(_agent_spans)
    try:
        assert processor.grpc_port and processor.metrics_port
        trace = next(s.context.trace_id for s in spans if (s.attributes or {}).get("invoice.id") == "INV-1003")
        run = _in_conversation([s for s in spans if s.context.trace_id == trace], "conv-1003")
        late = sorted((s for s in run if s.name == "execute_tool schedule_payment"), key=lambda s: s.start_time)[-1]
        exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{processor.grpc_port}", insecure=True)
        sent = await asyncio.to_thread(exporter.export, [s for s in run if s is not late])
        assert sent is SpanExportResult.SUCCESS
        await wait_until(lambda: processor.intake.traces_in_flight == 0, 10, "the trace gone idle, into its session")
        assert await asyncio.to_thread(exporter.export, [late]) is SpanExportResult.SUCCESS
        exporter.shutdown()
        await wait_until(lambda: len(decided) >= 1, 15, "the session decided")
        await wait_until(lambda: backend.span_count >= len(run), 15, "every span exported")
        text = await asyncio.to_thread(scrape, processor.metrics_port)
    finally:
        await processor.stop()
        await backend.stop()
    (session,) = decided
    assert session.status == "violating"
    assert [v.invariant for v in session.verdicts if v.verdict == "fail"] == ["pay-once"]
    assert late.context.span_id.to_bytes(8, "big").hex() in {s.span_id for s in session.trajectory.tool_steps}
    assert metric(text, "plumb_spans_unchecked_total") == 0
    assert Counter(s.span_id for s in backend.spans()).most_common(1)[0][1] == 1
