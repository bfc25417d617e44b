from otel_plumb.assemble import AddOutcome, Assembler, AssemblyLimits, build_trajectory
from otel_plumb.model import NormalisedSpan, RequestedCall


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
    llm = ns("l", "r", 1, "llm", requested_calls=[call])
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
    assert asm2.add(ns("c", "a", 2), None, now=2.0)[0] is AddOutcome.LATE


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
        ns("l1", "r", 1, "llm", requested_calls=[first]),
        ns("p1", "r", 20, "tool", "pay"),
        ns("l2", "r", 40, "llm", requested_calls=[second]),
        ns("p2", "r", 60, "tool", "pay"),
    ]
    t = build_trajectory("t1", spans)
    assert [(s.span_id, s.args, s.args_source) for s in t.tool_steps] == [
        ("p1", {"amount": 1}, "llm_output"),
        ("p2", {"amount": 2}, "llm_output"),
    ]
    assert t.problems == []
    # A request with no tool span left to claim is reported, not turned into a step.
    extra = ns("l3", "r", 80, "llm", requested_calls=[RequestedCall("pay", {}, "captured", "c3")])
    t2 = build_trajectory("t1", [*spans, extra])
    assert len(t2.tool_steps) == 2 and t2.problems == ["tool call 'pay' requested in span l3 has no tool span"]


def test_span_args_are_kept_unless_a_bare_value_and_results_come_from_later_messages():
    call = RequestedCall("lookup", {"invoice_id": "INV-1"}, "captured", "call_1")
    llm = ns("l", "r", 1, "llm", requested_calls=[call])
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


def test_a_model_call_recorded_twice_counts_once():
    outer = ns("o", "r", 1, "llm", name="call_llm")
    inner = ns("i", "o", 2, "llm", name="generate_content", tokens=50)
    t = build_trajectory("t1", [ns("r", None, 0, "agent"), outer, inner])
    assert [(s.name, s.kind, s.tokens) for s in t.steps] == [
        ("r", "agent", None),
        ("call_llm", "llm", 50),
        ("generate_content", "other", None),
    ]
