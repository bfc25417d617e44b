"""Incremental early checks: per-trace counters decide when the partial trajectory is built and
checked. Whatever the spans, however they are split into requests and ordered, the early
failures reported after each request are those of building and checking the partial trajectory
after every request (what the processor did before the counters)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.assemble import build_trajectory
from otel_plumb.check import CompiledPolicy, load_policy
from otel_plumb.check.early import EarlyWatch, in_flight, new_early_failures
from otel_plumb.model import NormalisedSpan, RequestedCall, Verdict

POLICY_TEXT = """
policy: early
invariants:
  - {id: never-delete, never_call: delete}
  - {id: never-try-wipe, never_call: {tool: wipe, attempts: true}}
  - {id: pay-once, call_count: {tool: pay, max: 1}}
  - {id: look-twice, call_count: {tool: lookup, min: 1, max: 2}}
  - {id: look-before-pay, precedes: {first: lookup, then: pay}}
  - {id: check-before-pay-after-look, precedes: {first: check, then: pay}, scope: {after: lookup}}
  - {id: handoff-before-pay, precedes: {first: transfer_to_billing, then: pay}}
  - {id: pay-before-handoff, precedes: {first: pay, then: [transfer_to_billing, check]}}
  - {id: small, budget: {max_steps: 9, max_tool_errors: 1}}
  - {id: quick, budget: {max_duration_ms: 0.03, max_tokens: 60}}
  - {id: few-calls, budget: {max_tool_calls: 4, max_llm_calls: 2}}
"""
OTHER_TEXT = """
policy: other
applies_to: {service: billing-*}
invariants:
  - {id: no-refund, never_call: refund}
  - {id: pay-once, call_count: {tool: [pay, refund], max: 0}}
"""
TOOLS = ["delete", "wipe", "pay", "lookup", "check", "refund", "transfer_to_billing", "other_tool"]
# Most calls are of the few tools the ordering invariants name, so that orders are tried.
COMMON = ["pay", "lookup", "check"]


def _load(text: str) -> CompiledPolicy:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.yaml"
        path.write_text(text)
        return load_policy(path)


def _alone(text: str) -> list[list[CompiledPolicy]]:
    """Each invariant of a policy as a policy of its own (so that one invariant that may always
    fail does not make the counters of the others untested)."""
    head, _, body = text.partition("invariants:\n")
    return [[_load(f"{head}invariants:\n{line}\n")] for line in body.splitlines() if line.strip()]


# Every invariant alone, and all of them together.
POLICY_SETS = [*_alone(POLICY_TEXT), *_alone(OTHER_TEXT), [_load(POLICY_TEXT), _load(OTHER_TEXT)]]
WATCHES = [EarlyWatch(policies) for policies in POLICY_SETS]


@st.composite
def traces(draw: Any) -> list[NormalisedSpan]:
    n = draw(st.integers(1, 14))
    spans: list[NormalisedSpan] = []
    for i in range(n):
        kind = draw(st.sampled_from(["tool", "tool", "tool", "llm", "agent", "other"]))
        parent = draw(st.one_of(st.none(), st.integers(0, n)))  # n: a parent not in the trace
        start = draw(st.integers(0, 6)) * 1000  # ties happen
        requested: list[RequestedCall] = []
        if kind == "llm":
            for j in range(draw(st.integers(0, 3))):
                name = draw(st.sampled_from(TOOLS))
                call_id = draw(st.one_of(st.none(), st.just(f"c{i}_{j}")))
                requested.append(RequestedCall(name, {"x": j}, "captured", call_id))
        spans.append(
            NormalisedSpan(
                trace_id="t", span_id=f"s{i}", parent_span_id=None if parent is None else f"s{parent}",
                span_name=f"span {i}", start_ns=start, end_ns=start + draw(st.integers(0, 40)) * 1000, kind=kind,
                name=draw(st.sampled_from(COMMON * 3 + TOOLS)) if kind == "tool"
                else draw(st.sampled_from(["a", "b", "billing"])),
                convention="test",
                error=draw(st.sampled_from([None, None, None, "boom"])) if kind == "tool" else None,
                tokens=draw(st.one_of(st.none(), st.integers(0, 40))) if kind == "llm" else None,
                tool_call_id=draw(st.one_of(st.none(), st.sampled_from([f"c{k}_0" for k in range(n)]))),
                requested_calls=tuple(requested),
                attributes={"service.name": draw(st.sampled_from(["billing-api", "support"]))},
            )
        )  # fmt: skip
    return spans


def _new_failures(
    which: int, spans: list[NormalisedSpan], reported: set[tuple[str, str]],
    only: frozenset[tuple[str, str]] | None = None,
) -> list[Verdict]:
    """What the processor reports after a request: unreported early failures (of the invariants
    in ``only``) that stand."""
    partial = in_flight(build_trajectory("t", spans, complete=False, incomplete_reason="in_flight"))
    services = {str(s.attributes.get("service.name", "")) for s in spans}
    return new_early_failures(POLICY_SETS[which], partial, reported, only, WATCHES[which], services)


@pytest.mark.parametrize("which", range(len(POLICY_SETS) - 1))
@settings(max_examples=150, deadline=None)
@given(traces())
def test_no_invariant_fails_where_its_counters_say_it_cannot(which: int, spans: list[NormalisedSpan]) -> None:
    watch = WATCHES[which]
    state = watch.state()
    for span in spans:
        state.add(span)
    if _new_failures(which, spans, set()):
        assert watch.may_fail(state, set())


@pytest.mark.parametrize("which", range(len(POLICY_SETS)))
# Which span ids the counters know arrived: their own (each span's, as it is added), or the
# assembler's index (as the processor gives them), which holds each span before the counters
# see it: one span at a time, or a whole request's (the counters made for spans already buffered).
@pytest.mark.parametrize("index", ["own", "per span", "per request"])
@settings(max_examples=30, deadline=None)
@given(traces(), st.data())
def test_counters_report_what_checking_after_every_request_reports(
    which: int, index: str, spans: list[NormalisedSpan], data: Any
) -> None:
    watch = WATCHES[which]
    order = data.draw(st.permutations(range(len(spans))))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(spans) - 1)), max_size=len(spans))))
    requests = [[spans[i] for i in order[a:b]] for a, b in zip([0, *cuts], [*cuts, len(spans)], strict=False) if a < b]
    buffered: list[NormalisedSpan] = []
    every: set[tuple[str, str]] = set()
    gated: set[tuple[str, str]] = set()
    arrived: set[str] = set()
    state = watch.state() if index == "own" else watch.state(arrived)
    for request in requests:
        buffered += request
        if index == "per request":
            arrived.update(span.span_id for span in request)
        for span in request:
            arrived.add(span.span_id)
            state.add(span)
        expected = _new_failures(which, buffered, every)
        # Only the invariants the counters name are checked, as the processor does.
        may_fail = watch.may_fail(state, gated)
        got = _new_failures(which, buffered, gated, frozenset(may_fail)) if may_fail else []
        assert got == expected


@settings(max_examples=50, deadline=None)
@given(st.integers(0, len(POLICY_SETS) - 1), traces(), st.data())
def test_in_end_order_any_split_reports_the_failures_of_one_delivery(
    which: int, spans: list[NormalisedSpan], data: Any
) -> None:
    """As SDK exporters send spans (when they end): however the requests are cut, the early
    failures in the end are those found on the whole trace in flight, as the counters gate them."""
    watch = WATCHES[which]
    ordered = sorted(spans, key=lambda s: (s.end_ns, s.span_id))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(spans) - 1)), max_size=len(spans))))
    state = watch.state()
    reported: set[tuple[str, str]] = set()
    buffered: list[NormalisedSpan] = []
    for a, b in zip([0, *cuts], [*cuts, len(spans)], strict=False):
        buffered += ordered[a:b]
        for span in ordered[a:b]:
            state.add(span)
        if watch.may_fail(state, reported):
            _new_failures(which, buffered, reported)
    whole = watch.state()
    for span in ordered:
        whole.add(span)
    once: set[tuple[str, str]] = set()
    if watch.may_fail(whole, once):
        _new_failures(which, ordered, once)
    # each split reports at least what one delivery does (a failure seen on part of a trace in
    # flight stands), and counting the same spans in any split gives the same counters
    assert once <= reported
    assert watch.may_fail(state, set()) == watch.may_fail(whole, set())


def test_a_requested_call_and_its_tool_span_count_once():
    """A model asking for ``pay`` and the tool span that ran it are one call: with content
    capture on every call arrives twice, and counting both would build the partial trajectory
    again on every request of a trace that calls ``pay`` once (call_count max 1). A call only
    requested counts for nothing in flight (a tool span may still show it failed)."""
    pay_once = next(p for p in POLICY_SETS if [i.id for i in p[0].invariants] == ["pay-once"])
    watch = EarlyWatch(pay_once)
    state = watch.state()
    common = {"trace_id": "t", "convention": "test", "parent_span_id": "root"}
    state.add(NormalisedSpan(span_id="m1", span_name="chat", start_ns=0, end_ns=10, kind="llm", name="chat",
                             requested_calls=(RequestedCall("pay", {}, "captured", "c1"),), **common))  # fmt: skip
    assert not watch.may_fail(state, set())  # a requested call: no step while in flight
    state.add(NormalisedSpan(span_id="p1", span_name="pay", start_ns=20, end_ns=30, kind="tool", name="pay",
                             tool_call_id="c1", **common))  # fmt: skip
    assert not watch.may_fail(state, set())  # the same call: the request is no step of its own now
    state.add(NormalisedSpan(span_id="p2", span_name="pay", start_ns=40, end_ns=50, kind="tool", name="pay", **common))
    assert watch.may_fail(state, set())  # a second call


def test_nothing_is_checked_in_flight_once_an_mcp_record_of_a_call_arrives():
    """Two MCP records of ``pay`` (a retry inside one call) arrive before the framework's tool
    span around them, which makes them one call (``assemble.trajectory``): counted in flight
    they would be two, a false early failure of call_count max 1."""
    pay_once = next(p for p in POLICY_SETS if [i.id for i in p[0].invariants] == ["pay-once"])
    watch = EarlyWatch(pay_once)
    state = watch.state()
    common = {"trace_id": "t", "kind": "tool", "name": "pay", "span_name": "tools/call pay"}
    state.add(NormalisedSpan(span_id="i1", parent_span_id="o", start_ns=1, end_ns=2, convention="mcp", **common))
    state.add(NormalisedSpan(span_id="i2", parent_span_id="o", start_ns=3, end_ns=4, convention="mcp", **common))
    assert not watch.may_fail(state, set())
    state.add(NormalisedSpan(span_id="o", parent_span_id="r", start_ns=0, end_ns=5, convention="test", **common))
    partial = build_trajectory("t", [NormalisedSpan(span_id=i, parent_span_id=p, start_ns=a, end_ns=b,
                                                    convention=c, **common)
                                     for i, p, a, b, c in [("i1", "o", 1, 2, "mcp"), ("i2", "o", 3, 4, "mcp"),
                                                           ("o", "r", 0, 5, "test")]])  # fmt: skip
    assert [s.span_id for s in partial.tool_steps] == ["o"]  # one call, as the final trajectory says
    assert not watch.may_fail(state, set())
    # Without MCP records, the same counters say a second call may fail it.
    other = watch.state()
    for i in ("p1", "p2"):
        other.add(NormalisedSpan(span_id=i, parent_span_id="r", start_ns=1, end_ns=2, convention="test", **common))
    assert watch.may_fail(other, set())


def test_a_precedes_failure_is_looked_for_once_its_turn_is_over():
    """``pay`` without an earlier ``lookup`` fails only once ``pay``'s turn is over (a ``lookup``
    beside it may have started earlier): until a model call after it or its parent arrives,
    the counters say no, however many other spans arrive, so the partial trajectory is not
    built on every request of a long turn."""
    look_before_pay = next(p for p in POLICY_SETS if [i.id for i in p[0].invariants] == ["look-before-pay"])
    watch = EarlyWatch(look_before_pay)
    state = watch.state()
    common = {"trace_id": "t", "convention": "test"}
    state.add(NormalisedSpan(span_id="m1", parent_span_id="agent", span_name="chat", start_ns=0, end_ns=10,
                             kind="llm", name="chat", **common))  # fmt: skip
    state.add(NormalisedSpan(span_id="p1", parent_span_id="agent", span_name="pay", start_ns=20, end_ns=30,
                             kind="tool", name="pay", **common))  # fmt: skip
    assert not watch.may_fail(state, set())
    for n in range(3):  # database spans under the call, a model call of another agent
        state.add(NormalisedSpan(span_id=f"db{n}", parent_span_id="p1", span_name="SELECT", start_ns=21 + n,
                                 end_ns=22 + n, kind="other", name="SELECT", **common))  # fmt: skip
    state.add(NormalisedSpan(span_id="m2", parent_span_id="other-agent", span_name="chat", start_ns=40, end_ns=50,
                             kind="llm", name="chat", **common))  # fmt: skip
    assert not watch.may_fail(state, set())
    state.add(NormalisedSpan(span_id="m3", parent_span_id="agent", span_name="chat", start_ns=40, end_ns=50,
                             kind="llm", name="chat", **common))  # fmt: skip
    assert watch.may_fail(state, set())  # the agent asked the model again: the turn is over
    parent_first = watch.state()
    parent_first.add(NormalisedSpan(span_id="agent", parent_span_id=None, span_name="agent", start_ns=0,
                                    end_ns=100, kind="agent", name="a", **common))  # fmt: skip
    parent_first.add(NormalisedSpan(span_id="p1", parent_span_id="agent", span_name="pay", start_ns=20, end_ns=30,
                                    kind="tool", name="pay", **common))  # fmt: skip
    assert watch.may_fail(parent_first, set())  # its parent is in: the turn is over


def test_a_handoff_call_among_the_then_tools_does_not_hold_a_failure_back():
    """A ``transfer_to_<agent>`` call is no tool step in flight: when it is the earliest ``then``
    call, the fail names a later one, whose turn is what counts."""
    which = next(i for i, p in enumerate(POLICY_SETS) if [v.id for v in p[0].invariants] == ["pay-before-handoff"])
    watch = WATCHES[which]
    common = {"trace_id": "t", "convention": "test"}
    spans = [
        NormalisedSpan(span_id="h1", parent_span_id="p", span_name="transfer", start_ns=10, end_ns=15, kind="tool",
                       name="transfer_to_billing", **common),
        NormalisedSpan(span_id="c1", parent_span_id="q", span_name="check", start_ns=20, end_ns=25, kind="tool",
                       name="check", **common),
        NormalisedSpan(span_id="m1", parent_span_id="q", span_name="chat", start_ns=30, end_ns=35, kind="llm",
                       name="chat", **common),
    ]  # fmt: skip
    state = watch.state()
    for span in spans:
        state.add(span)
    assert [v.span_id for v in _new_failures(which, spans, set())] == ["c1"]
    assert watch.may_fail(state, set())


def test_a_call_at_the_last_representable_time_is_counted():
    """Start times are unsigned 64-bit in OTLP: a call at any of them (garbage clocks included)
    is a call the counters know of."""
    which = next(i for i, p in enumerate(POLICY_SETS) if [v.id for v in p[0].invariants] == ["look-before-pay"])
    common = {"trace_id": "t", "convention": "test"}
    late = 2**64 - 20
    spans = [
        NormalisedSpan(span_id="a", parent_span_id=None, span_name="agent", start_ns=late - 5, end_ns=late + 19,
                       kind="agent", name="a", **common),
        NormalisedSpan(span_id="p", parent_span_id="a", span_name="pay", start_ns=late, end_ns=late + 10,
                       kind="tool", name="pay", **common),
    ]  # fmt: skip
    state = WATCHES[which].state()
    for span in spans:
        state.add(span)
    assert [v.span_id for v in _new_failures(which, spans, set())] == ["p"]
    assert WATCHES[which].may_fail(state, set())
