"""What decided trajectories add to the Prometheus series (SPEC section 6), counted per batch of
decisions: once per trajectory, verdict and tool step, so compiled with the core (``setup.py``;
no prometheus-client here). ``Metrics.add`` then adds one total per series, and the batch's
decision latencies to their histogram at once: prometheus-client takes a lock, and validates an
exemplar, on every call."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Final

from otel_plumb.model import Decided, Verdict

# The series counted here, by their index in ``DecisionCounts.series`` (the label names are
# ``export.metrics``'s).
TRAJECTORIES: Final = 0  # plumb_trajectories_total{policy, agent, status}
INVARIANT_CHECKS: Final = 1  # plumb_invariant_checks_total{policy, invariant, severity, verdict}
VIOLATIONS: Final = 2  # plumb_violations_total{policy, invariant, severity}
TOOL_CALLS: Final = 3  # plumb_tool_calls_total{agent, tool, outcome}
COVERAGE_TOOL_CALLS: Final = 4  # plumb_coverage_tool_calls_total{agent, arguments}
CHECK_BUDGET_EXCEEDED: Final = 5  # plumb_check_budget_exceeded_total{policy, invariant}
SERIES: Final = 6

Labels = tuple[str, ...]

# plumb_trajectory_decision_seconds, from 10 ms to ~5 min: decisions wait for idle_timeout
# (seconds) and at most max_wait (minutes).
DECISION_BUCKETS: Final[tuple[float, ...]] = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


class SeriesCount:
    """How much one labelled series grew, and the trace id of its exemplar (the last one given)."""

    __slots__ = ("count", "trace_id")

    def __init__(self, trace_id: str | None) -> None:
        self.count = 1
        self.trace_id = trace_id


class LatencyCounts:
    """Decision latencies as a histogram: how many fell in each bucket (``DECISION_BUCKETS``,
    each up to and including its bound, then +Inf), their sum, and per bucket the (trace id,
    seconds) of the last one in it with a trace id (the bucket's exemplar)."""

    __slots__ = ("counts", "exemplars", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(DECISION_BUCKETS) + 1)
        self.exemplars: dict[int, tuple[str, float]] = {}
        self.total = 0.0

    def add(self, seconds: float, trace_id: str | None) -> None:
        bucket = bisect_left(DECISION_BUCKETS, seconds)  # the first bound at or above it
        self.counts[bucket] += 1
        self.total += seconds
        if trace_id is not None:
            self.exemplars[bucket] = (trace_id, seconds)


class DecisionCounts:
    """Counts of the decisions since the last ``take``. ``budget_exceeded``: whether a verdict
    is indeterminate because its expression's cost budget ran out (``check.budget_exceeded``)."""

    __slots__ = ("budget_exceeded", "latencies", "series")

    def __init__(self, budget_exceeded: Callable[[Verdict], bool]) -> None:
        self.budget_exceeded = budget_exceeded
        self.series: list[dict[Labels, SeriesCount]] = [{} for _ in range(SERIES)]
        # Seconds from the last span to the decision, of each final decision.
        self.latencies = LatencyCounts()

    def early(self, decided: Decided) -> None:
        """Failures found on a trajectory still in flight: counted as violations now, and not
        again at its final decision (that one's ``new_failures`` leave them out)."""
        trace_id = decided.trajectory.trace_id or None
        violations = self.series[VIOLATIONS]
        for v in decided.verdicts:
            _add(violations, (v.policy, v.invariant, v.severity), trace_id)

    def final(self, decided: Decided, new_failures: Sequence[Verdict], seconds: float) -> None:
        trajectory = decided.trajectory
        trace_id = trajectory.trace_id or None
        agent = trajectory.agent or trajectory.service or ""
        series = self.series
        trajectories = series[TRAJECTORIES]
        for policy in decided.policies or ("",):
            _add(trajectories, (policy, agent, decided.status), trace_id)
        checks, budget = series[INVARIANT_CHECKS], series[CHECK_BUDGET_EXCEEDED]
        exceeded = self.budget_exceeded
        for v in decided.verdicts:
            _add(checks, (v.policy, v.invariant, v.severity, v.verdict), None)
            if exceeded(v):
                _add(budget, (v.policy, v.invariant), None)
        violations = series[VIOLATIONS]
        for v in new_failures:
            _add(violations, (v.policy, v.invariant, v.severity), trace_id)
        tools, coverage = series[TOOL_CALLS], series[COVERAGE_TOOL_CALLS]
        for step in trajectory.steps:
            if step.kind != "tool":
                continue
            step_agent = step.agent or agent
            _add(tools, (step_agent, step.name, "ok" if step.error is None else "error"), None)
            _add(coverage, (step_agent, step.args_status), None)
        self.latencies.add(seconds, trace_id)

    def take(self) -> tuple[list[dict[Labels, SeriesCount]], LatencyCounts]:
        """The counts so far (by series index), and the latencies; counting starts again."""
        out = self.series, self.latencies
        self.series = [{} for _ in range(SERIES)]
        self.latencies = LatencyCounts()
        return out


def _add(series: dict[Labels, SeriesCount], labels: Labels, trace_id: str | None) -> None:
    count = series.get(labels)
    if count is None:
        series[labels] = SeriesCount(trace_id)
        return
    count.count += 1
    if trace_id is not None:
        count.trace_id = trace_id
