"""Early verdicts on a trajectory in flight name the same span as the final verdict, and no
step index (the root, which starts first and ends last, arrives later and shifts them all)."""

from __future__ import annotations

from typing import Any

import pytest
from test_check_support import one, policy, step, trajectory

from otel_plumb.assemble import build_trajectory
from otel_plumb.model import NormalisedSpan, Verdict

POLICY = """
policy: t
invariants:
  - {id: never, never_call: pay}
  - {id: attempts, never_call: {tool: refund, attempts: true}}
  - {id: order, precedes: {first: match, then: pay}}
  - {id: once, call_count: {tool: pay, max: 1}}
  - {id: tool-calls, budget: {max_tool_calls: 4}}
  - {id: tool-errors, budget: {max_tool_errors: 1}}
  - {id: tokens, budget: {max_tokens: 100}}
  - {id: steps, budget: {max_steps: 5}}
  - {id: duration, budget: {max_duration_ms: 50}}
"""
LOCALISED = ("never", "attempts", "order", "once", "tool-calls", "tool-errors")


def span(span_id: str, start_ms: int, kind: str = "tool", name: str | None = None, *, parent: str | None = "root",
         end_ms: int | None = None, **kw: Any) -> NormalisedSpan:  # fmt: skip
    return NormalisedSpan(
        trace_id="t1", span_id=span_id, parent_span_id=parent, span_name=name or span_id,
        start_ns=start_ms * 1_000_000, end_ns=(end_ms if end_ms is not None else start_ms + 5) * 1_000_000,
        kind=kind, name=name or span_id, convention="test", **kw,
    )  # fmt: skip


# The agent's root span starts first and ends last, so it is exported (and arrives) last.
ROOT = span("root", 0, "agent", "invoice-agent", parent=None, end_ms=200)
CHILDREN = [
    span("a1", 10, "llm", "chat", tokens=70),
    span("a2", 20, name="fetch"),
    span("a3", 30, name="refund", error="declined"),
    span("a4", 40, name="pay"),
    span("a5", 50, "llm", "chat", tokens=70),
    span("a6", 60, name="pay"),
    span("a7", 70, name="refund", error="declined"),
    span("a8", 80, name="log"),
]


@pytest.fixture
def verdicts(tmp_path) -> tuple[dict[str, Verdict], dict[str, Verdict]]:
    p = policy(tmp_path, POLICY)
    partial = build_trajectory("t1", CHILDREN, complete=False, incomplete_reason="in_flight")
    final = build_trajectory("t1", [*CHILDREN, ROOT])
    assert final.complete and final.steps[0].span_id == "root"
    assert [s.span_id for s in final.steps[1:]] == [s.span_id for s in partial.steps]  # every index shifted by one
    early = {v.invariant: v for v in p.early_failures(partial)}
    return early, {v.invariant: v for v in p.evaluate(final)}


@pytest.mark.parametrize("invariant", LOCALISED)
def test_early_verdict_names_the_final_verdicts_span_and_no_step_index(verdicts, invariant):
    early, final = verdicts
    e, f = early[invariant], final[invariant]
    assert e.verdict == f.verdict == "fail"
    assert e.step_index is None and e.span_id is not None
    assert e.span_id == f.span_id and f.step_index is not None
    assert f"span {e.span_id}" in e.message and "step" not in e.message.replace("step index provisional", "")
    assert f"step {f.step_index}" in f.message


def test_early_and_final_messages(verdicts):
    early, final = verdicts
    assert early["never"].message == "pay was called (call 1, span a4)"
    assert final["never"].message == "pay was called at step 4"
    assert early["attempts"].message == "refund was attempted (call 1, span a3)"
    assert early["order"].message == "pay (call 1, span a4) without an earlier successful match"
    assert final["order"].message == "pay at step 4 without an earlier successful match"
    assert early["once"].message == ("pay called successfully 2 times, at most 1 allowed; call 2 is span a6 "
                                     "(step index provisional until the trajectory completes)")  # fmt: skip
    assert final["once"].message == "pay called successfully 2 times, at most 1 allowed; call 2 is step 6"
    assert early["tool-calls"].message == "tool calls 6 > 4; the limit was crossed at span a7"
    assert final["tool-calls"].message == "tool calls 6 > 4; the limit was crossed at step 7"
    # what a fail shows of the step: its span while indices are provisional
    assert early["never"].got == {"span": "a4", "name": "pay"} and final["never"].got == {"step": 4, "name": "pay"}


@pytest.mark.parametrize("invariant", ["tokens", "steps", "duration"])
def test_early_budget_fail_whose_crossing_point_later_spans_move_names_no_step(verdicts, invariant):
    # Every step counts towards max_steps and the duration, the root among them; and a
    # framework's model-call span around the client's takes over its tokens: where these limits
    # were crossed is known only once the trajectory is complete. That they were is known now.
    early, final = verdicts
    e, f = early[invariant], final[invariant]
    assert e.verdict == f.verdict == "fail"
    assert e.step_index is None and e.span_id is None
    assert e.message.endswith("where the limit was crossed is known when the trajectory completes")
    assert f.span_id is not None and f.step_index is not None
    assert early["steps"].message.startswith("steps 8 > 5; ")
    assert final["steps"].message == "steps 9 > 5; the limit was crossed at step 5"


def test_arg_equals_from_an_earlier_step_fails_only_when_complete(tmp_path):
    # The source call the expected value comes from is the last one before the checked call: on
    # an incomplete trajectory a later one may still be missing, so a mismatch is not final.
    inv = "{id: a, arg_equals: {tool: pay, arg: amount, step: {tool: fetch, result: total}}}"
    calls = (step("fetch", args={"id": 1}, result={"total": 10}), step("pay", args={"amount": 20}))
    v = one(tmp_path, inv, trajectory(*calls))
    assert v.verdict == "fail" and v.step_index == 1 and v.message == "pay at step 1: amount is 20, expected 10"
    v = one(tmp_path, inv, trajectory(*calls, complete=False))
    assert v.verdict == "indeterminate" and v.step_index == 1 and "would be fail" in v.message
    # against a constant or the context nothing later can change the expected value: the fail stands
    constant = "{id: a, arg_equals: {tool: pay, arg: amount, value: 10}}"
    assert one(tmp_path, constant, trajectory(*calls, complete=False)).verdict == "fail"
