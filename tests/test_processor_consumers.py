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
