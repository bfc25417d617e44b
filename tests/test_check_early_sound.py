"""An early verdict is a violation that really happened: every early failure reported while a
trajectory is in flight is a failure of its final verdict, whatever the agent did and however
its spans were cut into requests, as long as they arrive as one process's SDK exports them
(in the order they end; a span's children end before it does).

The traces are agent runs as frameworks record them: turns of one model call (sometimes
recorded twice, a framework's span around the client's) and then the tool calls it asked for,
run in parallel, some failing, some running a sub-agent or handing off to another agent, some
under a span per turn, some with HTTP calls inside; content capture on or off; tool execution
traced or not."""

from __future__ import annotations

from itertools import count
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_check_early_incremental import POLICY_SETS, _alone, _load

from otel_plumb.assemble import build_trajectory
from otel_plumb.check import CompiledPolicy
from otel_plumb.check.early import EarlyWatch, in_flight, new_early_failures
from otel_plumb.model import NormalisedSpan, RequestedCall

# What the spans still to come can change: handoffs, tokens taken over, which agent it is.
MORE_TEXT = """
policy: more
invariants:
  - {id: no-transfer, never_call: transfer_to_billing}
  - {id: tokens, budget: {max_tokens: 50}}
  - {id: three-calls, budget: {max_tool_calls: 3}}
  - {id: model-calls, budget: {max_llm_calls: 2}}
  - {id: steps, budget: {max_steps: 12}}
  - {id: billing-never-pays, never_call: pay, applies_to: {agent: billing}}
  - {id: transfer-then-pay, precedes: {first: transfer_to_billing, then: pay}}
"""
BILLING_TEXT = """
policy: billing-agent
applies_to: {agent: billing}
invariants:
  - {id: never-pay, never_call: pay}
"""
SETS = [*POLICY_SETS, *_alone(MORE_TEXT), [_load(BILLING_TEXT)]]
WATCHES = [EarlyWatch(policies) for policies in SETS]

TOOLS = ["pay", "pay", "lookup", "lookup", "check", "delete", "wipe", "refund", "other_tool", "transfer_to_billing"]


@st.composite
def agent_runs(draw: Any) -> list[NormalisedSpan]:
    """The spans of one agent run, its root (the agent span) among them."""
    ids = count()
    spans: list[NormalisedSpan] = []
    service = draw(st.sampled_from(["billing-api", "support"]))
    content = draw(st.booleans())  # the model's tool calls are captured
    tool_spans = draw(st.booleans()) or not content  # tool execution is traced
    # Two instrumentations at once: each tool and model call recorded again, by another
    # convention, its times a little later (the second instrumentation's callback runs second).
    twice = draw(st.integers(0, 3)) == 0

    def add(kind: str, name: str, parent: str | None, start: int, end: int, convention: str = "test",
            **kw: Any) -> str:  # fmt: skip
        span_id = f"s{next(ids)}"
        spans.append(NormalisedSpan(
            trace_id="t", span_id=span_id, parent_span_id=parent, span_name=name, start_ns=start * 1000,
            end_ns=end * 1000, kind=kind, name=name, convention=convention, attributes={"service.name": service},
            **kw,
        ))  # fmt: skip
        return span_id

    def again(index: int) -> None:
        """The span at ``index`` recorded again by the second instrumentation (the tool-call id
        it may not have), once its end is known."""
        first = spans[index]
        add(first.kind, first.name, first.parent_span_id, 0, 0, "test2", error=first.error, tokens=first.tokens,
            tool_call_id=first.tool_call_id if draw(st.booleans()) else None)  # fmt: skip
        shift = draw(st.integers(1, 400))
        spans[-1].start_ns, spans[-1].end_ns = first.start_ns + shift, first.end_ns + shift

    def run(agent: str, parent: str | None, start: int, depth: int) -> int:
        """One agent's run from ``start``: its span and everything under it; returns its end."""
        agent_index = len(spans)
        agent_id = add("agent", agent, parent, start, start)  # its end is set once its turns are over
        t = start + 1
        for _turn in range(draw(st.integers(1, 3))):
            calls = draw(st.lists(st.sampled_from(TOOLS), max_size=3))
            call_ids = [f"c{next(ids)}" for _ in calls]
            t_end = t + draw(st.integers(3, 6))
            requested = tuple(RequestedCall(n, {"x": 1}, "captured", i) for n, i in zip(calls, call_ids, strict=True))
            tokens = draw(st.one_of(st.none(), st.integers(0, 40)))
            llm = add("llm", "chat", agent_id, t, t_end, tokens=tokens, requested_calls=requested if content else (),
                      hidden_tool_calls=bool(calls) and not content)  # fmt: skip
            if twice:
                again(len(spans) - 1)
            if draw(st.booleans()):  # the client library's span inside the framework's
                add("llm", "chat", llm, t + 1, t_end - 1, tokens=draw(st.one_of(st.none(), st.integers(0, 40))))
            t = t_end + 1
            # With content off, a turn's tool calls may have left no spans either (a tool that
            # is not traced): the hidden request is then covered by nothing, whatever comes later.
            if not calls or not tool_spans or (not content and draw(st.integers(0, 3)) == 0):
                continue
            turn_parent = agent_id
            if draw(st.booleans()):  # a span per turn around its tool calls
                turn_parent = add("other", "tools", agent_id, t, t)
                turn_index = len(spans) - 1
            ends = []
            for name, call_id in zip(calls, call_ids, strict=True):
                begin = t + 1 + draw(st.integers(0, 3))  # parallel calls start together, or nearly
                # A sub-agent runs as the turn's one call: see docs/policies.md on parallel sub-agents.
                shapes = ["leaf", "leaf", "http"] + (["sub-agent"] if depth < 2 and len(calls) == 1 else [])
                shape = draw(st.sampled_from(shapes))
                index = len(spans)
                call = call_id if draw(st.booleans()) else None
                tool = add("tool", name, turn_parent, begin, begin, tool_call_id=call,
                           error=draw(st.sampled_from([None, None, None, "boom"])))  # fmt: skip
                if shape == "sub-agent":
                    end = run(draw(st.sampled_from(["helper", "billing"])), tool, begin + 1, depth + 1) + 1
                elif shape == "http":
                    inner = begin + 1 + draw(st.integers(1, 5))
                    add("other", "GET", tool, begin + 1, inner)
                    end = inner + 1
                else:
                    end = begin + draw(st.integers(1, 20))
                spans[index].end_ns = end * 1000
                if twice and shape != "sub-agent":
                    again(index)
                ends.append(end)
            t = max(ends) + 1
            if turn_parent != agent_id:
                spans[turn_index].end_ns = t * 1000
                t += 1
            if "transfer_to_billing" in calls and depth < 2 and draw(st.booleans()):
                t = run("billing", agent_id, t, depth + 1) + 1  # the agent handed to runs next
        spans[agent_index].end_ns = t * 1000
        return t

    run("agent", None, 0, 0)
    return spans


def _early_and_final(which: int, spans: list[NormalisedSpan], cuts: list[int]) -> tuple[set[Any], set[Any]]:
    # stable: a child that ends with its parent comes first
    return early_and_final(SETS[which], WATCHES[which], sorted(spans, key=lambda s: s.end_ns), cuts)


def early_and_final(
    policies: list[CompiledPolicy], watch: EarlyWatch, ordered: list[NormalisedSpan], cuts: list[int]
) -> tuple[set[Any], set[Any]]:
    """The early failures reported while ``ordered`` (in the order they arrive, the root last)
    come in requests cut at ``cuts``, and the failures of the final verdict."""
    root, children = ordered[-1], ordered[:-1]
    assert root.parent_span_id is None
    state = watch.state()
    reported: set[tuple[str, str]] = set()
    buffered: list[NormalisedSpan] = []
    for a, b in zip([0, *cuts], [*cuts, len(children)], strict=False):
        if a >= b:
            continue
        buffered += children[a:b]
        for span in children[a:b]:
            state.add(span)
        may_fail = watch.may_fail(state, reported)
        if may_fail:
            partial = build_trajectory("t", buffered, complete=False, incomplete_reason="in_flight")
            new_early_failures(policies, in_flight(partial), reported, frozenset(may_fail), watch, state.services)
    final = build_trajectory("t", ordered)
    fails = {(p.name, v.invariant) for p in policies for v in p.evaluate(final) if v.verdict == "fail"}
    return reported, fails


@pytest.mark.parametrize("which", range(len(SETS)))
@settings(max_examples=150, deadline=None)
@given(agent_runs(), st.data())
def test_every_early_failure_is_a_failure_of_the_final_verdict(which: int, spans: list[NormalisedSpan], data: Any):
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(spans) - 1)), max_size=len(spans))))
    early, final = _early_and_final(which, spans, cuts)
    assert early <= final


@settings(max_examples=150, deadline=None)
@given(agent_runs())
def test_a_second_instrumentation_recording_every_call_again_changes_no_verdict(spans: list[NormalisedSpan]) -> None:
    """Save ``max_steps``, which counts every span's step (the second instrumentation's too)."""
    once = [s for s in spans if s.convention != "test2"]
    for policies in SETS:
        for p in policies:
            counted = [i for i, inv in enumerate(p.invariants) if "max_steps" not in getattr(inv.check, "limits", {})]
            twice, single = p.evaluate(build_trajectory("t", spans)), p.evaluate(build_trajectory("t", once))
            assert [(twice[i].invariant, twice[i].verdict) for i in counted] == [
                (single[i].invariant, single[i].verdict) for i in counted
            ], p.name


WRAPPED_POLICY = _load("policy: wrapped\ninvariants:\n  - {id: lookup-first, precedes: {first: lookup, then: pay}}\n")


def test_a_call_under_a_client_span_waits_for_its_turn_not_for_that_span() -> None:
    """A tool that runs in another service: the agent's HTTP client span around it ends with
    that one call. The model asked for a payment and a lookup in one turn; the lookup started
    as early (the clocks tie: a depth puts it first) and runs longer, so it arrives after the
    client span. The payment's precedes failure waits for the turn to be over (the agent's next
    model call), by when the lookup is in: nothing is reported, as the final verdict passes."""

    def span(span_id: str, parent: str | None, start: int, end: int, kind: str, name: str,
             **kw: Any) -> NormalisedSpan:  # fmt: skip
        return NormalisedSpan(trace_id="t", span_id=span_id, parent_span_id=parent, span_name=name, start_ns=start,
                              end_ns=end, kind=kind, name=name, convention="test", **kw)  # fmt: skip

    asked = tuple(RequestedCall(n, {"x": 1}, "captured", i) for n, i in (("pay", "c1"), ("lookup", "c2")))
    spans = [
        span("agent", None, 0, 20_000, "agent", "agent"),
        span("chat1", "agent", 1_000, 4_000, "llm", "chat", requested_calls=asked),
        span("client", "agent", 5_999, 7_001, "other", "POST /tools"),
        span("pay", "client", 6_000, 7_000, "tool", "pay"),
        span("lookup", "agent", 6_000, 8_000, "tool", "lookup"),
        span("chat2", "agent", 10_000, 13_000, "llm", "chat"),
    ]
    ordered = sorted(spans, key=lambda s: s.end_ns)
    for cuts in ([1, 2, 3], [2, 3], [1, 2, 3, 4]):
        reported, fails = early_and_final([WRAPPED_POLICY], EarlyWatch([WRAPPED_POLICY]), ordered, cuts)
        assert reported == set() and fails == set(), cuts
    # Under the agent itself, the payment's failure stands once the agent's next model call is in.
    spans[3] = span("pay", "agent", 6_000, 7_000, "tool", "pay")
    spans[4] = span("lookup", "agent", 8_000, 9_000, "tool", "lookup")
    ordered = sorted(spans, key=lambda s: s.end_ns)
    reported, fails = early_and_final([WRAPPED_POLICY], EarlyWatch([WRAPPED_POLICY]), ordered, [1, 2, 3, 4])
    assert reported == fails == {("wrapped", "lookup-first")}
