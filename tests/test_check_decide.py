"""Which failures a span not yet seen could clear (``late_span_could_clear``): those resting on
a call that is missing, not those resting on a call that was made."""

from __future__ import annotations

import pytest
from test_check_support import policy, step, trajectory

from otel_plumb.check import decide, late_span_could_clear


@pytest.mark.parametrize(
    ("invariant", "could_clear"),
    [
        ("{id: i, must_call: check_duplicate}", True),
        ("{id: i, precedes: {first: check_duplicate, then: pay}}", True),
        ("{id: i, call_count: {tool: fetch, min: 2}}", True),
        ("{id: i, responds: {trigger: pay, then: audit}}", True),
        ("{id: i, arg_equals: {tool: pay, arg: amount, step: {tool: fetch, result: total}}}", True),
        ("{id: i, expr: 'steps.exists(s, s.name == \"audit\")'}", True),
        ("{id: i, never_call: pay}", False),
        ("{id: i, call_count: {tool: pay, max: 0}}", False),
        ("{id: i, budget: {max_tool_calls: 1}}", False),
        ("{id: i, arg_equals: {tool: pay, arg: amount, value: 10}}", False),
    ],
)
def test_a_failure_on_a_missing_call_could_be_cleared_one_on_a_call_made_not(tmp_path, invariant, could_clear):
    p = policy(tmp_path, f"policy: t\ninvariants:\n  - {invariant}\n")
    decided = decide([p], trajectory(step("fetch", result={"total": 10}), step("pay", args={"amount": 20})))
    assert [v.verdict for v in decided.verdicts] == ["fail"]
    assert late_span_could_clear([p], decided) is could_clear
    assert decided.trajectory.complete  # the trajectory itself is left as it was


def test_a_passing_trajectory_waits_for_nothing(tmp_path):
    p = policy(tmp_path, "policy: t\ninvariants:\n  - {id: i, must_call: pay}\n")
    decided = decide([p], trajectory(step("pay")))
    assert decided.status == "conformant" and not late_span_could_clear([p], decided)
