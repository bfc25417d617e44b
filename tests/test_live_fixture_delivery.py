"""Every framework fixture (batches captured from the real libraries' exporters) delivered
live the hard way: roots first, every batch twice, the batches that hold no root arriving
after ``idle_timeout`` (a batch sent again after a lost acknowledgement, another process's
exporter). No failure is reported that one clean delivery (offline replay of the same files)
does not have, and every violating verdict is the clean delivery's."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from test_live_support import config, metric, scrape, wait_until

from otel_plumb.check import decide, load_policy
from otel_plumb.model import Decided
from otel_plumb.processor import Processor
from otel_plumb.receive.otlp_json import parse_request
from otel_plumb.replay import ReplayStats, iter_trajectories

FIXTURES = Path(__file__).parent / "fixtures" / "frameworks"
POLICY = FIXTURES / "refund-policy.yaml"
# A second policy the fixtures break: every agent mails the customer, none escalates.
BROKEN = """
policy: strict
invariants:
  - {id: no-email, never_call: send_email}
  - {id: escalate, must_call: escalate_to_human}
"""


def _policies(tmp_path: Path) -> list[Path]:
    strict = tmp_path / "strict.yaml"
    strict.write_text(BROKEN)
    return [POLICY, strict]


def _trace_fixtures() -> list[Path]:
    """The fixture files assembled per trace (not per session)."""
    out = []
    for path in sorted(FIXTURES.glob("*.jsonl")):
        expected = json.loads(path.with_name(path.name.removesuffix(".jsonl") + ".expected.json").read_text())
        if expected["group_by"] == "trace":
            out.append(path)
    return out


def _requests(paths: list[Path]) -> tuple[list[ExportTraceServiceRequest], list[ExportTraceServiceRequest]]:
    """The files' batches: those holding a root span of a trace, and the others."""
    with_root, without = [], []
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            request = parse_request(json.loads(line))  # OTLP/JSON: ids in hex
            spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
            (with_root if any(not s.parent_span_id for s in spans) else without).append(request)
    return with_root, without


def _failures(decided: Decided) -> frozenset[tuple[str, str]]:
    return frozenset((v.policy, v.invariant) for v in decided.failures)


def _clean_delivery(paths: list[Path], policy_files: list[Path]) -> dict[str, tuple[str, frozenset[tuple[str, str]]]]:
    policies = [load_policy(p) for p in policy_files]
    out = {}
    for trajectory in iter_trajectories(paths, ReplayStats()):
        decided = decide(policies, trajectory)
        out[trajectory.trace_ids[0]] = (decided.status, _failures(decided))
    return out


async def _deliver(
    tmp_path: Path, paths: list[Path], confirm_wait: float, seed: int
) -> tuple[dict[str, Decided], dict[str, float]]:
    """The final decisions by trace id, and the final waits by outcome (stood, cleared)."""
    policies = [str(p) for p in _policies(tmp_path)]
    processor = Processor(config(tmp_path, policies=policies, assembly={"confirm_wait": confirm_wait}))
    decided: dict[str, Decided] = {}
    processor.on_decided(lambda d: decided.setdefault(d.trajectory.trace_ids[0], d))
    with_root, without = _requests(paths)
    rng = random.Random(seed)
    await processor.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}") as channel:
            stub = TraceServiceStub(channel)
            first = [r for r in with_root for _ in range(2)]
            rng.shuffle(first)
            for request in first:
                await stub.Export(request, timeout=10)
            # Every trace is in with its root: decided, or held for late spans.
            intake = processor.intake
            await wait_until(lambda: intake.traces_in_flight == intake.traces_waiting, 10, "the first verdicts")
            later = [r for r in without for _ in range(2)]
            rng.shuffle(later)
            for request in later:
                await stub.Export(request, timeout=10)
            await wait_until(lambda: intake.traces_in_flight == 0, 20, "every verdict")
        text = await asyncio.to_thread(scrape, processor.metrics_port)
    finally:
        await processor.stop()
    waits = {o: metric(text, "plumb_confirm_waits_total", kind="final", outcome=o) for o in ("stood", "cleared")}
    return decided, waits


@pytest.mark.parametrize("seed", [1, 2])
async def test_roots_first_and_late_batches_report_no_failure_a_clean_delivery_has_not(tmp_path: Path, seed: int):
    paths = _trace_fixtures()
    clean = _clean_delivery(paths, _policies(tmp_path))
    live, waits = await _deliver(tmp_path, paths, confirm_wait=5.0, seed=seed)
    assert set(live) <= set(clean)
    for trace_id, d in live.items():
        status, failures = clean[trace_id]
        assert _failures(d) <= failures, (trace_id, d.trajectory.key)  # no violation that did not happen
        assert (d.status, _failures(d)) == (status, failures), trace_id  # the clean delivery's verdict
    assert sum(d.status == "violating" for d in live.values()) >= len(clean) // 2  # the strict policy pages
    assert waits["cleared"] >= len(live) // 2  # late batches changed the verdicts held for them
    # Not decided as an agent's run (and so not on this callback): a trace whose root batch is
    # the application's own span only, no framework's, decided before the agent's batches came
    # (they are late spans, forwarded unchecked).
    assert len(live) >= len(clean) - 1


async def test_without_the_wait_late_batches_turn_into_false_violations(tmp_path: Path):
    paths = _trace_fixtures()
    clean = _clean_delivery(paths, _policies(tmp_path))
    live, _ = await _deliver(tmp_path, paths, confirm_wait=0, seed=1)
    false = [t for t, d in live.items() if not _failures(d) <= clean[t][1]]
    assert false  # what confirm_wait prevents
