import json

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.assemble import AddOutcome, Assembler, AssemblyLimits, build_trajectory
from otel_plumb.assemble import trajectory as trajectory_module
from otel_plumb.model import NormalisedSpan, RequestedCall, SpanRecord
from otel_plumb.normalise import normalise


def ns(span_id, parent=None, start=0, kind="other", name=None, trace="t1", **kw):
    return NormalisedSpan(
        trace_id=trace,
        span_id=span_id,
        parent_span_id=parent,
        span_name=name or span_id,
        start_ns=start,
        end_ns=start + 10,
        kind=kind,
        name=name or span_id,
        convention="test",
        **kw,
    )


def test_steps_ordered_by_start_with_parent_first_and_one_index_space():
    spans = [ns("c", "a", 5, "tool", "b_tool"), ns("a", None, 0, "agent"), ns("b", "a", 0, "llm")]
    t = build_trajectory("t1", spans)
    assert [s.span_id for s in t.steps] == ["a", "b", "c"]
    assert [s.index for s in t.steps] == [0, 1, 2]
    assert t.complete and t.root_span_id == "a"
    assert t.steps[2].agent == "a"  # inherited from the enclosing agent span


def test_requested_calls_become_steps_only_without_tool_spans():
    call = RequestedCall("lookup", {"q": 1}, "captured", "call_1")
    llm = ns("l", "r", 1, "llm", requested_calls=(call,))
    t = build_trajectory("t1", [ns("r", None, 0, "agent"), llm])
    tools = t.tool_steps
    assert len(tools) == 1 and tools[0].source == "llm_output" and tools[0].args == {"q": 1}

    tool = ns("x", "r", 20, "tool", "lookup", tool_call_id="call_1")
    t2 = build_trajectory("t1", [ns("r", None, 0, "agent"), llm, tool])
    assert [(s.name, s.source) for s in t2.tool_steps] == [("lookup", "span")]
    assert t2.tool_steps[0].args == {"q": 1}  # args filled from the request, not doubled


def test_trace_without_root_is_incomplete():
    t = build_trajectory("t1", [ns("a", "gone1"), ns("b", "gone2")])
    assert not t.complete and t.incomplete_reason == "no_root"


def test_root_with_remote_parent_is_a_root():
    t = build_trajectory("t1", [ns("a", "remote"), ns("b", "a", 1)])
    assert t.complete and t.root_span_id == "a"


def test_idle_timeout_after_root_and_late_spans():
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100))
    asm.add(ns("b", "a", 1), None, now=0.0)
    asm.add(ns("c", "a2", 1), None, now=0.0)
    assert asm.due(5.0) == []  # two top spans, no root: wait (max_wait decides)
    assert asm.add(ns("a"), None, now=5.0)[0] is AddOutcome.ACCEPTED
    assert asm.due(5.5) == []
    assert len(asm.due(6.1)[0].spans) == 3
    asm2 = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100))
    asm2.add(ns("a"), None, now=0.0)
    asm2.add(ns("b", "a", 1), None, now=0.5)
    assert asm2.due(1.2) == []
    done = asm2.due(1.6)
    assert len(done) == 1 and done[0].complete and len(done[0].spans) == 2
    assert asm2.add(ns("c", "a", 2), None, now=2.0, fingerprint=5)[0] is AddOutcome.LATE
    # Its resend is a duplicate (not forwarded a second time); another copy under its ids conflicts.
    assert asm2.add(ns("c", "a", 2), None, now=2.1, fingerprint=5)[0] is AddOutcome.DUPLICATE
    assert asm2.add(ns("c", "a", 2), None, now=2.1, fingerprint=6)[0] is AddOutcome.CONFLICTING_DUPLICATE


def test_a_trace_let_go_says_when_its_last_span_was_taken():
    """The decision latency counts from there: not from a span over the limit, a duplicate or
    the trace being taken back to wait for late spans; a session's, from its last trace's."""
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100, max_spans_per_trace=2, confirm_wait_s=5.0))
    asm.add(ns("a"), None, now=0.0, fingerprint=1)
    asm.add(ns("b", "a", 1), None, now=0.4, fingerprint=2)
    assert asm.add(ns("b", "a", 1), None, now=0.6, fingerprint=2)[0] is AddOutcome.DUPLICATE
    assert asm.add(ns("c", "a", 2), None, now=0.7, fingerprint=3)[0] is AddOutcome.OVER_LIMIT
    (done,) = asm.due(1.8)
    assert (done.first_seen, done.last_span_at) == (0.0, 0.4)
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100, confirm_wait_s=5.0))
    asm.add(ns("a"), None, now=0.0)
    asm.add(ns("b", "a", 1), None, now=0.3)
    (done,) = asm.due(1.5)
    assert asm.wait_for_late_spans(done, 1.5)
    (again,) = asm.due(6.5)
    assert again.waited and again.last_span_at == 0.3
    asm = Assembler(AssemblyLimits(group_by="session", idle_timeout_s=0.1, session_idle_timeout_s=5))
    asm.add(ns("a", trace="t1", session_id="s"), None, 0.0)
    asm.add(ns("b", trace="t2", session_id="s", start=100), None, 0.2)
    asm.add(ns("c", "b", trace="t2", session_id="s", start=101), None, 0.25)
    assert asm.due(1.0) == []  # the traces are done; the session waits
    (session,) = asm.due(10.0)
    assert session.last_span_at == 0.25


def test_max_wait_cuts_short_as_incomplete_and_eviction_bounds_memory():
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=3.0, max_traces=2))
    asm.add(ns("a", "p", trace="t1"), None, now=0.0)
    asm.add(ns("x1", trace="t2"), None, now=0.0)
    asm.add(ns("x2", "x1", trace="t2"), None, now=0.0)
    _, evicted = asm.add(ns("z", trace="t3"), None, now=0.1)
    assert [f.key for f in evicted] == ["t1"] and not evicted[0].complete
    assert evicted[0].incomplete_reason == "evicted"
    assert asm.traces_in_flight == 2


def test_span_limit_makes_trajectory_incomplete():
    asm = Assembler(AssemblyLimits(max_spans_per_trace=2))
    asm.add(ns("a"), None, 0)
    asm.add(ns("b", "a"), None, 0)
    assert asm.add(ns("c", "a"), None, 0)[0] is AddOutcome.OVER_LIMIT
    (done,) = asm.drain(1)
    assert not done.complete and done.incomplete_reason == "span_limit"


def test_session_grouping_joins_traces():
    asm = Assembler(AssemblyLimits(group_by="session", idle_timeout_s=0.1, session_idle_timeout_s=5))
    asm.add(ns("a", trace="t1", session_id="s"), None, 0)
    asm.add(ns("b", trace="t2", session_id="s", start=100), None, 0)
    assert asm.due(1.0) == []
    (done,) = asm.due(10.0)
    t = done.trajectory()
    assert t.key == "s" and t.trace_ids == ["t1", "t2"]
    assert t.complete and t.root_span_id == "a"  # each trace has its own root


def test_tool_spans_without_call_ids_are_matched_by_name_in_order():
    first = RequestedCall("pay", {"amount": 1}, "captured", "c1")
    second = RequestedCall("pay", {"amount": 2}, "captured", "c2")
    spans = [
        ns("r", None, 0, "agent"),
        ns("l1", "r", 1, "llm", requested_calls=(first,)),
        ns("p1", "r", 20, "tool", "pay"),
        ns("l2", "r", 40, "llm", requested_calls=(second,)),
        ns("p2", "r", 60, "tool", "pay"),
    ]
    t = build_trajectory("t1", spans)
    assert [(s.span_id, s.args, s.args_source) for s in t.tool_steps] == [
        ("p1", {"amount": 1}, "llm_output"),
        ("p2", {"amount": 2}, "llm_output"),
    ]
    assert t.problems == []
    # A request with no tool span left to claim is reported, not turned into a step.
    extra = ns("l3", "r", 80, "llm", requested_calls=(RequestedCall("pay", {}, "captured", "c3"),))
    t2 = build_trajectory("t1", [*spans, extra])
    assert len(t2.tool_steps) == 2 and t2.problems == ["tool call 'pay' requested in span l3 has no tool span"]


def test_a_tool_span_without_an_id_answers_the_latest_request_of_its_name():
    # l1's pay span is missing; the one pay span runs after l2 asked again: it is l2's call.
    first = RequestedCall("pay", {"amount": 10}, "captured", None)
    second = RequestedCall("pay", {"amount": 20}, "captured", None)
    spans = [
        ns("r", None, 0, "agent"),
        ns("l1", "r", 1, "llm", requested_calls=(first,)),
        ns("l2", "r", 20, "llm", requested_calls=(second,)),
        ns("p", "r", 40, "tool", "pay"),
    ]
    t = build_trajectory("t1", spans)
    assert [(s.span_id, s.args, s.args_status) for s in t.tool_steps] == [("p", {"amount": 20}, "captured")]
    assert t.problems == ["tool call 'pay' requested in span l1 has no tool span"]


def test_a_tool_span_without_an_id_that_may_answer_requests_with_other_arguments_takes_none():
    pay = [RequestedCall("pay", {"amount": a}, "captured", None) for a in (10, 20)]
    root = ns("r", None, 0, "agent")
    # Two calls of pay in one turn: parallel calls start in any order.
    both = ns("l", "r", 1, "llm", requested_calls=tuple(pay))
    t = build_trajectory("t1", [root, both, ns("p1", "r", 20, "tool", "pay"), ns("p2", "r", 21, "tool", "pay")])
    assert [(s.args, s.args_status) for s in t.tool_steps] == [(None, "absent"), (None, "absent")]
    assert len(t.problems) == 2 and "may answer more than one request" in t.problems[0]
    # Another agent's request whose turn is not over (no model call under its parent since).
    a = ns("a", "r", 1, "llm", requested_calls=(pay[0],))
    b = ns("b", "r2", 5, "llm", requested_calls=(pay[1],))
    t = build_trajectory("t1", [root, ns("r2", "r", 2, "agent"), a, b, ns("p", "r2", 30, "tool", "pay")])
    (step,) = t.tool_steps
    assert step.args_status == "absent" and "in span(s) a, b" in t.problems[0]
    # The same arguments asked for twice: no doubt what the span was called with.
    same = ns("l", "r", 1, "llm", requested_calls=(pay[0], pay[0]))
    t = build_trajectory("t1", [root, same, ns("p1", "r", 20, "tool", "pay"), ns("p2", "r", 21, "tool", "pay")])
    assert [s.args for s in t.tool_steps] == [{"amount": 10}, {"amount": 10}] and t.problems == []


def test_span_args_are_kept_unless_a_bare_value_and_results_come_from_later_messages():
    call = RequestedCall("lookup", {"invoice_id": "INV-1"}, "captured", "call_1")
    llm = ns("l", "r", 1, "llm", requested_calls=(call,))
    bare = ns("x", "r", 20, "tool", "lookup", tool_call_id="call_1", args="INV-1", args_status="captured")
    later = ns("l2", "r", 40, "llm", tool_results={"call_1": {"status": "open"}})
    step = build_trajectory("t1", [ns("r", None, 0, "agent"), llm, bare, later]).tool_steps[0]
    assert step.args == {"invoice_id": "INV-1"} and step.args_source == "llm_output"
    assert step.result == {"status": "open"} and step.result_status == "captured"

    own = ns(
        "x",
        "r",
        20,
        "tool",
        "lookup",
        tool_call_id="call_1",
        args={"invoice_id": "INV-9"},
        args_status="captured",
        args_source="gen_ai.tool.call.arguments",
    )
    step = build_trajectory("t1", [ns("r", None, 0, "agent"), llm, own]).tool_steps[0]
    assert step.args == {"invoice_id": "INV-9"} and step.args_source == "gen_ai.tool.call.arguments"


def test_a_result_given_back_redacted_in_one_span_and_captured_in_another_is_captured():
    # A framework's model span around the client library's, one hiding the input text.
    def model_call(span_id, start, attributes):
        record = SpanRecord("t1", span_id, "r", "chat", start_ns=start, end_ns=start + 5, attributes=attributes)
        return normalise(record)

    call = RequestedCall("lookup", {"invoice_id": "INV-1"}, "captured", "call_1")
    asking = ns("l", "r", 1, "llm", requested_calls=(call,))
    hidden = model_call("h", 20, {
        "openinference.span.kind": "LLM",
        "llm.input_messages.0.message.role": "tool",
        "llm.input_messages.0.message.tool_call_id": "call_1",
        "llm.input_messages.0.message.content": "__REDACTED__",
    })  # fmt: skip
    given = [{"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": '{"n": 1}'}]}]
    shown = model_call("g", 21, {"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(given)})
    for later in ([hidden, shown], [shown, hidden]):
        (step,) = build_trajectory("t1", [ns("r", None, 0, "agent"), asking, *later]).tool_steps
        assert (step.result_status, step.result) == ("captured", {"n": 1})
    (step,) = build_trajectory("t1", [ns("r", None, 0, "agent"), asking, hidden]).tool_steps
    assert (step.result_status, step.result) == ("redacted", None)


def test_a_model_call_recorded_twice_counts_once():
    outer = ns("o", "r", 1, "llm", name="call_llm")
    inner = ns("i", "o", 2, "llm", name="generate_content", tokens=50)
    t = build_trajectory("t1", [ns("r", None, 0, "agent"), outer, inner])
    assert [(s.name, s.kind, s.tokens) for s in t.steps] == [
        ("r", "agent", None),
        ("call_llm", "llm", 50),
        ("generate_content", "other", None),
    ]


# ---------------------------------------------------------------------------------------------
# One tool call recorded again inside itself (a framework's tool span around the MCP SDK's
# tools/call spans) counts once.


def tool(span_id, parent, start, end, name="pay", kind="tool", convention="mcp", **kw):
    """A span of the MCP instrumentation, unless ``convention`` says otherwise."""
    return NormalisedSpan(
        trace_id="t1", span_id=span_id, parent_span_id=parent, span_name=span_id, start_ns=start, end_ns=end,
        kind=kind, name=name, convention=convention, **kw,
    )  # fmt: skip


def kinds(t):
    return [(s.span_id, s.kind) for s in t.steps]


def test_a_retry_inside_a_tool_call_that_succeeded_last_leaves_it_successful():
    spans = [
        tool("r", None, 0, 100, "agent", "agent"),
        tool("o", "r", 10, 90, args={"amount": 5}, args_status="captured"),
        tool("x", "o", 11, 89, "session", "other"),  # not a tool: walked through
        tool("i1", "x", 12, 30, error="timeout"),
        tool("i2", "x", 40, 80, result={"ok": True}, result_status="captured"),
    ]
    t = build_trajectory("t1", spans)
    assert kinds(t) == [("r", "agent"), ("o", "tool"), ("x", "other"), ("i1", "other"), ("i2", "other")]
    (outer,) = t.tool_steps
    assert outer.error is None and outer.args == {"amount": 5}
    assert outer.result == {"ok": True} and outer.result_status == "captured"  # not captured by the outer


def test_the_framework_span_keeps_its_outcome_and_takes_the_arguments_it_lacks():
    spans = [
        tool("r", None, 0, 100, "agent", "agent"),
        tool("o", "r", 10, 90, args_status="redacted", convention="pydantic_ai"),
        tool("c", "o", 11, 89, args={"amount": 5}, args_status="captured", args_source="span", tool_call_id="c1"),
        tool("s", "c", 12, 88, error="declined"),
    ]
    t = build_trajectory("t1", spans)
    assert kinds(t) == [("r", "agent"), ("o", "tool"), ("c", "other"), ("s", "other")]
    (outer,) = t.tool_steps
    # Its own outcome: the server's records, from another process, may arrive after it.
    assert outer.error is None
    assert (outer.args, outer.args_status, outer.args_source) == ({"amount": 5}, "captured", "span")
    assert outer.tool_call_id == "c1"
    spans[1] = tool("o", "r", 10, 90, error="cancelled", convention="pydantic_ai")
    assert build_trajectory("t1", spans).tool_steps[0].error == "cancelled"
    # Same-name tool spans of other conventions are calls of their own (a tool calling itself).
    spans = [tool("r", None, 0, 100, "agent", "agent"), tool("o", "r", 10, 90, convention="x"),
             tool("i", "o", 11, 89, convention="x")]  # fmt: skip
    assert [s.span_id for s in build_trajectory("t1", spans).tool_steps] == ["o", "i"]


def test_nested_tools_of_other_names_and_tools_under_an_agent_are_kept():
    spans = [
        tool("r", None, 0, 100, "agent", "agent"),
        tool("o", "r", 10, 90, name="run_workflow"),
        tool("p", "o", 11, 89),  # another name: a call of its own
        tool("sub", "p", 12, 88, "sub", "agent"),  # a sub-agent run by pay: the walk stops there
        tool("q", "sub", 13, 87),
    ]
    t = build_trajectory("t1", spans)
    assert [(s.span_id, s.kind) for s in t.steps if s.name == "pay"] == [("p", "other"), ("q", "tool")]
    assert [s.name for s in t.tool_steps] == ["run_workflow", "pay"]  # p ran an agent: not a tool call


def test_tool_calls_nested_in_a_loop_of_parent_links_end_with_one_kept():
    spans = [tool("a", "c", 0, 10), tool("b", "a", 1, 9), tool("x", "b", 2, 8, "x", "other"), tool("c", "x", 3, 7)]
    t = build_trajectory("t1", spans)
    assert not t.complete and len(t.tool_steps) == 1
    # A long chain of records of one call: one call, whatever the depth.
    chain = [tool("r", None, 0, 10_000, "agent", "agent")]
    chain += [tool(f"s{n}", f"s{n - 1}" if n else "r", n + 1, 10_000 - n - 1) for n in range(1000)]
    t = build_trajectory("t1", chain)
    assert [s.span_id for s in t.tool_steps] == ["s0"]


# The captured MCP SDK server spans (tests/fixtures/conventions/mcp_sdk.jsonl: mcp 2.1.1, its
# OpenTelemetryMiddleware, tools/call <tool>) each placed under the captured Pydantic AI tool span
# of the same call (pydantic_ai_v2.jsonl: pydantic-ai-slim 2.68.0 "running tool"), directly or
# through another captured MCP span (server/discover), as a Pydantic AI agent calling its tools
# on an MCP server records them. No framework here calls an MCP server offline to capture it.


def _pydantic_ai_calling_mcp(via_other_span):
    from test_fixtures_conventions import load

    expected, agent_spans = load("pydantic_ai_v2")
    _, mcp_spans = load("mcp_sdk")
    framework_tools = [s for s in agent_spans if s.name == "running tool"]
    mcp_calls = [s for s in mcp_spans if s.name.startswith("tools/call ")]
    (discover,) = [s for s in mcp_spans if s.name == "server/discover"]
    grafted = list(agent_spans)
    for n, (outer, inner) in enumerate(zip(framework_tools, mcp_calls, strict=True)):
        assert outer.attributes["gen_ai.tool.name"] == inner.attributes["gen_ai.tool.name"]
        assert (outer.status_code == 2) == (inner.status_code == 2)  # the refused payment fails in both
        parent = outer.span_id
        if via_other_span:
            parent = f"{n:016x}"
            grafted.append(
                SpanRecord(
                    outer.trace_id,
                    parent,
                    outer.span_id,
                    discover.name,
                    kind=discover.kind,
                    start_ns=outer.start_ns + 1,
                    end_ns=outer.end_ns - 1,
                    attributes=dict(discover.attributes),
                    resource=discover.resource,
                    scope_name=discover.scope_name,
                )
            )
        grafted.append(
            SpanRecord(
                outer.trace_id,
                inner.span_id,
                parent,
                inner.name,
                kind=inner.kind,
                start_ns=outer.start_ns + 2,
                end_ns=outer.end_ns - 2,
                status_code=inner.status_code,
                status_message=inner.status_message,
                attributes=dict(inner.attributes),
                resource=inner.resource,
                scope_name=inner.scope_name,
            )
        )
    t = build_trajectory(agent_spans[0].trace_id, [normalise(r) for r in grafted])
    return expected, t


def _policy_verdicts(t, *bodies):
    import tempfile
    from pathlib import Path

    from otel_plumb.check import load_policy

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.yaml"
        path.write_text("policy: t\ninvariants:\n" + "".join(f"  - {b}\n" for b in bodies))
        return {v.invariant: v.verdict for v in load_policy(path).evaluate(t)}


def test_a_framework_tool_span_around_the_mcp_sdk_span_of_the_same_call_counts_once():
    for via_other_span in (False, True):
        expected, t = _pydantic_ai_calling_mcp(via_other_span)
        assert t.complete
        # Three calls: lookup_invoice, send_payment refused, send_payment paid; as the framework saw them.
        got = [{"name": s.name, "args": s.args, "error": s.error is not None, "source": s.source} for s in t.tool_steps]
        assert got == expected["tool_steps"]
        assert sum(s.name == "send_payment" and s.error is None for s in t.tool_steps) == 1
        verdicts = _policy_verdicts(
            t,
            "{id: pay-once, call_count: {tool: send_payment, max: 1}}",
            "{id: lookup-once, call_count: {tool: lookup_invoice, max: 1}}",
            "{id: calls, budget: {max_tool_calls: 3}}",
            "{id: errors, budget: {max_tool_errors: 1}}",
        )
        assert verdicts == {"pay-once": "pass", "lookup-once": "pass", "calls": "pass", "errors": "pass"}


# ---------------------------------------------------------------------------------------------
# A span whose parent is not in the trace: part of the trace is missing.


def record(span_id, parent=None, start=0, trace="t1", name=None):
    return SpanRecord(trace, span_id, parent, name or span_id, start_ns=start, end_ns=start + 100)


# request > plan > (search, answer), request > reply
TREE = [
    record("request"),
    record("plan", "request", 10),
    record("search", "plan", 20),
    record("answer", "plan", 30),
    record("reply", "request", 40),
]


def assembled(records, **kw):
    return build_trajectory("t1", [normalise(r) for r in records], **kw)


def test_the_whole_tree_is_complete():
    t = assembled(TREE)
    assert t.complete and t.incomplete_reason is None and t.root_span_id == "request"
    assert not any("not in the trace" in p for p in t.problems)


def test_a_dropped_middle_span_makes_the_trajectory_incomplete():
    t = assembled([r for r in TREE if r.span_id != "plan"])
    assert not t.complete and t.incomplete_reason == "missing_parent"
    assert t.root_span_id == "request"
    (line,) = [p for p in t.problems if "not in the trace" in p]
    assert "parent span plan" in line and "search" in line and "answer" in line


def test_a_single_top_span_with_a_remote_parent_stays_complete():
    remote = [record("request", "caller-span"), *TREE[1:]]
    t = assembled(remote)
    assert t.complete and t.root_span_id == "request"


def test_missing_parents_are_found_per_trace_of_a_session():
    second = [record("r2", None, 500, "t2"), record("x2", "gone", 510, "t2")]
    spans = [normalise(r) for r in [*TREE, *second]]
    t = build_trajectory("sess", spans, session_id="sess")
    assert t.trace_ids == ["t1", "t2"]
    assert not t.complete and t.incomplete_reason == "missing_parent"
    (line,) = [p for p in t.problems if "not in the trace" in p]
    assert "parent span gone of span x2" in line
    # Each trace with its own root and nothing orphaned: complete.
    whole = build_trajectory("sess", [normalise(r) for r in [*TREE, second[0]]], session_id="sess")
    assert whole.complete


def test_a_reason_given_by_the_caller_is_kept():
    t = assembled([r for r in TREE if r.span_id != "plan"], complete=False, incomplete_reason="evicted")
    assert not t.complete and t.incomplete_reason == "evicted"
    assert any("parent span plan" in p for p in t.problems)


def test_a_trace_whose_spans_only_point_at_each_other_has_no_root():
    loop = [record("a", "b", 0, "t2"), record("b", "a", 10, "t2")]
    t = build_trajectory("s", [normalise(r) for r in [*TREE, *loop]], session_id="s")
    assert not t.complete and t.incomplete_reason == "no_root"
    # A parent in another trace of the session is not in the span's own trace.
    across = [record("x", "search", 500, "t2")]
    t2 = build_trajectory("s", [normalise(r) for r in [*TREE, *across]], session_id="s")
    assert t2.complete and t2.steps[-1].span_id == "x"  # t2's single top span, parent remote


@st.composite
def trees(draw):
    """A random span tree (parent drawn among earlier spans), and a non-root span with children."""
    n = draw(st.integers(min_value=3, max_value=25))
    parents = [None] + [draw(st.integers(min_value=0, max_value=i - 1)) for i in range(1, n)]
    with_children = sorted({p for p in parents[1:] if p is not None and p != 0})
    if not with_children:
        parents[2] = 1  # make sure some non-root span has a child
        with_children = [1]
    remote_root = draw(st.booleans())
    records = [
        record(f"s{i}", (f"s{p}" if p is not None else ("remote" if remote_root else None)), start=i * 10)
        for i, p in enumerate(parents)
    ]
    return records, f"s{draw(st.sampled_from(with_children))}"


@settings(max_examples=200, deadline=None)
@given(trees())
def test_removing_a_span_that_orphans_a_child_is_never_complete(case):
    records, dropped = case
    assert assembled(records).complete
    t = assembled([r for r in records if r.span_id != dropped])
    assert not t.complete
    if records[0].parent_span_id is None:
        assert t.incomplete_reason == "missing_parent"
        assert any(f"parent span {dropped} " in p for p in t.problems)
    else:
        # The root's parent is remote too: which top span is the root cannot be told.
        assert t.incomplete_reason == "no_root"


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_arbitrary_parent_links_never_crash(data):
    n = data.draw(st.integers(min_value=0, max_value=20))
    ids = [f"s{i}" for i in range(n)]
    pool = [None, "elsewhere", "remote", *ids]
    records = [
        record(
            ids[i],
            data.draw(st.sampled_from(pool)),
            start=data.draw(st.integers(min_value=0, max_value=50)),
            trace=data.draw(st.sampled_from(["t1", "t2"])),
        )
        for i in range(n)
    ]
    t = assembled(records)
    assert sorted(s.span_id for s in t.steps) == sorted(ids)
    assert [s.index for s in t.steps] == list(range(n))
    if t.complete:
        # Complete: in each trace one root, and no other span whose parent is not in its trace.
        where = {r.span_id: r.trace_id for r in records}
        for trace in {r.trace_id for r in records}:
            tops = [r for r in records if r.trace_id == trace and where.get(r.parent_span_id or "") != trace]
            assert len(tops) == 1


# ---------------------------------------------------------------------------------------------
# A model call that asked for tools none of which were captured (content capture off).


def test_hidden_tool_requests_need_a_tool_span_at_or_after_them():
    root = ns("r", None, 0, "agent")
    hidden = ns("l", "r", 10, "llm", hidden_tool_calls=True)
    hidden.convention = "otel_genai"
    t = build_trajectory("t1", [root, hidden])
    assert not t.complete and t.incomplete_reason == "tool_calls_not_captured"
    (line,) = t.problems
    assert "l (l)" in line and "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in line
    # A tool span after the request accounts for it (tool spans from the agent framework).
    assert build_trajectory("t1", [root, hidden, ns("x", "r", 30, "tool", "lookup")]).complete
    # A tool span only before it does not.
    before = build_trajectory("t1", [root, ns("x", "r", 5, "tool", "lookup"), hidden])
    assert not before.complete and before.incomplete_reason == "tool_calls_not_captured"
    # Nor does a tool span in another trace of the session.
    other = ns("x", "r2", 30, "tool", "lookup", trace="t2")
    session = build_trajectory("s", [root, hidden, ns("r2", None, 20, trace="t2"), other], session_id="s")
    assert not session.complete and session.incomplete_reason == "tool_calls_not_captured"


def test_a_hidden_request_is_covered_only_by_a_tool_span_in_its_turn():
    root = ns("r", None, 0, "agent")
    first = ns("a", "r", 10, "llm", hidden_tool_calls=True)
    second = ns("b", "r", 30, "llm", hidden_tool_calls=True)
    # The one tool span runs after the agent asked again: it is b's; a's calls, any tools, are lost.
    t = build_trajectory("t1", [root, first, second, ns("x", "r", 50, "tool", "lookup"), ns("c", "r", 70, "llm")])
    assert not t.complete and t.incomplete_reason == "tool_calls_not_captured"
    assert "a (a)" in t.problems[0] and "b (b)" not in t.problems[0]
    # One in each turn covers both.
    each = [root, first, ns("x1", "r", 22, "tool", "lookup"), second, ns("x2", "r", 50, "tool", "lookup")]
    assert build_trajectory("t1", each).complete
    # A tool span that starts before the request ended is not its answer.
    assert not build_trajectory("t1", [root, first, ns("x", "r", 15, "tool", "lookup")]).complete
    # A model call under another parent (a sub-agent's) does not end the turn; the outer record
    # of a model call recorded twice is the inner one's turn.
    sub = [root, first, ns("s", "r", 21, "agent"), ns("sl", "s", 22, "llm"), ns("x", "s", 35, "tool", "lookup")]
    assert build_trajectory("t1", sub).complete
    outer, inner = ns("o", "r", 10, "llm"), ns("i", "o", 11, "llm", hidden_tool_calls=True)
    inner.end_ns = outer.end_ns = 20
    twice = [root, outer, inner, ns("x", "r", 25, "tool", "lookup"), ns("o2", "r", 40, "llm")]
    assert build_trajectory("t1", twice).complete
    assert not build_trajectory("t1", [*twice[:3], twice[4], ns("x", "r", 55, "tool", "lookup")]).complete


def test_a_hidden_request_named_by_the_other_record_of_the_same_call_is_covered():
    call = RequestedCall("lookup", {"q": 1}, "captured", "call_1")
    outer = ns("o", "r", 1, "llm", name="langchain", requested_calls=(call,))
    inner = ns("i", "o", 2, "llm", name="openai", hidden_tool_calls=True)
    t = build_trajectory("t1", [ns("r", None, 0, "agent"), outer, inner])
    assert t.complete and [s.name for s in t.tool_steps] == ["lookup"]


def test_hidden_requests_keep_the_callers_reason_and_a_missing_parent_comes_first():
    root = ns("r", None, 0, "agent")
    hidden = ns("l", "r", 10, "llm", hidden_tool_calls=True)
    evicted = build_trajectory("t1", [root, hidden], complete=False, incomplete_reason="evicted")
    assert evicted.incomplete_reason == "evicted" and any("not captured" in p for p in evicted.problems)
    orphan = ns("x", "gone", 20)
    both = build_trajectory("t1", [root, hidden, orphan])
    assert both.incomplete_reason == "missing_parent" and len(both.problems) == 2


# ---- limits: bytes, evictions, fairness between services, tombstones ------------------------


def svc(span_id, service, trace, parent="p", kind="tool", name=None, start=0, **kw):
    return ns(span_id, parent, start, kind, name, trace=trace, attributes={"service.name": service}, **kw)


def test_bytes_are_counted_while_buffered_and_released_when_let_go():
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=10.0, max_traces=2))
    asm.add(ns("a", trace="t1"), None, 0.0, size=100)
    asm.add(ns("b", "a", trace="t1"), None, 0.0, size=50)
    asm.add(ns("c", "gone", trace="t2"), None, 0.0, size=7)
    asm.add(ns("c2", "gone2", trace="t2"), None, 0.0)  # two top spans: no root, waits
    assert asm.bytes_buffered == 157
    assert asm.add(ns("b", "a", trace="t1"), None, 0.0, 0, size=50)[0] is AddOutcome.DUPLICATE
    assert asm.bytes_buffered == 157  # a resend holds nothing
    done = asm.due(1.5)
    assert [f.key for f in done] == ["t1"] and done[0].size == 150 and asm.bytes_buffered == 7
    asm.add(ns("d", "gone", trace="t3"), None, 2.0, size=3)
    _, evicted = asm.add(ns("e", "gone", trace="t4"), None, 2.0, size=1)
    assert [f.key for f in evicted] == ["t2"] and asm.bytes_buffered == 4
    asm.drain(3.0)
    assert asm.bytes_buffered == 0 and asm.spans_buffered == 0


def test_a_session_holds_its_bytes_until_it_is_let_go():
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, group_by="session", session_idle_timeout_s=5.0))
    asm.add(ns("a", trace="t1", session_id="s"), None, 0.0, size=10)
    assert asm.due(2.0) == [] and asm.bytes_buffered == 10  # the trace is done, its session is not
    (session,) = asm.due(8.0)
    assert session.size == 10 and asm.bytes_buffered == 0


def test_evictions_are_counted_by_reason():
    intake_asm = Assembler(AssemblyLimits(idle_timeout_s=100.0, max_wait_s=5.0, max_traces=3))
    for n in range(10):
        intake_asm.add(ns(f"s{n}", "gone", trace=f"t{n}"), None, float(n) / 10)
    assert intake_asm.evictions == {"max_traces": 7}
    intake_asm.due(7.0)
    assert intake_asm.evictions == {"max_traces": 7, "max_wait": 3}


def test_intake_reports_new_evictions_once():
    from otel_plumb.intake import Intake

    intake = Intake(AssemblyLimits(max_traces=2))
    for n in range(5):
        intake.add(SpanRecord(f"{n:032x}", f"{n:016x}", "ffffffffffffffff", "x"), None, 0.0, size=1)
    assert intake.new_evictions() == {"max_traces": 3}
    assert intake.new_evictions() == {}
    assert intake.bytes_buffered == 2


def test_a_flood_from_one_service_evicts_its_own_traces_first():
    asm = Assembler(AssemblyLimits(max_traces=10))
    asm.add(svc("a1", "A", "ta"), None, 0.0)
    evicted = []
    for n in range(1000):
        evicted += asm.add(svc(f"b{n}", "B", f"tb{n}"), None, 1.0)[1]
    assert asm.in_flight("ta")
    assert len(evicted) == 991 and all(f.key.startswith("tb") for f in evicted)
    # Oldest first within the flooding service.
    assert [f.key for f in evicted[:3]] == ["tb0", "tb1", "tb2"]
    # Once B holds no more than A, the oldest goes, A's included.
    asm2 = Assembler(AssemblyLimits(max_traces=2))
    asm2.add(svc("a1", "A", "ta"), None, 0.0)
    asm2.add(svc("b1", "B", "tb1"), None, 0.0)
    assert [f.key for f in asm2.add(svc("b2", "B", "tb2"), None, 0.0)[1]] == ["ta"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=80), st.integers(1, 6))
def test_eviction_always_takes_from_a_service_holding_the_most(ops, max_traces):
    asm = Assembler(AssemblyLimits(max_traces=max_traces, idle_timeout_s=0.0))
    held: dict[str, list[str]] = {}  # service -> its traces in flight, oldest first
    for n, (service_n, finish) in enumerate(ops):
        service = f"s{service_n}"
        if finish and any(held.values()):
            # A trace decided normally (its root arrived and it went idle) leaves its service.
            tid = next(t for ts in held.values() for t in ts)
            asm.add(svc(f"root{n}", "x", tid, parent=None), None, float(n))
            for f in asm.due(float(n) + 1):
                for ts in held.values():
                    if f.key in ts:
                        ts.remove(f.key)
            continue
        most = max((len(ts) for ts in held.values()), default=0)
        tid = f"t{n}"
        _, evicted = asm.add(svc(f"x{n}", service, tid), None, float(n))
        for f in evicted:
            owner = next(s for s, ts in held.items() if f.key in ts)
            assert len(held[owner]) == most and held[owner][0] == f.key
            held[owner].remove(f.key)
            most = max(len(ts) for ts in held.values())
        held.setdefault(service, []).append(tid)
        assert asm.traces_in_flight == sum(len(ts) for ts in held.values()) <= max_traces


def test_an_evicted_trace_keeps_a_tombstone_its_late_spans_join():
    asm = Assembler(AssemblyLimits(max_traces=1, decided_max_spans=10_000))
    asm.add(svc("v1", "A", "tv", name="lookup", start=1), "payload", 0.0, size=1000)
    asm.add(svc("v2", "A", "tv", kind="llm", name="chat", start=2), "payload", 0.0)
    _, evicted = asm.add(svc("j1", "A", "tj"), None, 1.0)
    assert [f.key for f in evicted] == ["tv"]
    tomb = asm.tombstone("tv")
    assert tomb is not None and tomb.reason == "max_traces"
    assert [c.name for c in tomb.calls] == ["lookup"]  # calls only: no model call, no payload
    assert tomb.calls[0].attributes == {"service.name": "A"}
    late = svc("v3", "A", "tv", name="pay", start=3, error="declined")
    assert asm.add(late, None, 2.0, 7)[0] is AddOutcome.LATE
    assert [(c.name, c.error) for c in tomb.calls] == [("lookup", None), ("pay", "declined")]
    assert asm.add(late, None, 2.0, 7)[0] is AddOutcome.DUPLICATE  # a resend is not a second call
    t = tomb.trajectory("tv")
    assert not t.complete and t.service == "A" and [s.name for s in t.tool_steps] == ["lookup", "pay"]
    assert asm.tombstone("tj") is None  # in flight, not evicted


def test_a_trace_decided_normally_has_no_tombstone_and_tombstones_are_bounded():
    from otel_plumb.assemble.buffers import TOMBSTONE_MAX_CALLS

    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_traces=1, decided_max_traces=3))
    asm.add(ns("r", None, trace="t0"), None, 0.0)
    asm.due(2.0)
    assert asm.is_decided("t0") and asm.tombstone("t0") is None
    for n in range(TOMBSTONE_MAX_CALLS + 5):
        asm.add(svc(f"c{n}", "A", "big", start=n), None, 3.0)
    asm.add(svc("x", "A", "other"), None, 3.0)
    tomb = asm.tombstone("big")
    assert tomb is not None and len(tomb.calls) == TOMBSTONE_MAX_CALLS and tomb.truncated
    # Calls not kept: a failure needing an earlier call is no longer certain on it.
    assert tomb.trajectory("big").incomplete_reason == "missing_parent"
    for n in range(5):
        asm.add(svc(f"y{n}", "A", f"more{n}"), None, 4.0)
    assert asm.tombstone("big") is None  # forgotten with the decided traces' memory
    remembered, spans = asm.decided_remembered
    assert remembered == 3 and spans == 6  # per evicted trace: its span id and the call its tombstone keeps


def test_buffered_spans_of_a_trace_share_one_string_per_parent_id():
    asm = Assembler(AssemblyLimits(idle_timeout_s=1.0, max_wait_s=100))
    # Each span arrives with its own copy of the parent's id, as a decoder makes them.
    for i in range(3):
        asm.add(ns(f"s{i}", "".join(["ro", "ot"])), None, now=0.0)
    asm.add(ns("root"), None, now=0.0)
    children = [s for s in asm.buffered_spans("t1") if s.parent_span_id is not None]
    assert [s.parent_span_id for s in children] == ["root"] * 3
    assert len({id(s.parent_span_id) for s in children}) == 1
    (finished,) = asm.due(5.0)
    assert [s.span_id for s in finished.trajectory().steps] == ["root", "s0", "s1", "s2"]


@given(st.lists(st.integers(0, 6), max_size=60), st.booleans())
def test_spans_are_put_in_start_order_as_a_stable_sort_would(starts, reverse_most):
    """The insertion sort of a trace's spans (they come nearly in order) gives what the list
    sort gives, equal starts in arrival order, and says whether any two starts are equal; spans
    far from order (past its budget of moves) go to the list sort."""
    if reverse_most:
        starts = sorted(starts, reverse=True)
    spans = [ns(f"s{i}", start=start) for i, start in enumerate(starts)]
    expected = sorted(spans, key=lambda s: s.start_ns)
    assert trajectory_module._sort_by_start(spans) == (len(set(starts)) < len(starts))
    assert [s.span_id for s in spans] == [s.span_id for s in expected]


@given(st.lists(st.tuples(st.integers(0, 12), st.one_of(st.none(), st.integers(0, 14))), max_size=40),
       st.integers(1, 50))  # fmt: skip
def test_whether_a_trace_is_one_tree_is_kept_as_spans_arrive(spans, max_spans):
    """``single_tree``, counted as spans arrive (in any order, resent, over the span limit, a
    span its own parent), says what walking the trace's spans says, after every span."""
    assembler = Assembler(AssemblyLimits(max_spans_per_trace=max_spans))
    for span_id, parent in spans:
        parent_id = None if parent is None else f"s{parent}"
        assembler.add(ns(f"s{span_id}", parent_id), None, 0.0)
        buf = assembler._traces["t1"]
        ids = {s.span_id for s in buf.spans}
        walked = sum(1 for s in buf.spans if s.parent_span_id not in ids) == 1
        assert buf.single_tree() == walked


# ---------------------------------------------------------------------------------------------
# One call recorded by two instrumentations at once (each in a subtree of its own) counts once.


def test_a_call_two_instrumentations_record_counts_once_and_keeps_the_fuller_record():
    spans = [
        tool("r", None, 0, 100, "agent", "agent", convention="x"),
        tool("oi", "r", 10, 50, args="ORD-1", args_status="captured", convention="openinference"),
        tool("ol", "r", 12, 52, args={"order_id": "ORD-1"}, args_status="captured", convention="traceloop",
             tool_call_id="c1", result={"ok": 1}, result_status="captured"),
        tool("m1", "r", 60, 70, "gpt", "llm", convention="openinference"),
        tool("m2", "r", 61, 71, "gpt", "llm", convention="otel_genai", tokens=12),
    ]
    t = build_trajectory("t1", spans)
    (call,) = t.tool_steps
    assert call.span_id == "oi" and call.args == {"order_id": "ORD-1"} and call.result == {"ok": 1}
    assert call.tool_call_id == "c1"
    assert [(s.span_id, s.tokens) for s in t.steps if s.kind == "llm"] == [("m1", 12)]
    assert not t.problems


def test_records_that_may_be_two_calls_are_never_merged():
    r = tool("r", None, 0, 100, "agent", "agent", convention="x")

    def tool_steps(*spans):
        return [s.span_id for s in build_trajectory("t1", [r, *spans]).tool_steps]

    # One convention: two calls (parallel), however close.
    assert tool_steps(tool("a", "r", 10, 50, convention="oi"), tool("b", "r", 10, 50, convention="oi")) == ["a", "b"]
    # Apart in time, other names, other services: other calls.
    assert tool_steps(tool("a", "r", 10, 20, convention="oi"), tool("b", "r", 30, 40, convention="ol")) == ["a", "b"]
    assert len(tool_steps(tool("a", "r", 10, 50, convention="oi"),
                          tool("b", "r", 11, 51, "refund", convention="ol"))) == 2  # fmt: skip
    other_service = tool("b", "r", 11, 51, convention="ol", attributes={"service.name": "billing"})
    assert tool_steps(tool("a", "r", 10, 50, convention="oi", attributes={"service.name": "agent"}),
                      other_service) == ["a", "b"]  # fmt: skip
    # Two parallel calls recorded by each: paired by tool-call id, else the closest in time.
    both = [tool("a", "r", 10, 50, convention="oi", tool_call_id="c1"),
            tool("b", "r", 11, 51, convention="oi", tool_call_id="c2"),
            tool("c", "r", 12, 52, convention="ol", tool_call_id="c1"),
            tool("d", "r", 13, 53, convention="ol", tool_call_id="c2")]  # fmt: skip
    assert tool_steps(*both) == ["a", "b"]
    unnamed = [tool("a", "r", 10, 50, convention="oi"), tool("b", "r", 20, 60, convention="oi"),
               tool("c", "r", 11, 51, convention="ol"), tool("d", "r", 21, 61, convention="ol")]  # fmt: skip
    assert tool_steps(*unnamed) == ["a", "b"]
    # Tool-call ids that differ: two calls. Counts that differ: the closest records pair up.
    ids = [tool("a", "r", 10, 50, convention="oi", tool_call_id="c1"),
           tool("b", "r", 11, 51, convention="ol", tool_call_id="c2")]  # fmt: skip
    assert tool_steps(*ids) == ["a", "b"]
    assert tool_steps(tool("a", "r", 10, 90, convention="oi"), tool("b", "r", 40, 50, convention="oi"),
                      tool("c", "r", 41, 51, convention="ol")) == ["a", "b"]  # fmt: skip
