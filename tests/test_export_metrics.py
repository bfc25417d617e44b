"""Metric label caps, health endpoints, and late spans (forwarded, counted, never checked twice)."""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics, enable_created_metrics
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from test_live_backpressure import trace_request
from test_live_support import config, metric, scrape, wait_until

from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.export.counts import DECISION_BUCKETS, DecisionCounts
from otel_plumb.export.metrics import OVERFLOW, Metrics
from otel_plumb.model import Decided, Trajectory
from otel_plumb.processor import Processor
from otel_plumb.receive.otlp import ReceivedRequest
from otel_plumb.report.records import decided_record


def test_label_values_past_the_cap_fold_into_overflow() -> None:
    metrics = Metrics(max_label_values=2)
    for tool in ("a", "b", "c", "d", "a"):
        metrics.tool_calls.labels("agent", tool, "ok").inc()
    text = metrics.render("text/plain")[0].decode()
    assert metric(text, "plumb_tool_calls_total", tool="a") == 2
    assert metric(text, "plumb_tool_calls_total", tool="b") == 1
    assert metric(text, "plumb_tool_calls_total", tool=OVERFLOW) == 2
    assert metric(text, "plumb_tool_calls_total", tool="c") == 0


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _decision_seconds(exposition: bytes) -> tuple[list[str], float]:
    """The histogram's lines but its sum, its created time and exemplar timestamps left out; and
    its sum."""
    lines = [line for line in exposition.decode().splitlines() if "decision_seconds" in line]
    total = [float(line.split()[-1]) for line in lines if line.startswith("plumb_trajectory_decision_seconds_sum ")]
    kept = [
        re.sub(r"(_created) \S+$", r"\1", re.sub(r"( # \{.*\} \S+) \S+$", r"\1", line))
        for line in lines if not line.startswith("plumb_trajectory_decision_seconds_sum ")
    ]  # fmt: skip
    return kept, total[0]


def _latency_histograms() -> tuple[Metrics, DecisionCounts, CollectorRegistry, Histogram]:
    """The processor's metrics and decision counts, and prometheus-client's own Histogram of the
    same name in a registry of its own, to compare their expositions."""
    metrics = Metrics()
    registry = CollectorRegistry()
    expected = Histogram(
        "plumb_trajectory_decision_seconds", metrics.decision_seconds.documentation, buckets=DECISION_BUCKETS,
        registry=registry,
    )  # fmt: skip
    return metrics, DecisionCounts(lambda _: False), registry, expected


def _decide(counts: DecisionCounts, expected: Histogram, n: int, seconds: float, trace_id: str) -> None:
    """One final decision ``seconds`` after its last span, counted and observed by the library."""
    trajectory = Trajectory(key=f"k{n}", trace_ids=[trace_id], steps=[], complete=True)
    counts.final(Decided(trajectory, [], [], "pass", "final"), [], seconds)
    expected.observe(seconds, exemplar={"trace_id": trace_id} if trace_id else None)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.floats(0, 1e6) | st.sampled_from(DECISION_BUCKETS), st.booleans()), max_size=12),
        max_size=4,
    )
)
def test_decision_latencies_added_per_batch_expose_what_observing_each_would(batches) -> None:
    """Latencies counted per batch (``DecisionCounts``, then ``Metrics.add``) give the text and
    OpenMetrics expositions prometheus-client's own Histogram gives when it observes each
    decision with its exemplar: buckets (values on a bound included), count, exemplars, and the
    sum but for rounding (a batch's latencies are summed before they are added to it)."""
    metrics, counts, registry, expected = _latency_histograms()
    n = 0
    for batch in batches:
        for seconds, has_trace in batch:
            _decide(counts, expected, n, seconds, f"{n:032x}" if has_trace else "")
            n += 1
        metrics.add(counts)
    for render in (generate_latest, generate_openmetrics):
        lines, total = _decision_seconds(render(metrics.registry))
        expected_lines, expected_total = _decision_seconds(render(registry))
        assert lines == expected_lines
        assert total == pytest.approx(expected_total, rel=1e-12)


@pytest.mark.parametrize("created", [True, False])
def test_decision_latency_histogram_has_a_created_series_as_the_library_says(created: bool) -> None:
    """``PROMETHEUS_DISABLE_CREATED_SERIES`` (or ``disable_created_metrics()``) takes the
    ``_created`` series out of the decision latency histogram too, as out of prometheus-client's
    own metrics; the rest of its exposition stays the library's Histogram's."""
    was = prometheus_metrics._use_created
    (enable_created_metrics if created else disable_created_metrics)()
    try:
        metrics, counts, registry, expected = _latency_histograms()
        for n, seconds in enumerate((0.01, 5.0, 400.0)):
            _decide(counts, expected, n, seconds, f"{n:032x}")
        metrics.add(counts)
        for render in (generate_latest, generate_openmetrics):
            lines, _ = _decision_seconds(render(metrics.registry))
            assert lines == _decision_seconds(render(registry))[0]
            assert any("_created" in line for line in lines) is created
    finally:
        (enable_created_metrics if was else disable_created_metrics)()


async def test_health_and_readiness(tmp_path: Path) -> None:
    processor = Processor(config(tmp_path))
    await processor.start()
    port = processor.metrics_port or 0
    try:
        assert await asyncio.to_thread(_status, port, "/healthz") == 200
        assert await asyncio.to_thread(_status, port, "/readyz") == 200
        processor._stopping = True  # what stop() sets first: receivers refuse, readiness goes
        assert await asyncio.to_thread(_status, port, "/readyz") == 503
        processor._stopping = False
    finally:
        await processor.stop()


async def test_late_spans_are_forwarded_and_counted(tmp_path: Path) -> None:
    backend = OtlpBackend()
    await backend.start(0)
    processor = Processor(config(tmp_path, backend.endpoint))
    await processor.start()
    try:
        first = trace_request(tools=2)
        await processor.ingest(ReceivedRequest.of(first), "grpc")
        await wait_until(lambda: backend.span_count == 3, 5, "the trace decided and exported")
        late = trace_request(tools=1, trace_id=first.resource_spans[0].scope_spans[0].spans[0].trace_id)
        await processor.ingest(ReceivedRequest.of(late), "http")
        await wait_until(lambda: backend.span_count == 5, 5, "late spans forwarded")
        text = await asyncio.to_thread(scrape, processor.metrics_port or 0)
    finally:
        await processor.stop()
        await backend.stop()
    assert metric(text, "plumb_spans_unchecked_total", reason="late") == 2
    assert metric(text, "plumb_trajectories_total") == 1
    late_ids = {s.span_id for s in late.resource_spans[0].scope_spans[0].spans}
    forwarded = [s for s in backend.spans() if s.span_id in late_ids]
    assert len(forwarded) == 2 and all(not s.events and not any(a.key.startswith("plumb.v") for a in s.attributes)
                                       for s in forwarded)


async def test_session_grouping_decides_one_trajectory_over_several_traces(tmp_path: Path) -> None:
    backend = OtlpBackend()
    await backend.start(0)
    processor = Processor(
        config(tmp_path, backend.endpoint, assembly={"group_by": "session", "session_idle_timeout": 0.3})
    )
    records: list[dict[str, object]] = []
    processor.on_decided(lambda d: records.append(decided_record(d)))
    await processor.start()
    try:
        turns = [trace_request(tools=2), trace_request(tools=1)]
        for turn in turns:
            for span in turn.resource_spans[0].scope_spans[0].spans:
                span.attributes.add(key="gen_ai.conversation.id").value.string_value = "conv-42"
            await processor.ingest(ReceivedRequest.of(turn), "grpc")
        await wait_until(lambda: backend.span_count == 5, 5, "the session decided and exported")
    finally:
        await processor.stop()
        await backend.stop()
    (record,) = records
    assert record["session_id"] == "conv-42" and record["key"] == "conv-42"
    assert sorted(record["trace_ids"]) == sorted(  # type: ignore[arg-type]
        t.resource_spans[0].scope_spans[0].spans[0].trace_id.hex() for t in turns
    )


def test_a_scrape_from_another_thread_sees_each_batch_of_latencies_whole() -> None:
    """Batches are added on the event loop while a scrape may run on another thread: every
    exposition has whole batches (here 3 latencies of 0.5 s each), never part of one."""
    metrics = Metrics()
    batch = DecisionCounts(lambda _: False)
    seen: list[tuple[float, float, float]] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            text = metrics.render("text/plain")[0].decode()
            seen.append((
                metric(text, "plumb_trajectory_decision_seconds_count"),
                metric(text, "plumb_trajectory_decision_seconds_bucket", le="0.5"),
                metric(text, "plumb_trajectory_decision_seconds_sum"),
            ))  # fmt: skip

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns as often as the interpreter allows
    scraper = threading.Thread(target=scrape)
    scraper.start()
    trajectory = Trajectory(key="k", trace_ids=["ab" * 16], steps=[], complete=True)
    deadline = time.monotonic() + 30
    try:
        while len(seen) < 20 and time.monotonic() < deadline:  # batches until 20 scrapes ran
            for _ in range(3):
                batch.final(Decided(trajectory, [], [], "pass", "final"), [], 0.5)
            metrics.add(batch)
    finally:
        done.set()
        scraper.join(10)
        sys.setswitchinterval(switch)
    assert len(seen) >= 20
    for count, at_half, total in seen:
        assert count % 3 == 0 and at_half == count and total == 0.5 * count
