"""Live consistency: the share of recent trajectories on the modal tool path, against a plain
recount of the window (property), its bounds, and a running processor whose agent changes its
path midway (real OTLP exporter, /metrics scraped over HTTP)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from test_live_support import config, metric, scrape, wait_until

from otel_plumb.consistency import ConsistencyConfig, PathAgreement
from otel_plumb.model import Decided, Step, Trajectory
from otel_plumb.processor import Processor

ROOT = Path(__file__).resolve().parent.parent


def decided(path: tuple[str, ...], agent: str = "a", policies: tuple[str, ...] = ("p",), complete: bool = True,
            errors: tuple[str, ...] = ()) -> Decided:  # fmt: skip
    steps = [Step(index=i, kind="tool", name=n, span_id=f"{i:016x}", parent_span_id=None, trace_id="t", start_ns=i,
                  end_ns=i + 1, convention="genai", error="boom" if n in errors else None)
             for i, n in enumerate(path)]  # fmt: skip
    t = Trajectory(key="t", trace_ids=["t"], steps=steps, complete=complete, agent=agent)
    return Decided(t, [], list(policies), "conformant" if policies else "unchecked")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([("a",), ("a", "b"), ("b", "a"), ("c",)]), min_size=1, max_size=80),
       st.integers(5, 12))  # fmt: skip
def test_the_share_is_the_modal_paths_share_of_the_window(paths: list[tuple[str, ...]], window: int) -> None:
    agreement = PathAgreement(ConsistencyConfig(window=window, min_trajectories=1))
    for i, path in enumerate(paths):
        (a,) = agreement.add(decided(path))
        recent = paths[max(0, i + 1 - window): i + 1]
        assert a.trajectories == len(recent)
        assert a.share == max(Counter(recent).values()) / len(recent)


def test_a_change_of_path_is_counted_once_and_the_share_recovers() -> None:
    agreement = PathAgreement(ConsistencyConfig(window=20, min_trajectories=10))
    results = [a for path in [("lookup", "refund")] * 30 + [("lookup", "notify")] * 30
               for a in agreement.add(decided(path))]  # fmt: skip
    assert sum(a.changed for a in results) == 1
    assert results[29].share == 1.0 and results[39].share == 0.5 and results[-1].share == 1.0
    change = next(i for i, a in enumerate(results) if a.changed)
    assert 39 <= change <= 40  # when the new path outnumbers the old one in the window


def test_what_is_left_out_and_the_bounds() -> None:
    agreement = PathAgreement(ConsistencyConfig(window=10, max_paths=2, max_groups=2))
    assert list(agreement.add(decided(("a",), complete=False))) == []  # cut short: no evidence
    assert list(agreement.add(decided(("a",), policies=()))) == []  # unchecked
    (_,) = agreement.add(decided(("a", "x"), errors=("x",)))  # a failed call did not happen
    (b,) = agreement.add(decided(("a",)))
    assert b.share == 1.0
    for p in [("b",), ("c",), ("d",)]:  # past max_paths: "another path", never modal
        list(agreement.add(decided(p)))
    (c,) = agreement.add(decided(("a",)))
    assert c.share == 3 / 6
    assert len(list(agreement.add(decided(("a",), agent="second")))) == 1
    assert list(agreement.add(decided(("a",), agent="third"))) == []  # past max_groups
    by_policy = list(agreement.add(decided(("a",), policies=("p", "q"))))
    assert [x.policy for x in by_policy] == ["p"]  # q would be a third window


def _run(provider: TracerProvider, tools: list[str], count: int) -> None:
    tracer = provider.get_tracer("agent")
    for _ in range(count):
        with tracer.start_as_current_span("invoke_agent support") as root:
            root.set_attribute("gen_ai.operation.name", "invoke_agent")
            root.set_attribute("gen_ai.agent.name", "support")
            for tool in tools:
                with tracer.start_as_current_span(f"execute_tool {tool}") as span:
                    span.set_attribute("gen_ai.operation.name", "execute_tool")
                    span.set_attribute("gen_ai.tool.name", tool)
                    span.set_attribute("gen_ai.tool.call.arguments", json.dumps({"id": 1}))


async def test_a_running_processor_sees_its_agent_change_path(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("policy: support\ninvariants:\n  - {id: looks-up, must_call: lookup}\n")
    processor = Processor(config(tmp_path, policies=[str(policy)],
                                 consistency={"window": 20, "min_trajectories": 10}))  # fmt: skip
    decided_count = 0

    def count(_: object) -> None:
        nonlocal decided_count
        decided_count += 1

    processor.on_decided(count)
    await processor.start()
    provider = TracerProvider(resource=Resource.create({"service.name": "support"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"127.0.0.1:{processor.grpc_port}",
                                                                     insecure=True)))  # fmt: skip
    labels = {"policy": "support", "group": "support"}
    try:
        await asyncio.to_thread(_run, provider, ["lookup", "refund"], 20)
        await wait_until(lambda: decided_count == 20, 30, "the first 20 decided")
        text = await asyncio.to_thread(scrape, processor.metrics_port or 0)
        assert metric(text, "plumb_path_agreement", **labels) == 1.0
        assert metric(text, "plumb_path_agreement_trajectories", **labels) == 20
        await asyncio.to_thread(_run, provider, ["lookup", "notify"], 20)
        await wait_until(lambda: decided_count == 40, 30, "the next 20 decided")
        text = await asyncio.to_thread(scrape, processor.metrics_port or 0)
        assert metric(text, "plumb_path_agreement", **labels) == 1.0  # the new path fills the window
        assert metric(text, "plumb_path_changes_total", **labels) == 1
    finally:
        provider.shutdown()
        await processor.stop()


def test_replay_reports_the_path_agreement_of_its_input(tmp_path: Path) -> None:
    fixtures = sorted((Path(__file__).parent / "fixtures" / "ap").glob("*.jsonl"))
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "otel_plumb", "replay", *map(str, fixtures), "--policy",
                           str(ROOT / "configs" / "policies" / "ap.yaml"), "--json", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr  # some fixtures violate
    report = json.loads(out.read_text())
    paths = Counter(
        tuple(s["name"] for s in t["steps"] if s["kind"] == "tool" and not s["error"])
        for t in report["trajectories"] if t["complete"] and t["policies"]
    )
    (row,) = report["path_agreement"]
    assert row["n"] == sum(paths.values()) and row["successes"] == max(paths.values())
    assert tuple(row["modal_path"]) == paths.most_common(1)[0][0] and row["paths"] == len(paths)
    assert row["lo"] <= row["rate"] <= row["hi"]
    assert "path agreement: ap-controls" in done.stdout
