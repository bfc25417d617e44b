"""The live processor tunes the cyclic garbage collector while it runs, and gives it back as it was."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path
from typing import Any

import pytest
from test_live_support import config

from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.processor import Processor, core, load_config
from otel_plumb.processor.core import GC_THRESHOLDS, load_policy_files
from otel_plumb.receive.otlp import ReceivedRequest
from otel_plumb.receive.otlp_json import parse_request

FIXTURES = Path(__file__).parent / "fixtures"
# Early invariants that fail on the refund fixtures (a retried refund), and one CEL expression.
POLICY = """
policy: cycles
invariants:
  - {id: must-lookup, must_call: lookup_order}
  - {id: lookup-first, precedes: {first: lookup_order, then: refund}}
  - {id: refund-never, never_call: refund}
  - {id: one-call, call_count: {tool: lookup_order, max: 0}}
  - {id: budget, budget: {max_steps: 2}}
  - {id: has-tools, expr: "size(steps.filter(s, s.kind == 'tool')) > 0"}
"""


def test_start_freezes_what_start_up_built_and_raises_the_thresholds_stop_restores_them() -> None:
    before = gc.get_threshold()
    assert before != GC_THRESHOLDS

    async def run() -> tuple[tuple[int, ...], int]:
        config = load_config(None, {
            "receivers": {"grpc": {"enabled": False}, "http": {"enabled": False}},
            "metrics": {"endpoint": ""},
        })  # fmt: skip
        processor = Processor(config, [])
        await processor.start()
        try:
            return gc.get_threshold(), gc.get_freeze_count()
        finally:
            await processor.stop()

    running, frozen = asyncio.run(run())
    assert running == GC_THRESHOLDS
    assert frozen > 1000  # the interpreter, the modules and the processor itself
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def _ours(obj: object) -> bool:
    """Whether garbage ``obj`` is otel-plumb's: an instance of one of its classes, or one of its functions."""
    code = getattr(obj, "__code__", None)
    module = code.co_filename if code is not None else type(obj).__module__
    return "otel_plumb" in module


def test_the_span_path_leaves_no_reference_cycles(tmp_path: Path) -> None:
    """Collections are rare while the processor runs (GC_THRESHOLDS): a cycle made per span,
    request or trajectory would wait in memory for them. Captured agent traces (model calls,
    parallel tool calls, content off) in requests split across their traces, through early
    checks (a CEL expression too), decisions, annotation and the export queue."""
    agent = ("openai_agents_parallel", "langgraph_openllmetry_retry", "strands_subagent", "openai_agents_content_off")
    files = [FIXTURES / "frameworks" / f"{name}.jsonl" for name in agent]
    files.append(FIXTURES / "conventions" / "httpx_service.jsonl")
    lines = {f: [json.loads(line) for line in f.read_text().splitlines() if line.strip()] for f in files}

    def spans_of(f: Path) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
        return [(rs, ss, span) for line in lines[f] for rs in line["resourceSpans"] for ss in rs["scopeSpans"]
                for span in ss["spans"]]  # fmt: skip

    spans = [s for f in files for s in spans_of(f)]
    agent_traces = {span["traceId"] for f in files[:-1] for _, _, span in spans_of(f)}
    # One request per span, roots last: early checks run on every request.
    requests = [
        parse_request({"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": [span]}]}]})
        for rs, ss, span in sorted(spans, key=lambda t: "parentSpanId" not in t[2] or not t[2]["parentSpanId"])
    ]
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)

    async def run() -> tuple[int, list[str]]:
        seen = 0

        def decided(_decided: object) -> None:
            nonlocal seen
            seen += 1

        backend = OtlpBackend()
        await backend.start()
        processor = Processor(
            config(tmp_path, backend.endpoint, receivers={"grpc": {"enabled": False}, "http": {"enabled": False}}),
            load_policy_files([str(policy)]),
        )
        processor.on_decided(decided)
        await processor.start()
        try:
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            for request in requests:
                await processor.ingest(ReceivedRequest.parse(request.SerializeToString()), "test")
            assert await backend.wait_for_spans(len(requests), 10)  # decided, annotated, exported
            gc.collect()
            return seen, sorted({repr(o)[:150] for o in gc.garbage if _ours(o)})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            await processor.stop()
            await backend.stop()

    decisions, ours = asyncio.run(run())
    assert decisions == len(agent_traces) and ours == []


def test_young_collections_also_come_on_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cycles made outside the span path (the gRPC runtime's, per request) are freed within
    GC_YOUNG_INTERVAL even when too few objects are allocated to start a collection."""
    monkeypatch.setattr(core, "GC_YOUNG_INTERVAL", 0.2)
    collections: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collections.append(info["generation"])

    async def run() -> None:
        processor = Processor(load_config(None, {
            "receivers": {"grpc": {"enabled": False}, "http": {"enabled": False}},
            "metrics": {"endpoint": ""}, "assembly": {"tick": 0.05},
        }), [])  # fmt: skip
        await processor.start()
        gc.callbacks.append(note)
        try:
            deadline = time.monotonic() + 10
            while 0 not in collections and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            gc.callbacks.remove(note)
            await processor.stop()

    asyncio.run(run())
    assert 0 in collections
