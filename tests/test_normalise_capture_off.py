"""With content capture off, neither arguments nor results are data: both must read as absent,
so argument and dataflow checks are indeterminate rather than comparing against null; and a
model call that asked for tools the trace does not show makes the trajectory incomplete."""

from pathlib import Path

import pytest

from otel_plumb.assemble import build_trajectory
from otel_plumb.check import load_policy
from otel_plumb.model import SpanRecord, Trajectory, trajectory_status
from otel_plumb.normalise import CAPTURE_HINTS, normalise
from otel_plumb.receive.files import read_spans
from otel_plumb.replay import replay

FIXTURE = Path(__file__).parent / "fixtures" / "ap" / "no_argument_capture.jsonl"


def test_tool_steps_without_captured_content_have_no_args_and_no_results():
    (trajectory,) = replay([str(FIXTURE)]).trajectories
    tools = trajectory.tool_steps
    assert [s.name for s in tools][:2] == ["fetch_invoice", "match_purchase_order"]
    assert {s.args_status for s in tools} == {"absent"}
    assert {s.result_status for s in tools} == {"absent"}
    assert all(s.result is None for s in tools)


# ---------------------------------------------------------------------------------------------
# Model calls that asked for tools, with content capture off and no tool spans: the trace cannot
# say which tools ran, so the trajectory is incomplete and every tool-dependent check is
# indeterminate, never a fail (nor a pass).

CONVENTIONS = Path(__file__).parent / "fixtures" / "conventions"

# Captured from the real libraries with content capture off (tests/fixtures/capture.py): the model
# asks for lookup_invoice and send_payment, then answers; the LLM spans keep only the finish reason.
HIDDEN = {
    "openinference_openai_hidden": ("openinference", "llm.finish_reason"),
    "openai_v2_no_content": ("otel_genai", "gen_ai.response.finish_reasons"),
    "openllmetry_openai_no_content": ("otel_genai", "gen_ai.response.finish_reasons"),
}
# The same agent with content capture on (or only the flattened messages hidden).
VISIBLE = [
    "openinference_openai",
    "openinference_openai_parallel",
    "openinference_openai_hidden_messages",
    "openai_v2",
    "openllmetry_openai",
]

POLICY = """\
policy: pay-controls
invariants:
  - {id: must-pay, must_call: send_payment}
  - {id: never-delete, never_call: delete_invoice}
  - {id: pay-once, call_count: {tool: send_payment, min: 1, max: 1}}
  - {id: pay-amount, arg_equals: {tool: send_payment, arg: amount, value: 120.5}}
  - {id: look-before-pay, precedes: {first: lookup_invoice, then: send_payment}}
"""


def spans_of(name: str) -> list[SpanRecord]:
    return [s for s in read_spans(CONVENTIONS / f"{name}.jsonl") if isinstance(s, SpanRecord)]


def trajectory_of(name: str) -> Trajectory:
    spans = spans_of(name)
    (trace_id,) = {s.trace_id for s in spans}
    return build_trajectory(trace_id, [normalise(s) for s in spans])


@pytest.fixture
def policy(tmp_path):
    path = tmp_path / "pay.yaml"
    path.write_text(POLICY)
    return load_policy(path)


@pytest.mark.parametrize("name", sorted(HIDDEN))
def test_model_calls_that_ask_for_hidden_tools_are_marked(name):
    convention, finish_key = HIDDEN[name]
    records = {s.span_id: s for s in spans_of(name)}
    normalised = [normalise(s) for s in records.values()]
    llm = [n for n in normalised if n.kind == "llm"]
    assert llm and all(n.convention == convention and n.requested_calls == () for n in llm)
    # Exactly the calls whose finish reason asked for tools; the final answer did not.
    asked = [n.span_id for n in llm if "tool" in str(records[n.span_id].attributes[finish_key])]
    assert asked and len(asked) < len(llm)
    assert [n.span_id for n in llm if n.hidden_tool_calls] == asked


@pytest.mark.parametrize("name", sorted(HIDDEN))
def test_llm_only_trace_with_content_off_is_incomplete(name):
    convention, _ = HIDDEN[name]
    t = trajectory_of(name)
    assert not t.complete and t.incomplete_reason == "tool_calls_not_captured"
    assert t.tool_steps == [] and t.root_span_id is not None
    hidden = [s for s in t.steps if s.kind == "llm"][:-1]  # every model call but the final answer
    (line,) = [p for p in t.problems if "tool calls requested but not captured" in p]
    assert all(s.span_id in line for s in hidden)
    assert CAPTURE_HINTS[convention] in line


@pytest.mark.parametrize("name", sorted(HIDDEN))
def test_every_tool_check_is_indeterminate_when_tool_calls_are_hidden(name, policy):
    t = trajectory_of(name)
    verdicts = policy.evaluate(t)
    assert {v.invariant: v.verdict for v in verdicts} == {
        "must-pay": "indeterminate",
        "never-delete": "indeterminate",
        "pay-once": "indeterminate",
        "pay-amount": "indeterminate",
        "look-before-pay": "indeterminate",
    }
    assert trajectory_status(t, verdicts) == "indeterminate"


@pytest.mark.parametrize("name", VISIBLE)
def test_with_content_on_the_requested_calls_are_steps_and_checks_decide_what_requests_show(name, policy):
    """The requests are steps; how each call went is not recorded (no tool span): what turns on
    it is indeterminate, naming the call, and what holds however it went is decided."""
    t = trajectory_of(name)
    assert t.complete and t.incomplete_reason is None
    assert [(s.name, s.source) for s in t.tool_steps] == [
        ("lookup_invoice", "llm_output"),
        ("send_payment", "llm_output"),
    ]
    assert not any("not captured" in p for p in t.problems)
    verdicts = {v.invariant: v for v in policy.evaluate(t)}
    assert {k: v.verdict for k, v in verdicts.items()} == {
        "must-pay": "indeterminate",
        "never-delete": "pass",
        "pay-once": "indeterminate",
        "pay-amount": "indeterminate",
        "look-before-pay": "indeterminate",
    }
    assert "send_payment at step" in verdicts["must-pay"].message
    assert "asked for by the model" in verdicts["pay-amount"].message
    assert trajectory_status(t, list(verdicts.values())) == "indeterminate"


def test_parallel_calls_in_one_response_get_their_results_by_call_id():
    for name in ("openinference_openai_parallel", "openinference_openai_hidden_messages"):
        lookup, payment = trajectory_of(name).tool_steps
        assert (lookup.tool_call_id, payment.tool_call_id) == ("call_0", "call_1")
        assert lookup.result["status"] == "open" and payment.result["status"] == "paid"


def test_tool_spans_after_hidden_requests_keep_the_trajectory_complete(policy):
    # The Vercel AI SDK with recordInputs / recordOutputs off: the model spans say "tool-calls"
    # without naming them, but the ai.toolCall spans show which tools ran (without arguments).
    records = spans_of("vercel_ai_sdk_no_content")
    asked = [normalise(s) for s in records if s.attributes.get("ai.response.finishReason") == "tool-calls"]
    assert len(asked) == 3 and all(n.hidden_tool_calls for n in asked)
    t = trajectory_of("vercel_ai_sdk_no_content")
    assert t.complete and t.problems == []
    assert [(s.name, s.source, s.args_status) for s in t.tool_steps] == [
        ("lookup_invoice", "span", "absent"),
        ("send_payment", "span", "absent"),
        ("send_payment", "span", "absent"),
    ]
    verdicts = {v.invariant: v.verdict for v in policy.evaluate(t)}
    assert verdicts["must-pay"] == "pass" and verdicts["look-before-pay"] == "pass"
    assert verdicts["pay-amount"] == "indeterminate"  # the arguments were not recorded
