"""The live processor end to end over real sockets: the OTel SDK's OTLP gRPC and HTTP exporters
send an instrumented agent's traces, a test OTLP backend receives the annotated spans."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from test_live_support import (
    ROOT_KEYS,
    agent_provider,
    attribute,
    config,
    free_port,
    metric,
    run_agent,
    scrape,
    sent_spans,
    strip_annotations,
    wait_until,
)

from otel_plumb.demo.agent import INVOICES
from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.demo.run import policy_path
from otel_plumb.processor import Processor
from otel_plumb.report.records import decided_record

PAYMENTS_PER_RUN = 6  # schedule_payment calls over INVOICES: INV-1003 pays twice, INV-1005 not at all


def _by_case(spans: list[Span]) -> dict[str, list[Span]]:
    """Downstream spans grouped by the invoice their trace is about."""
    case_of_trace = {s.trace_id: attribute(s, "invoice.id") for s in spans if not s.parent_span_id}
    out: dict[str, list[Span]] = {}
    for s in spans:
        out.setdefault(case_of_trace[s.trace_id], []).append(s)
    return out


async def test_every_span_arrives_once_unchanged_apart_from_annotations(tmp_path: Path) -> None:
    backend = OtlpBackend()
    await backend.start(0)
    processor = Processor(config(tmp_path, backend.endpoint, policies=[str(policy_path())]))
    records: list[dict[str, Any]] = []
    watch = processor.hub.subscribe()
    processor.on_decided(lambda d: records.append(decided_record(d)))
    await processor.start()
    try:
        assert processor.grpc_port and processor.http_port and processor.metrics_port
        grpc_agent, grpc_sent = agent_provider(processor.grpc_port, "grpc")
        http_agent, http_sent = agent_provider(processor.http_port, "http")

        for provider in (grpc_agent, http_agent):
            await asyncio.to_thread(run_agent, provider)
        sent = {**sent_spans(grpc_sent), **sent_spans(http_sent)}
        assert len(sent) == 2 * 84
        await wait_until(lambda: len(records) == 2 * len(INVOICES), 10, "all trajectories decided")
        await wait_until(lambda: backend.span_count >= len(sent), 10, "all spans downstream")
        exporter = processor.exporter
        assert exporter is not None
        # The backend holds the spans before the exporter has handled its acknowledgement.
        await wait_until(lambda: exporter.queued_spans == 0, 10, "acknowledgements")
        text = await asyncio.to_thread(scrape, processor.metrics_port)
        openmetrics = await asyncio.to_thread(scrape, processor.metrics_port, "application/openmetrics-text")
    finally:
        await processor.stop()
        await backend.stop()

    received = backend.spans()
    counts = Counter(s.span_id.hex() for s in received)
    assert set(counts) == set(sent) and set(counts.values()) == {1}, "every span exactly once"
    for span in received:
        assert strip_annotations(span) == sent[span.span_id.hex()]
    # Resources and scopes travel with their spans.
    by_service = {"ap-service-grpc": sent_spans(grpc_sent), "ap-service-http": sent_spans(http_sent)}
    for request in backend.requests:
        for rs in request.resource_spans:
            service = next(a.value.string_value for a in rs.resource.attributes if a.key == "service.name")
            for ss in rs.scope_spans:
                assert ss.scope.name == "otel_plumb.demo.agent"
                assert all(span.span_id.hex() in by_service[service] for span in ss.spans)

    cases = _by_case(received)
    for case, spans in cases.items():
        root = next(s for s in spans if not s.parent_span_id)
        assert all(attribute(root, k) is not None for k in ROOT_KEYS)
        assert attribute(root, "plumb.policy") == "ap-controls"
        non_root = [s for s in spans if s.parent_span_id]
        if case in ("INV-1001", "INV-1005", "INV-1006"):
            assert attribute(root, "plumb.verdict") == "conformant"
            assert attribute(root, "plumb.violations.count") == 0
            assert all(attribute(s, "plumb.violation.ids") is None and not s.events for s in spans)
    inv_1003 = cases["INV-1003"]
    root = next(s for s in inv_1003 if not s.parent_span_id)
    assert attribute(root, "plumb.verdict") == "violating"
    assert attribute(root, "plumb.violations.ids") == ["pay-once"]
    payments = sorted(
        (s for s in inv_1003 if s.name == "execute_tool schedule_payment"), key=lambda s: s.start_time_unix_nano
    )
    assert attribute(payments[0], "plumb.violation.ids") is None
    assert attribute(payments[1], "plumb.violation.ids") == ["pay-once"]
    (event,) = payments[1].events
    assert event.name == "plumb.violation"
    assert {a.key for a in event.attributes} == {"invariant", "severity", "message", "expected", "got"}
    assert attribute(event, "invariant") == "pay-once" and attribute(event, "severity") == "critical"
    # A call that never happened is a violation of the whole trajectory: it goes on the root.
    root_1002 = next(s for s in cases["INV-1002"] if not s.parent_span_id)
    assert "dup-check" in attribute(root_1002, "plumb.violation.ids")
    assert any(attribute(e, "invariant") == "dup-check" for e in root_1002.events)
    inv_1004_pay = next(s for s in cases["INV-1004"] if s.name == "execute_tool schedule_payment")
    assert attribute(inv_1004_pay, "plumb.violation.ids") == ["pay-as-invoiced"]
    assert non_root  # the loop above saw child spans

    # Verdicts: records, the verdict log and the hub agree.
    statuses = Counter((r["case_id"], r["status"]) for r in records)
    assert statuses == Counter({(i.invoice_id, "violating" if i.fault else "conformant"): 2 for i in INVOICES})
    logged = [json.loads(line) for line in (tmp_path / "verdicts.jsonl").read_text().splitlines()]
    assert sorted(r["trace_id"] for r in logged) == sorted(r["trace_id"] for r in records)
    hub_records = []
    while not watch._queue.empty():
        item = watch._queue.get_nowait()
        if item is not None:
            hub_records.append(item)
    early = [r for r in hub_records if r["decision"] == "early"]
    assert {(r["case_id"], v["invariant"]) for r in early for v in r["verdicts"]} >= {("INV-1003", "pay-once")}
    assert len([r for r in hub_records if r["decision"] == "final"]) == 2 * len(INVOICES)

    # Metrics, scraped over HTTP.
    assert metric(text, "plumb_spans_received_total", receiver="grpc") == 84
    assert metric(text, "plumb_spans_received_total", receiver="http") == 84
    assert metric(text, "plumb_spans_dropped_total") == 0
    assert metric(text, "plumb_traces_in_flight") == 0
    assert metric(text, "plumb_trajectories_total", policy="ap-controls", agent="ap-agent", status="violating") == 6
    assert metric(text, "plumb_trajectories_total", status="conformant") == 6
    assert metric(text, "plumb_violations_total", invariant="pay-once", severity="critical") == 2
    assert metric(text, "plumb_violations_total", invariant="dup-check") == 2
    assert metric(text, "plumb_violations_total") == 8  # 4 failed invariants per agent run
    assert metric(text, "plumb_invariant_checks_total", invariant="pay-once", verdict="pass") == 10
    assert metric(text, "plumb_tool_calls_total", tool="schedule_payment", outcome="ok") == 2 * PAYMENTS_PER_RUN
    assert metric(text, "plumb_coverage_tool_calls_total", arguments="captured") == 2 * 36
    assert metric(text, "plumb_export_spans_total", exporter="otlp", outcome="sent") == len(sent)
    assert metric(text, "plumb_trajectory_decision_seconds_count") == 12
    assert metric(text, "plumb_export_queue_spans", exporter="otlp") == 0
    violation_lines = [line for line in openmetrics.splitlines() if line.startswith("plumb_violations_total{")]
    assert violation_lines and all(' # {trace_id="' in line for line in violation_lines)


async def test_backend_outage_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    port = free_port()
    backend = OtlpBackend()
    processor = Processor(config(tmp_path, f"grpc://127.0.0.1:{port}"))
    await processor.start()
    try:
        agent, memory = agent_provider(processor.grpc_port or 0)

        await asyncio.to_thread(run_agent, agent)
        sent = sent_spans(memory)
        exporter = processor.exporter
        assert exporter is not None
        await wait_until(lambda: exporter.queued_spans == len(sent), 10, "every span queued for export")
        retried = processor.metrics.export_spans.labels("otlp", "retried")._value.get()
        await wait_until(
            lambda: processor.metrics.export_spans.labels("otlp", "retried")._value.get() > retried, 5, "a retry"
        )
        await backend.start(port)
        await wait_until(lambda: backend.span_count >= len(sent), 10, "the backend to catch up")
        await wait_until(lambda: exporter.queued_spans == 0, 5, "acknowledgements")
    finally:
        await processor.stop()
        await backend.stop()
    counts = Counter(s.span_id.hex() for s in backend.spans())
    assert set(counts) == set(sent) and set(counts.values()) == {1}


async def test_passthrough_forwards_at_once_then_a_verdict_span(tmp_path: Path) -> None:
    backend = OtlpBackend()
    await backend.start(0)
    cfg = config(tmp_path, backend.endpoint, policies=[str(policy_path())], assembly={"idle_timeout": 30})
    assert cfg.exporters.otlp is not None
    cfg.exporters.otlp.mode = "passthrough"
    processor = Processor(cfg)
    await processor.start()
    try:
        agent, memory = agent_provider(processor.grpc_port or 0)

        await asyncio.to_thread(run_agent, agent)
        sent = sent_spans(memory)
        # Forwarded before any decision (idle_timeout is 30 s): unchanged, no annotations.
        await wait_until(lambda: backend.span_count >= len(sent), 10, "spans forwarded at once")
        assert processor.trajectories_decided == 0
        assert {s.span_id.hex(): s for s in backend.spans()} == sent
    finally:
        await processor.stop()  # decides the buffered trajectories: verdict spans follow
        await backend.stop()
    verdict_spans = [s for s in backend.spans() if s.name == "plumb.verdict"]
    assert len(verdict_spans) == len(INVOICES)
    roots = {s.trace_id: s for s in sent.values() if not s.parent_span_id}
    for v in verdict_spans:
        root = roots[v.trace_id]
        assert v.parent_span_id == root.span_id
        violating = attribute(root, "invoice.id") in {i.invoice_id for i in INVOICES if i.fault}
        assert attribute(v, "plumb.verdict") == ("violating" if violating else "conformant")
        assert bool(v.events) == violating


async def test_watch_stream_is_served_on_the_otlp_grpc_port(tmp_path: Path) -> None:
    from otel_plumb.proto_gen import watch_pb2, watch_pb2_grpc

    processor = Processor(config(tmp_path, policies=[str(policy_path())]))
    await processor.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}") as channel:
            stream = watch_pb2_grpc.VerdictServiceStub(channel).Watch(
                watch_pb2.WatchRequest(statuses=["violating"], decisions=["final"])
            )
            await stream.initial_metadata()  # the subscription is in place
            agent, _ = agent_provider(processor.grpc_port or 0)

            await asyncio.to_thread(run_agent, agent)
            cases = set()
            async with asyncio.timeout(10):
                async for trajectory in stream:
                    assert trajectory.status == "violating"
                    cases.add(trajectory.case_id)
                    if len(cases) == 3:
                        break
            stream.cancel()
    finally:
        await processor.stop()
    assert cases == {"INV-1002", "INV-1003", "INV-1004"}


async def test_passthrough_leaves_out_resent_spans_and_keeps_each_span_in_its_scope(tmp_path: Path) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

    def request(*scopes: tuple[str, list[bytes]]) -> ExportTraceServiceRequest:
        out = ExportTraceServiceRequest()
        for scope, span_ids in scopes:
            rs = out.resource_spans.add()
            rs.resource.attributes.add(key="service.name").value.string_value = f"svc-{scope}"
            ss = rs.scope_spans.add()
            ss.scope.name = scope
            for span_id in span_ids:
                ss.spans.add(trace_id=b"T" * 16, span_id=span_id, name=f"GET /{span_id.hex()}", start_time_unix_nano=1)
        return out

    a, b, c, d = (bytes([n]) * 8 for n in range(1, 5))
    backend = OtlpBackend()
    await backend.start(0)
    cfg = config(tmp_path, backend.endpoint, assembly={"idle_timeout": 30})
    assert cfg.exporters.otlp is not None
    cfg.exporters.otlp.mode = "passthrough"
    processor = Processor(cfg)
    await processor.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}") as channel:
            stub = TraceServiceStub(channel)
            await stub.Export(request(("one", [a, b])), timeout=5)
            # Resent: b (taken before) and c twice in one request; d is new, in a second scope.
            await stub.Export(request(("one", [b, c, c]), ("two", [d, a])), timeout=5)
        await wait_until(lambda: backend.span_count >= 4, 10, "spans forwarded")
    finally:
        await processor.stop()
        await backend.stop()
    scope_of = [
        (span.span_id, ss.scope.name, rs.resource.attributes[0].value.string_value)
        for r in backend.requests for rs in r.resource_spans for ss in rs.scope_spans for span in ss.spans
        if span.name != "plumb.verdict"  # the verdict the stop decided follows
    ]  # fmt: skip
    one, two = ("one", "svc-one"), ("two", "svc-two")
    assert sorted(scope_of) == [(a, *one), (b, *one), (c, *one), (d, *two)]
