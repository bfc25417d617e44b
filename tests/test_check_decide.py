"""Which failures a span not yet seen could clear (``late_span_could_change``): those resting on
a call that is missing, not those resting on a call that was made."""

from __future__ import annotations

import pytest
from test_check_support import policy, step, trajectory

from otel_plumb.assemble import build_trajectory
from otel_plumb.check import decide, late_span_could_change
from otel_plumb.model import NormalisedSpan


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
    assert late_span_could_change([p], decided) is could_clear
    assert decided.trajectory.complete  # the trajectory itself is left as it was


def test_a_passing_trajectory_waits_for_nothing(tmp_path):
    p = policy(tmp_path, "policy: t\ninvariants:\n  - {id: i, must_call: pay}\n")
    decided = decide([p], trajectory(step("pay")))
    assert decided.status == "conformant" and not late_span_could_change([p], decided)


def _span(span_id: str, parent: str | None, kind: str = "other", framework: str | None = None) -> NormalisedSpan:
    return NormalisedSpan(trace_id="t", span_id=span_id, parent_span_id=parent, span_name=span_id, start_ns=0,
                          end_ns=10, kind=kind, name=span_id, convention="test", framework=framework)  # fmt: skip


def test_an_agent_frameworks_trace_without_its_agent_spans_yet_could_become_an_agent_run(tmp_path):
    p = policy(tmp_path, "policy: t\ninvariants:\n  - {id: i, must_call: pay}\n")
    root_only = decide([p], build_trajectory("t", [_span("root", None, framework="Google ADK")]))
    assert root_only.status == "unchecked" and late_span_could_change([p], root_only)
    # a service's own trace (HTTP, database) is no agent's: nothing to wait for
    http = decide([p], build_trajectory("t", [_span("root", None), _span("db", "root")]))
    assert http.status == "unchecked" and not late_span_could_change([p], http)


def test_a_span_whose_parent_is_missing_could_get_it(tmp_path):
    p = policy(tmp_path, "policy: t\ninvariants:\n  - {id: i, never_call: pay}\n")
    spans = [_span("root", None, "agent"), _span("c", "gone", "tool")]
    decided = decide([p], build_trajectory("t", spans))
    assert decided.trajectory.incomplete_reason == "missing_parent" and late_span_could_change([p], decided)


def test_a_span_named_after_a_tool_no_convention_reads_could_be_followed_by_the_call(tmp_path):
    p = policy(tmp_path, "policy: t\ninvariants:\n  - {id: i, never_call: delete}\n")
    name = "process delete request"
    unread = NormalisedSpan(trace_id="t", span_id="u", parent_span_id="root", span_name=name, start_ns=1, end_ns=5,
                            kind="other", name=name, convention="unknown")  # fmt: skip
    decided = decide([p], build_trajectory("t", [_span("root", None, "agent"), unread]))
    assert decided.status == "indeterminate" and late_span_could_change([p], decided)
    assert not late_span_could_change([p], decide([p], build_trajectory("t", [_span("root", None, "agent")])))
