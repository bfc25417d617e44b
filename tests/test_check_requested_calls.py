"""A tool call only the model's request records (``source: llm_output``, no tool span of its own,
as with the OpenAI client instrumentations) may have failed, or not run when its result was never
given back; one only a client span that does not record how it ended records (the MCP SDK's)
may have failed. A verdict stands only if it holds whichever way such calls went, checked against
an oracle that evaluates the same policy on every way they could have gone, as tool spans."""

from __future__ import annotations

import tempfile
from functools import cache
from itertools import product
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.check import CompiledPolicy, load_policy
from otel_plumb.model import Step, Trajectory
from otel_plumb.replay import ReplayStats, iter_trajectories
from otel_plumb.report.coverage import coverage_report

FIXTURES = Path(__file__).parent / "fixtures" / "conventions"

POLICY = """
policy: requested
invariants:
  - {id: must, must_call: a}
  - {id: never, never_call: a}
  - {id: never-attempts, never_call: {tool: a, attempts: true}}
  - {id: count, call_count: {tool: a, min: 1, max: 2}}
  - {id: order, precedes: {first: a, then: b}}
  - {id: answer, responds: {trigger: a, then: b}}
  - {id: amount, arg_equals: {tool: a, arg: x, value: 1}}
  - {id: dataflow, arg_equals: {tool: b, arg: x, step: {tool: a, arg: x}}}
  - {id: errors, budget: {max_tool_errors: 1}}
  - {id: calls, budget: {max_tool_calls: 3}}
  - {id: scoped, never_call: b, scope: {after: a}}
  - {id: reference, matches_reference: {reference: {context: ref}, mode: unordered, args: ignore}}
  - {id: failures, expr: "steps.filter(s, s.kind == 'tool' && s.error != null).size() == 0"}
"""
REFERENCE = [{"name": "a"}, {"name": "b"}]
# Decided exactly: when every way the requested calls could have gone gives one verdict, that is
# the verdict (the others may be indeterminate when they cannot tell, never wrong).
EXACT = {"must", "never", "never-attempts", "count", "order", "answer", "amount", "errors", "calls", "scoped",
         "reference"}  # fmt: skip


@cache
def compiled() -> CompiledPolicy:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.yaml"
        path.write_text(POLICY)
        return load_policy(path)


def trajectory(steps: list[Step]) -> Trajectory:
    for i, s in enumerate(steps):
        s.index = i
    return Trajectory(key="t", trace_ids=["t"], steps=steps, complete=True,
                      attributes={"plumb.context.ref": REFERENCE})  # fmt: skip


def call(i: int, name: str, x: int, source: str, error: bool, result_seen: bool) -> Step:
    """``source``: "span", "llm_output", or "client" (a span that does not record how the call ended)."""
    return Step(index=i, kind="tool", name=name, span_id=f"{i:016x}", parent_span_id=None, trace_id="t",
                start_ns=i, end_ns=i + 1, convention="test", source="span" if source == "client" else source,  # type: ignore[arg-type]
                args={"x": x}, args_status="captured", result="r" if result_seen else None,
                result_status="captured" if result_seen else "absent", error="boom" if error else None,
                outcome_recorded=source != "client")  # fmt: skip


# (tool, argument, recorded by, failed, result seen)
Spec = list[tuple[str, int, str, bool, bool]]
calls = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 1), st.sampled_from(["span", "llm_output", "client"]),
              st.booleans(), st.booleans()),
    max_size=6,
)  # fmt: skip


def verdicts(steps: list[Step]) -> dict[str, tuple[str, str]]:
    return {v.invariant: (v.verdict, v.message) for v in compiled().evaluate(trajectory(steps))}


def worlds(spec: Spec) -> list[list[Step]]:
    """Every way the unsure calls could have gone, recorded as tool spans: succeeded, failed,
    or not run (but a requested call whose result was given back)."""
    options = []
    for _, _, recorded_by, error, seen in spec:
        if recorded_by == "span":
            options.append([("span", error)])
        else:
            # A client span may stand for no call (a span the SDK cut may have been none).
            ran = recorded_by == "llm_output" and seen
            options.append([("span", False), ("span", True)] + ([] if ran else [None]))
    out = []
    for choice in product(*options):
        ran = [(name, x, ch, seen) for (name, x, _, _, seen), ch in zip(spec, choice, strict=True) if ch is not None]
        out.append([call(i, name, x, ch[0], ch[1], seen) for i, (name, x, ch, seen) in enumerate(ran)])
    return out


@settings(max_examples=300, deadline=None)
@given(calls)
def test_a_verdict_holds_whichever_way_the_unsure_calls_went(spec: Spec) -> None:
    # An unsure call has no error of its own: no span recorded one.
    spec = [(n, x, by, error and by == "span", seen) for n, x, by, error, seen in spec]
    recorded = [call(i, n, x, by, e, seen) for i, (n, x, by, e, seen) in enumerate(spec)]
    ours = verdicts(recorded)
    possible: dict[str, set[str]] = {}
    for world in worlds(spec):
        for invariant, (verdict, _) in verdicts(world).items():
            possible.setdefault(invariant, set()).add(verdict)
    for invariant, (verdict, message) in ours.items():
        if verdict != "indeterminate":
            assert possible[invariant] == {verdict}, (invariant, verdict, message, possible[invariant])
        elif invariant in EXACT and len(possible[invariant]) == 1:
            assert possible[invariant] == {"indeterminate"}, (invariant, message, possible[invariant])


def replayed(name: str) -> Trajectory:
    (t,) = iter_trajectories([FIXTURES / name], ReplayStats())
    return t


def evaluate(t: Trajectory, invariants: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.yaml"
        path.write_text(f"policy: p\ninvariants:\n{invariants}")
        return {v.invariant: v for v in load_policy(path).evaluate(t)}


def test_calls_the_openai_client_instrumentations_record_only_as_requests_are_not_taken_as_successes() -> None:
    """Captured from opentelemetry-instrumentation-openai-v2, OpenInference and OpenLLMetry: the
    application ran the tools itself, uninstrumented, and gave their results back to the model."""
    for fixture in ("openai_v2.jsonl", "openinference_openai.jsonl", "openllmetry_openai.jsonl",
                    "openinference_openai_parallel.jsonl"):  # fmt: skip
        t = replayed(fixture)
        requested = [s for s in t.steps if s.kind == "tool"]
        assert [s.source for s in requested] == ["llm_output", "llm_output"], fixture
        assert all(s.result_status == "captured" for s in requested), fixture
        v = evaluate(t, """\
  - {id: must, must_call: send_payment}
  - {id: never, never_call: send_payment}
  - {id: never-attempts, never_call: {tool: send_payment, attempts: true}}
  - {id: once, call_count: {tool: send_payment, max: 1}}
  - {id: twice, call_count: {tool: send_payment, min: 2}}
  - {id: amount, arg_equals: {tool: send_payment, arg: amount, value: 99}}
  - {id: order, precedes: {first: lookup_invoice, then: send_payment}}
  - {id: unknown-tool, never_call: delete_invoice}
""")
        # Whether send_payment succeeded, nothing in the trace says.
        for invariant in ("must", "never", "amount"):
            assert v[invariant].verdict == "indeterminate", (fixture, invariant, v[invariant].message)
            assert "asked for by the model, and no tool span records how it ended" in v[invariant].message
        assert v["never"].step_index == 4 if "parallel" not in fixture else 3
        # It ran (its result went back to the model): an attempt for sure, and one call at most.
        assert v["never-attempts"].verdict == "fail", fixture
        assert v["once"].verdict == "pass", fixture
        # Two successful calls cannot be, however it went.
        assert v["twice"].verdict == "fail", fixture
        # Either order of outcomes for the two calls: lookup failed and payment succeeded fails it.
        assert v["order"].verdict == "indeterminate", (fixture, v["order"].message)
        assert v["unknown-tool"].verdict == "pass", fixture
        notes = coverage_report([t])["notes"]
        assert any("2 tool calls were read from model output" in n and "indeterminate" in n for n in notes), notes


def test_a_scope_opened_by_a_requested_call_is_not_taken_as_opened() -> None:
    t = trajectory([call(0, "a", 1, "llm_output", False, True), call(1, "b", 1, "span", False, True)])
    v = evaluate(t, "  - {id: s, never_call: b, scope: {after: a}}\n  - {id: u, never_call: b, scope: {after: c}}\n")
    assert v["s"].verdict == "indeterminate" and "a at step 0 was asked for by the model" in v["s"].message
    assert v["u"].verdict == "not_applicable"


def test_more_requested_calls_than_can_be_gone_through_are_indeterminate_not_guessed() -> None:
    steps = [call(i, "a", 1, "llm_output", False, True) for i in range(9)] + [call(9, "b", 1, "span", False, True)]
    v = evaluate(trajectory(steps), "  - {id: o, precedes: {first: a, then: b}}\n  - {id: m, must_call: b}\n")
    assert v["o"].verdict == "indeterminate" and "9 tool calls it reads may have failed or not run" in v["o"].message
    assert v["m"].verdict == "pass"
