"""Unrecognised is not absent: a trace whose agent spans follow no convention otel-plumb reads is
not an agent that called no tools. Checks on which tools were called are indeterminate there,
never a violation, and coverage says what was not read."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.assemble import build_trajectory
from otel_plumb.check import decide, load_policy
from otel_plumb.model import SpanRecord
from otel_plumb.normalise import normalise
from otel_plumb.report.coverage import coverage_report

POLICY = load_policy(Path(__file__).parent / "fixtures" / "frameworks" / "refund-policy.yaml")
TOOLS = sorted(POLICY.tool_names)
TRACE = "c" * 32


def spans(children: list[tuple[str, dict[str, object]]]) -> list[SpanRecord]:
    root = SpanRecord(TRACE, "0" * 16, None, "handle request", start_ns=0, end_ns=10_000)
    out = [root]
    for i, (name, attributes) in enumerate(children, start=1):
        out.append(SpanRecord(TRACE, f"{i:016x}", root.span_id, name, start_ns=i, end_ns=i + 1, attributes=attributes))
    return out


def decided(records: list[SpanRecord]):  # type: ignore[no-untyped-def]
    trajectory = build_trajectory(TRACE, [normalise(r) for r in records])
    return trajectory, decide([POLICY], trajectory)


namespace = st.from_regex(r"[a-z]{2,8}", fullmatch=True).filter(lambda n: n not in {"gen_ai", "llm", "ai", "mcp"})
key = st.builds(lambda ns, k: f"{ns}.{k}", namespace, st.from_regex(r"[a-z_]{2,10}", fullmatch=True))
attributes = st.dictionaries(key, st.one_of(st.text(max_size=20), st.integers()), max_size=4)
name = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
named_after_a_tool = st.builds(lambda pre, tool, post: f"{pre}{tool}{post}", name, st.sampled_from(TOOLS), name)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(name, attributes), max_size=5),
    st.lists(st.tuples(named_after_a_tool, attributes), min_size=1, max_size=3),
    st.randoms(use_true_random=False),
)
def test_unknown_spans_named_like_a_tool_never_give_a_violation(
    others: list[tuple[str, dict[str, object]]], tool_like: list[tuple[str, dict[str, object]]], rnd: object
) -> None:
    children = others + tool_like
    rnd.shuffle(children)  # type: ignore[attr-defined]
    _, d = decided(spans(children))
    assert [v for v in d.verdicts if v.verdict == "fail"] == []
    assert d.status == "indeterminate"
    assert {v.verdict for v in d.verdicts if v.invariant in ("must-lookup", "lookup-first")} == {"indeterminate"}


def test_a_framework_span_no_convention_reads_makes_the_trajectory_incomplete() -> None:
    trajectory, d = decided(spans([
        ("RefundTool", {"smolagents.tool.name": "refund", "smolagents.tool.input": "{}"}),
        ("step 1", {"myagent.llm.model": "gpt-x"}),
    ]))  # fmt: skip
    assert not trajectory.complete and trajectory.incomplete_reason == "unrecognised_spans"
    assert any("attribute namespaces smolagents" in p for p in trajectory.problems), trajectory.problems
    assert [v for v in d.verdicts if v.verdict == "fail"] == [] and d.status == "indeterminate"
    cov = coverage_report([trajectory], tool_names=POLICY.tool_names)
    assert cov["unrecognised"]["names"] == {"RefundTool": 1, "step 1": 1}
    assert any("follow no convention otel-plumb reads" in n for n in cov["notes"])


def test_policy_tools_in_unrecognised_span_names_are_a_strong_sign() -> None:
    trajectory, _ = decided(spans([("agent.lookup_order", {"acme.agent.step": 1})]))
    cov = coverage_report([trajectory], tool_names=POLICY.tool_names)
    assert cov["unrecognised"]["policy_tools_in_names"] == {"lookup_order": 1}
    assert any("a strong sign" in n for n in cov["notes"])


def test_plain_http_database_and_application_spans_are_not_unrecognised() -> None:
    trajectory, d = decided(spans([
        ("POST /v1/chat/completions", {"http.request.method": "POST", "url.full": "https://api.example/v1"}),
        ("SELECT orders", {"db.system.name": "postgresql"}),
        ("render invoice", {"invoice.id": "INV-1"}),
    ]))  # fmt: skip
    assert trajectory.complete, trajectory.problems
    assert {s.convention for s in trajectory.steps} == {"unknown"}
    # Nothing hides a tool call here, and nothing is an agent's: a service's own traffic (a
    # health check, a batch job) that no policy applies to, not an agent that skipped a call.
    assert (d.status, d.policies, d.verdicts) == ("unchecked", [], [])


def test_a_span_named_after_a_tool_the_trajectory_calls_hides_nothing() -> None:
    lookup = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup_order"}
    # The HTTP span of the lookup names its tool: the call itself is read from the tool span.
    trajectory, d = decided(spans([("execute_tool lookup_order", lookup), ("GET /lookup_order", {"http.route": "/x"})]))
    assert trajectory.complete, trajectory.problems
    assert POLICY.unread_tool_span(trajectory) is None
    assert {v.invariant: v.verdict for v in d.verdicts}["must-lookup"] == "pass"
    # A name holding a called tool and one not called points at the one not called.
    trajectory, d = decided(spans([("execute_tool lookup_order", lookup), ("refund after lookup_order", {})]))
    problem = POLICY.unread_tool_span(trajectory)
    assert problem is not None and "names the tool 'refund'" in problem, problem
    assert {v.invariant: v.verdict for v in d.verdicts}["refund-once"] == "indeterminate"
