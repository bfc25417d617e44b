"""A run's duration is judged on times one clock took: steps recorded on another host (an MCP
tool server, a remote sub-agent) are timed by that host's clock, whose skew against the agent's
nothing in the trace measures. A budget on the duration fails only when the steps timed by one
clock took longer than the limit, passes when all of them together did not, and is otherwise
indeterminate: whatever the skew, never a fail or a pass the run without skew would not get."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_check_early_incremental import _load
from test_check_early_sound import agent_runs, early_and_final

from otel_plumb.assemble import build_trajectory
from otel_plumb.check import load_policy
from otel_plumb.check.early import EarlyWatch
from otel_plumb.model import NormalisedSpan
from otel_plumb.model.span import SPAN_KIND_CLIENT, SPAN_KIND_SERVER
from otel_plumb.replay import replay

FIXTURES = Path(__file__).parent / "fixtures" / "conventions"
# The generated runs take 10 to a few hundred microseconds: limits across that range.
LIMITS_MS = [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32]
POLICIES = [
    _load(f"policy: d{i}\ninvariants:\n  - {{id: quick, budget: {{max_duration_ms: {limit}}}}}\n")
    for i, limit in enumerate(LIMITS_MS)
]
WATCH = EarlyWatch(POLICIES)
LOCAL = {"service.name": "billing-agent", "host.name": "agent-host"}
REMOTE = {"service.name": "billing-tools", "host.name": "tools-host"}


def _verdicts(spans: list[NormalisedSpan]) -> list[str]:
    t = build_trajectory("t", spans)
    return [v.verdict for p in POLICIES for v in p.evaluate(t)]


def _served_remotely(spans: list[NormalisedSpan], picks: list[bool]) -> set[str]:
    """Tool spans picked to run on the remote host, with everything under them."""
    remote: set[str] = set()
    tools = [s for s in spans if s.kind == "tool"]
    for s, pick in zip(tools, picks, strict=False):
        if pick:
            remote.add(s.span_id)
    changed = True
    while changed:  # children are generated after their parent, but a sub-agent nests deeper
        changed = False
        for s in spans:
            if s.span_id not in remote and s.parent_span_id in remote:
                remote.add(s.span_id)
                changed = True
    return remote


def _on_hosts(spans: list[NormalisedSpan], remote: set[str], skew_ns: int) -> list[NormalisedSpan]:
    """The same spans, those in ``remote`` recorded by the tool host, whose clock is ``skew_ns`` ahead."""
    for s in spans:
        if s.span_id in remote:
            s.attributes = REMOTE
            s.start_ns += skew_ns
            s.end_ns += skew_ns
        else:
            s.attributes = LOCAL
    return spans


@settings(max_examples=200, deadline=None)
@given(agent_runs(), st.lists(st.booleans(), min_size=1, max_size=12), st.integers(-300_000, 300_000))
def test_a_skewed_clock_never_makes_a_duration_verdict_the_unskewed_run_would_not_get(
    spans: list[NormalisedSpan], picks: list[bool], skew_ns: int
) -> None:
    spans = [s for s in spans if s.convention != "test2"]  # a second instrumentation: on the first's host
    true = _verdicts(_on_hosts(spans, set(), 0))
    remote = _served_remotely(spans, picks)
    # Without skew: the agent's own span covers the run, so its clock alone says as much. (But
    # for a request whose tool names content capture hid: a tool span of another process,
    # whose start its own clock gives, answers it only if the trace bounds that start within
    # the request's turn, which these spans, not called by a CLIENT span, do not.)
    unskewed = _verdicts(_on_hosts(spans, remote, 0))
    if not any(s.hidden_tool_calls for s in spans):
        assert unskewed == true
    skewed = _verdicts(_on_hosts(spans, remote, skew_ns))
    for was, now in zip(true, skewed, strict=True):
        assert now in (was, "indeterminate"), (was, now)


@settings(max_examples=150, deadline=None)
@given(agent_runs(), st.lists(st.booleans(), min_size=1, max_size=12), st.integers(-300_000, 300_000), st.data())
def test_an_early_duration_failure_stands_whatever_the_skew(
    spans: list[NormalisedSpan], picks: list[bool], skew_ns: int, data: Any
) -> None:
    spans = [s for s in spans if s.convention != "test2"]
    ordered = sorted(spans, key=lambda s: s.end_ns)  # as the SDKs export them, on the true clock
    _on_hosts(spans, _served_remotely(spans, picks), skew_ns)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(spans) - 1)), max_size=len(spans))))
    reported, fails = early_and_final(POLICIES, WATCH, ordered, cuts)
    assert reported <= fails


def _mcp_remote(tmp_path: Path, skew_ns: int, fixture: str = "mcp_remote", remote: str = "billing-tools") -> Path:
    """A captured two-process trace (the MCP one), the clock of the ``remote`` service's process
    ``skew_ns`` ahead."""
    out = tmp_path / f"{fixture}{skew_ns}.jsonl"
    with out.open("w") as f:
        for line in (FIXTURES / f"{fixture}.jsonl").read_text().splitlines():
            request = json.loads(line)
            for rs in request["resourceSpans"]:
                service = {a["key"]: a["value"].get("stringValue") for a in rs["resource"]["attributes"]}
                if service["service.name"] != remote:
                    continue
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        for key in ("startTimeUnixNano", "endTimeUnixNano"):
                            span[key] = str(int(span[key]) + skew_ns)
            f.write(json.dumps(request) + "\n")
    return out


def _replay_verdict(path: Path, limit_ms: float, tmp_path: Path, invariant: str = "") -> Any:
    invariant = invariant or f"{{id: quick, budget: {{max_duration_ms: {limit_ms}}}}}"
    policy = tmp_path / "p.yaml"
    policy.write_text(f"policy: p\ninvariants:\n  - {invariant}\n")
    (trajectory,) = [t for t in replay([path]).trajectories if t.steps]
    (verdict,) = load_policy(policy).evaluate(trajectory)
    return trajectory, verdict


@pytest.mark.parametrize("skew_s", [0, 5, -5])
def test_a_captured_mcp_server_in_another_process(tmp_path: Path, skew_s: int) -> None:
    """The agent and its MCP tool server in two processes, one trace: with the server's clock
    5 s ahead or behind, a 1 s budget the run kept is indeterminate, not a fail; one the agent's
    own steps broke fails, saying by which clock (the server's steps broke it too)."""
    trajectory, kept = _replay_verdict(_mcp_remote(tmp_path, skew_s * 10**9), 1000, tmp_path)
    assert len(set(trajectory.clocks.values())) == 2
    if skew_s == 0:
        assert kept.verdict == "pass"
    else:
        assert kept.verdict == "indeterminate" and "2 clocks" in kept.message and "skewed" in kept.message
    agent_steps = [s for s in trajectory.steps if "billing-agent" in trajectory.clocks[s.span_id]]
    took_ms = (max(s.end_ns for s in agent_steps) - min(s.start_ns for s in agent_steps)) / 1e6
    _, broken = _replay_verdict(_mcp_remote(tmp_path, skew_s * 10**9), took_ms / 2, tmp_path)
    assert broken.verdict == "fail" and "by the clock of billing-" in broken.message
    # CEL reads the whole extent: skewed, it is no measure of the run.
    _, by_cel = _replay_verdict(_mcp_remote(tmp_path, skew_s * 10**9), 0, tmp_path,
                                "{id: cel, expr: 'trajectory.duration_ms < 1000'}")  # fmt: skip
    if skew_s == 0:
        assert by_cel.verdict == "pass"
    else:
        assert by_cel.verdict == "indeterminate" and "duration_ms spans the times of 2 clocks" in by_cel.message


# Steps of two clocks are ordered as far as the trace can say: a remote span started after the
# agent's span its call came from started, and, when the agent waited for it (a CLIENT span over
# a SERVER span), before that span ended. A verdict that turns on the order of calls of two
# clocks the trace cannot place stands only if every order the trace allows gives it.
ORDER_POLICY = _load("""
policy: order
invariants:
  - {id: lookup-first, precedes: {first: lookup, then: pay}}
  - {id: check-first, precedes: {first: check, then: refund}}
  - {id: pay-after-lookup, responds: {trigger: lookup, then: pay}}
  - {id: pay-as-looked-up, arg_equals: {tool: pay, arg: x, step: {tool: lookup, arg: x}}}
  - id: first-call-is-lookup
    expr: "size(steps.filter(s, s.kind == 'tool')) == 0 || steps.filter(s, s.kind == 'tool')[0].name == 'lookup'"
  - id: pay-after-a-lookup
    expr: "steps.all(p, p.name != 'pay' || steps.exists(l, l.name == 'lookup' && l.index < p.index))"
""")


def _ids_for_all_or_none(spans: list[NormalisedSpan]) -> list[NormalisedSpan]:
    """The run with its tool spans' call ids, if all have one, else with none: calls the model
    asked for in one turn are ordered by its request only among those whose span records the
    id (``_order_parallel_calls``), and which calls those are would decide the order of the
    others, start times a microsecond apart, for reasons that are not the clocks'."""
    spans = [s for s in spans if s.convention != "test2"]  # a second instrumentation: on the first's host
    tools = [s for s in spans if s.kind == "tool"]
    if not all(s.tool_call_id for s in tools):
        for s in tools:
            s.tool_call_id = None
    return spans


def _order_verdicts(spans: list[NormalisedSpan]) -> list[str]:
    return [v.verdict for v in ORDER_POLICY.evaluate(build_trajectory("t", spans))]


def _called_remotely(spans: list[NormalisedSpan], picks: list[bool]) -> tuple[list[NormalisedSpan], set[str]]:
    """The run with the picked tool calls served by another process: a CLIENT span of the
    agent's (``POST /tools``, around the call) over the tool span, now a SERVER span."""
    out = list(spans)
    remote = _served_remotely(spans, picks)
    for s in spans:
        if s.span_id in remote and s.parent_span_id not in remote:
            client = NormalisedSpan(
                trace_id=s.trace_id, span_id=f"k{s.span_id}", parent_span_id=s.parent_span_id, span_name="POST /tools",
                start_ns=s.start_ns - 1, end_ns=s.end_ns + 1, kind="other", name="POST /tools", convention="unknown",
                span_kind=SPAN_KIND_CLIENT,
            )  # fmt: skip
            s.parent_span_id, s.span_kind = client.span_id, SPAN_KIND_SERVER
            out.append(client)
    return out, remote


@settings(max_examples=200, deadline=None)
@given(agent_runs(), st.lists(st.booleans(), min_size=1, max_size=12), st.integers(-300_000, 300_000),
       st.booleans())  # fmt: skip
def test_a_skewed_clock_never_makes_an_order_verdict_the_unskewed_run_would_not_get(
    spans: list[NormalisedSpan], picks: list[bool], skew_ns: int, waited: bool
) -> None:
    """``waited``: the agent calls the other process and waits for the answer (CLIENT over
    SERVER); else the remote spans hang under the agent's own, as a message's consumer does."""
    spans = _ids_for_all_or_none(spans)
    if waited:
        spans, remote = _called_remotely(spans, picks)
    else:
        remote = _served_remotely(spans, picks)
    true = _order_verdicts(_on_hosts(spans, set(), 0))
    for skew in (0, skew_ns):
        for was, now in zip(true, _order_verdicts(_on_hosts(spans, remote, skew)), strict=True):
            assert now in (was, "indeterminate"), (was, now, skew)
        _on_hosts(spans, remote, -skew)  # back to the true times


@settings(max_examples=150, deadline=None)
@given(agent_runs(), st.lists(st.booleans(), min_size=1, max_size=12), st.integers(-300_000, 300_000), st.data())
def test_an_early_order_failure_stands_whatever_the_skew(
    spans: list[NormalisedSpan], picks: list[bool], skew_ns: int, data: Any
) -> None:
    spans, remote = _called_remotely(_ids_for_all_or_none(spans), picks)
    true = {("order", v.invariant) for v in ORDER_POLICY.evaluate(build_trajectory("t", _on_hosts(spans, set(), 0)))
            if v.verdict == "fail"}  # fmt: skip
    ordered = sorted(spans, key=lambda s: s.end_ns)  # as the SDKs export them, on the true clock
    _on_hosts(spans, remote, skew_ns)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(spans) - 1)), max_size=len(spans))))
    reported, fails = early_and_final([ORDER_POLICY], ORDER_WATCH, ordered, cuts)
    assert reported <= fails <= true


ORDER_WATCH = EarlyWatch([ORDER_POLICY])


@pytest.mark.parametrize("skew_s", [0, 5, -5, 0.05, -0.05])
def test_a_captured_sub_agent_in_another_process(tmp_path: Path, skew_s: float) -> None:
    """The billing agent's tool calls the payments agent in another process over HTTP (httpx's
    CLIENT span, the ASGI SERVER span): its payments started after the agent's HTTP request did
    and before the answer came, whatever the payments process's clock says. Skewed 5 s either
    way (before: the payments sorted before the lookup, or after the notification, and two
    orders failed that the run kept), the verdicts are the unskewed run's."""
    path = _mcp_remote(tmp_path, int(skew_s * 10**9), "pydantic_ai_remote_subagent", "payments-agent")
    invariants = {
        "{id: lookup-first, precedes: {first: lookup_invoice, then: send_payment}}": "pass",
        "{id: paid-then-notified, responds: {trigger: send_payment, then: notify_customer}}": "pass",
        "{id: notify-last, precedes: {first: send_payment, then: notify_customer}}": "pass",
        "{id: notify-first, precedes: {first: notify_customer, then: send_payment}}": "fail",
        "{id: as-looked-up, arg_equals: {tool: send_payment, arg: invoice_id, "
        "step: {tool: lookup_invoice, arg: invoice_id}}}": "pass",
        "{id: tools-in-order, expr: \"steps.filter(s, s.kind == 'tool' && s.error == null).map(s, s.name) == "
        "['lookup_invoice', 'send_payment', 'notify_customer']\"}": "pass",
    }  # fmt: skip
    for invariant, verdict in invariants.items():
        trajectory, got = _replay_verdict(path, 0, tmp_path, invariant)
        assert len(set(trajectory.clocks.values())) == 2
        assert got.verdict == verdict, (invariant, got.message)
    steps = [s.name for s in trajectory.steps if s.kind == "tool"]
    assert steps == ["lookup_invoice", "send_payment", "send_payment", "notify_customer"]


def test_the_traces_of_a_session_served_by_two_hosts_keep_their_order() -> None:
    """A conversation whose turns two replicas served (a trace each, on hosts of their own):
    nothing in the traces bounds one's times by the other's clock, and the turns are in the
    order they started, as on one host: the lookup of the first turn precedes the payment of
    the second, and an order the first turn broke still fails."""

    def turn(trace: str, host: str, start: int, tool: str) -> list[NormalisedSpan]:
        resource = {"service.name": "billing-agent", "host.name": host}
        agent = NormalisedSpan(trace_id=trace, span_id=f"{trace}-a", parent_span_id=None, span_name="agent",
                               start_ns=start, end_ns=start + 100, kind="agent", name="billing",
                               convention="test", attributes=resource, session_id="conv-1")  # fmt: skip
        call = NormalisedSpan(trace_id=trace, span_id=f"{trace}-t", parent_span_id=agent.span_id, span_name=tool,
                              start_ns=start + 10, end_ns=start + 90, kind="tool", name=tool, convention="test",
                              attributes=resource, session_id="conv-1")  # fmt: skip
        return [agent, call]

    spans = turn("t1", "replica-a", 1_000, "lookup") + turn("t2", "replica-b", 5_000, "pay")
    t = build_trajectory("conv-1", spans, session_id="conv-1")
    assert len(set(t.clocks.values())) == 2 and not t.start_bounds
    verdicts = {v.invariant: v.verdict for v in ORDER_POLICY.evaluate(t)}
    assert verdicts["lookup-first"] == "pass" and verdicts["first-call-is-lookup"] == "pass"
    spans = turn("t1", "replica-a", 1_000, "pay") + turn("t2", "replica-b", 5_000, "lookup")
    verdicts = {v.invariant: v.verdict for v in ORDER_POLICY.evaluate(build_trajectory("c", spans, session_id="c"))}
    assert verdicts["lookup-first"] == "fail" and verdicts["first-call-is-lookup"] == "fail"
