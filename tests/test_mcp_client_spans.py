"""An agent calling an MCP tool server in another process (captured: ``mcp_remote``). The MCP SDK
records each call twice: the agent's client span ``MCP send tools/call <tool>``, which does not
record how the call ended (a tool's failure comes back in its result, as ``isError``), and the
server's ``tools/call <tool>`` span under it, which does. One call is one step, with the
server's outcome; a call whose server span never comes may have failed, so no verdict rests on
it having succeeded. However the two processes' spans arrive (split, reordered, resent), the
verdicts are one clean delivery's, and no early failure is one the final verdict does not have."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_check_early_incremental import _load
from test_delivery import request_of, spans_of

from otel_plumb.assemble import AssemblyLimits, build_trajectory
from otel_plumb.check import decide
from otel_plumb.check.early import EarlyWatch, in_flight, new_early_failures
from otel_plumb.intake import Intake
from otel_plumb.model import NormalisedSpan, Trajectory
from otel_plumb.normalise import normalise
from otel_plumb.receive.otlp import request_records
from otel_plumb.receive.otlp_json import parse_request, request_to_json
from otel_plumb.replay import replay
from otel_plumb.report.coverage import coverage_report

FIXTURE = Path(__file__).parent / "fixtures" / "conventions" / "mcp_remote.jsonl"
POLICY_TEXT = """
policy: billing
invariants:
  - {id: lookup-first, precedes: {first: lookup_invoice, then: send_payment}}
  - {id: must-look-up, must_call: lookup_invoice}
  - {id: pay-once, call_count: {tool: send_payment, max: 1}}
  - {id: never-pay, never_call: send_payment}
  - {id: never-try-to-pay, never_call: {tool: send_payment, attempts: true}}
  - {id: no-errors, budget: {max_tool_errors: 0}}
  - {id: three-calls, budget: {max_tool_calls: 3}}
"""
# What the real run did: lookup_invoice, send_payment refused (isError), send_payment paid.
WHAT_HAPPENED = {
    "lookup-first": "pass", "must-look-up": "pass", "pay-once": "pass", "never-pay": "fail",
    "never-try-to-pay": "fail", "no-errors": "fail", "three-calls": "pass",
}  # fmt: skip
# Without the server's spans: a call may have been refused, so counts of successes cannot say.
CLIENT_ONLY = {
    "lookup-first": "indeterminate", "must-look-up": "indeterminate", "pay-once": "indeterminate",
    "never-pay": "indeterminate", "never-try-to-pay": "indeterminate", "no-errors": "indeterminate",
    "three-calls": "pass",
}  # fmt: skip


POLICY = _load(POLICY_TEXT)
WATCH = EarlyWatch([POLICY])
REQUESTS = [parse_request(json.loads(line)) for line in FIXTURE.read_text().splitlines() if line.strip()]
ITEMS = spans_of(REQUESTS)


def _service(item: Any) -> str:
    return next(a.value.string_value for a in item[0].resource.attributes if a.key == "service.name")


def _verdicts(t: Trajectory) -> dict[str, str]:
    return {v.invariant: v.verdict for v in decide([POLICY], t).verdicts}


def _replayed(tmp_path: Path, items: list[Any]) -> Trajectory:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(request_to_json(request_of(items))) + "\n")
    (t,) = replay([path]).trajectories
    return t


def test_the_server_spans_give_each_call_its_outcome() -> None:
    (t,) = replay([FIXTURE]).trajectories
    tools = t.tool_steps
    assert [(s.name, s.error is not None, s.outcome_recorded) for s in tools] == [
        ("lookup_invoice", False, True), ("send_payment", True, True), ("send_payment", False, True)
    ]  # fmt: skip
    # The steps kept are the agent's client spans, in the agent's process.
    assert all(s.span_id in t.clocks and "billing-agent" in t.clocks[s.span_id] for s in tools)
    assert _verdicts(t) == WHAT_HAPPENED
    assert not any("does not say how they ended" in n for n in coverage_report([t])["notes"])


def test_without_the_server_spans_no_verdict_rests_on_a_call_having_succeeded(tmp_path: Path) -> None:
    t = _replayed(tmp_path, [item for item in ITEMS if _service(item) == "billing-agent"])
    assert [(s.name, s.outcome_recorded) for s in t.tool_steps] == [
        ("lookup_invoice", False), ("send_payment", False), ("send_payment", False)
    ]  # fmt: skip
    verdicts = {v.invariant: v for v in decide([POLICY], t).verdicts}
    assert {k: v.verdict for k, v in verdicts.items()} == CLIENT_ONLY
    assert "recorded by a span that does not say how it ended" in verdicts["never-pay"].message
    report = coverage_report([t])
    assert report["tool_calls"]["without_outcome"] == 3
    notes = report["notes"]
    assert any("3 tool calls are recorded by a span that does not say how they ended" in n and "indeterminate" in n
               for n in notes)  # fmt: skip


@st.composite
def deliveries(draw: st.DrawFn) -> list[list[int]]:
    """The spans of both processes in any order, split into requests, some resent."""
    n = len(ITEMS)
    order = draw(st.permutations(range(n)))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1)))
    chunks = [list(order[a:b]) for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    for chunk in draw(st.lists(st.sampled_from(chunks), max_size=3)):
        chunks.insert(draw(st.integers(0, len(chunks))), chunk)
    return chunks


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deliveries())
def test_any_delivery_gives_what_happened_and_no_early_failure_it_does_not(chunks: list[list[int]]) -> None:
    intake = Intake(AssemblyLimits(idle_timeout_s=10, max_wait_s=1e9))
    state, reported = WATCH.state(), set[tuple[str, str]]()
    seen: dict[str, NormalisedSpan] = {}
    for now, chunk in enumerate(chunks):
        for record in request_records(request_of([ITEMS[i] for i in chunk])):
            intake.add(record, None, float(now))
            if record.span_id not in seen:
                seen[record.span_id] = span = normalise(record)
                state.add(span)
        may_fail = WATCH.may_fail(state, reported)
        if may_fail:
            partial = build_trajectory("t", list(seen.values()), complete=False, incomplete_reason="in_flight")
            new_early_failures([POLICY], in_flight(partial), reported, frozenset(may_fail), WATCH, state.services)
    (finished,) = intake.drain(1e6)
    assert _verdicts(intake.trajectory(finished)) == WHAT_HAPPENED
    assert {invariant for _, invariant in reported} <= {k for k, v in WHAT_HAPPENED.items() if v == "fail"}
