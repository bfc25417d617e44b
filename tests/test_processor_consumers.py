"""The consumers of decisions: what each one does with a decided trajectory."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from otel_plumb.check import BUDGET_EXCEEDED
from otel_plumb.export.metrics import Metrics
from otel_plumb.model import Decided, Step, Trajectory, Verdict
from otel_plumb.processor.consumers import Decision, MetricsConsumer


def test_a_verdict_whose_cost_budget_ran_out_is_counted() -> None:
    metrics = Metrics(50)
    t = Trajectory("k", ["a" * 32], [Step(0, "tool", "refund", "b" * 16, None, "a" * 32, 0, 1, "otel_genai")])
    verdicts = [
        Verdict("costly", "p", "indeterminate", "high", message=f"{BUDGET_EXCEEDED}: 2000000 units > 1000000"),
        Verdict("other", "p", "indeterminate", "high", message="arguments of step 0 (refund) are absent"),
    ]
    asyncio.run(MetricsConsumer(metrics).consume([Decision(Decided(t, verdicts, ["p"], "indeterminate"))]))
    text = generate_latest(metrics.registry).decode()
    assert 'plumb_check_budget_exceeded_total{invariant="costly",policy="p"} 1.0' in text
    budget_lines = [line for line in text.splitlines() if line.startswith("plumb_check_budget_exceeded_total{")]
    assert len(budget_lines) == 1, "an indeterminate verdict for another reason is not counted"


def test_a_batch_of_decisions_adds_up_per_series_with_the_last_trace_as_exemplar() -> None:
    """Counted per batch: one series grows by every trajectory in it, the early failure of a
    trace is one violation (its final decision's new failures leave it out), tool steps are
    counted by agent and outcome, and each decision's latency lands in the histogram."""
    metrics = Metrics(50)
    consumer = MetricsConsumer(metrics)

    def trajectory(trace: str, error: str | None) -> Trajectory:
        steps = [
            Step(0, "llm", "model", "c" * 16, None, trace, 0, 1, "otel_genai"),
            Step(1, "tool", "refund", "b" * 16, None, trace, 1, 2, "otel_genai", error=error),
        ]
        t = Trajectory(trace, [trace], steps)
        t.agent = "support"
        return t

    once = Verdict("refund-once", "p", "fail", "high", 1, "b" * 16)
    passed = Verdict("must-lookup", "p", "pass", "high")
    first, second = "1" * 32, "2" * 32
    batch = [
        Decision(Decided(trajectory(first, None), [once], ["p"], "violating", "early")),
        Decision(Decided(trajectory(first, None), [once, passed], ["p"], "violating"), latency_s=0.3,
                 new_failures=[]),
        Decision(Decided(trajectory(second, "boom"), [once, passed], ["p"], "violating"), latency_s=7.0,
                 new_failures=[once]),
    ]  # fmt: skip
    asyncio.run(consumer.consume(batch))
    text, _ = metrics.render("application/openmetrics-text")
    lines = text.decode().splitlines()

    def line(prefix: str) -> str:
        found = [x for x in lines if x.startswith(prefix)]
        assert len(found) == 1, (prefix, found)
        return found[0]

    counted = line('plumb_trajectories_total{agent="support",policy="p",status="violating"} 2.0')
    assert f'# {{trace_id="{second}"}}' in counted, "the exemplar is the last trajectory's"
    assert line('plumb_violations_total{invariant="refund-once",policy="p",severity="high"} 2.0')
    assert line('plumb_invariant_checks_total{invariant="must-lookup",policy="p",severity="high",verdict="pass"} 2.0')
    assert line('plumb_tool_calls_total{agent="support",outcome="ok",tool="refund"} 1.0')
    assert line('plumb_tool_calls_total{agent="support",outcome="error",tool="refund"} 1.0')
    assert line('plumb_coverage_tool_calls_total{agent="support",arguments="absent"} 2.0')
    assert line("plumb_trajectory_decision_seconds_count 2.0")
    assert line('plumb_trajectory_decision_seconds_bucket{le="0.5"} 1.0')
    # A second batch adds to the first.
    asyncio.run(consumer.consume(batch[2:]))
    text, _ = metrics.render("text/plain")
    assert 'plumb_violations_total{invariant="refund-once",policy="p",severity="high"} 3.0' in text.decode()
