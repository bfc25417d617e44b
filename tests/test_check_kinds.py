"""Every check kind: pass, fail (localised), not_applicable and indeterminate."""

from __future__ import annotations

import pytest
from test_check_support import one, policy, step, trajectory

PAY = {"amount_gbp": 4820.00, "invoice_id": "INV-7001"}


def test_must_call_pass_fail_and_failed_call_did_not_happen(tmp_path):
    inv = "{id: dup, must_call: check_duplicate}"
    assert one(tmp_path, inv, trajectory("fetch_invoice", "check_duplicate")).verdict == "pass"
    v = one(tmp_path, inv, trajectory("fetch_invoice", step("check_duplicate", error="503")))
    assert v.verdict == "fail" and v.step_index is None and v.span_id is None
    assert "failed call did not happen" in v.message and v.got == "1 failed call(s)"
    # incomplete trajectory: the call could still come
    assert one(tmp_path, inv, trajectory("fetch_invoice", complete=False)).verdict == "indeterminate"


def test_must_call_with_tool_list_and_object_form(tmp_path):
    assert one(tmp_path, "{id: a, must_call: [x, check_duplicate]}", trajectory("check_duplicate")).verdict == "pass"
    assert one(tmp_path, "{id: a, must_call: {tool: y}}", trajectory("check_duplicate")).verdict == "fail"


def test_never_call_and_attempts(tmp_path):
    t = trajectory("fetch_invoice", step("schedule_payment", error="declined"), "post_audit_log")
    assert one(tmp_path, "{id: n, never_call: schedule_payment}", t).verdict == "pass"
    v = one(tmp_path, "{id: n, never_call: schedule_payment, attempts: true}", t)
    assert v.verdict == "fail" and v.step_index == 1 and v.span_id == t.steps[1].span_id
    v = one(tmp_path, "{id: n, never_call: {tool: schedule_payment, attempts: true}}", t)
    assert v.verdict == "fail" and "attempted" in v.message


def test_never_call_guard_uses_context(tmp_path):
    inv = "{id: n, never_call: pay, when: \"ctx.vendor_status == 'sanctioned'\"}"
    sanctioned = trajectory("pay", attributes={"plumb.context.vendor_status": "sanctioned"})
    active = trajectory("pay", attributes={"plumb.context.vendor_status": "active"})
    assert one(tmp_path, inv, sanctioned).verdict == "fail"
    assert one(tmp_path, inv, active).verdict == "not_applicable"
    v = one(tmp_path, inv, trajectory("pay"))  # guard cannot be evaluated: no ground truth
    assert v.verdict == "indeterminate" and "vendor_status" in v.message


def test_call_count_min_max(tmp_path):
    inv = "{id: c, call_count: {tool: pay, min: 1, max: 1}}"
    assert one(tmp_path, inv, trajectory("pay")).verdict == "pass"
    v = one(tmp_path, inv, trajectory("pay", "log", "pay"))
    assert v.verdict == "fail" and v.step_index == 2 and v.expected == "at most 1" and v.got == 2
    v = one(tmp_path, inv, trajectory("log"))
    assert v.verdict == "fail" and v.step_index is None and v.got == 0
    assert one(tmp_path, inv, trajectory("log", complete=False)).verdict == "indeterminate"
    # a failed retry does not count as a second payment
    assert one(tmp_path, inv, trajectory(step("pay", error="503"), "pay")).verdict == "pass"
    # max is certain even on an incomplete trajectory
    assert one(tmp_path, inv, trajectory("pay", "pay", complete=False)).verdict == "fail"


def test_precedes(tmp_path):
    inv = "{id: p, precedes: {first: match, then: pay}}"
    assert one(tmp_path, inv, trajectory("match", "pay")).verdict == "pass"
    v = one(tmp_path, inv, trajectory("fetch", "pay", "match"))
    assert v.verdict == "fail" and v.step_index == 1 and v.got["name"] == "pay"
    v = one(tmp_path, inv, trajectory(step("match", error="503"), "pay"))
    assert v.verdict == "fail"  # the failed match did not happen
    assert one(tmp_path, inv, trajectory("fetch")).verdict == "pass"
    assert one(tmp_path, inv, trajectory("fetch", complete=False)).verdict == "indeterminate"


def test_responds(tmp_path):
    inv = "{id: r, responds: {trigger: flag, then: audit}}"
    assert one(tmp_path, inv, trajectory("flag", "audit")).verdict == "pass"
    assert one(tmp_path, inv, trajectory("fetch")).verdict == "pass"
    v = one(tmp_path, inv, trajectory("audit", "flag"))
    assert v.verdict == "fail" and v.step_index == 1
    v = one(tmp_path, inv, trajectory("flag", step("audit", error="timeout")))
    assert v.verdict == "fail" and v.step_index == 0
    assert one(tmp_path, inv, trajectory("flag", complete=False)).verdict == "indeterminate"


def test_arg_equals_context_typed(tmp_path):
    inv = "{id: a, arg_equals: {tool: pay, arg: amount_gbp, context: expected_amount_gbp}}"
    truth = {"plumb.context.expected_amount_gbp": "4820.00"}
    ok = trajectory(step("pay", args={"amount_gbp": 4820}), attributes=truth)
    assert one(tmp_path, inv, ok).verdict == "pass"
    bad = trajectory("fetch", step("pay", args={"amount_gbp": 48200.00}), attributes=truth)
    v = one(tmp_path, inv, bad)
    assert v.verdict == "fail" and v.step_index == 1 and v.expected == "4820.00" and v.got == 48200
    assert v.span_id == bad.steps[1].span_id
    assert one(tmp_path, inv, trajectory(step("pay", args={"amount_gbp": 1}))).verdict == "indeterminate"
    missing = trajectory(step("pay", args={"amount": 4820}), attributes=truth)
    assert one(tmp_path, inv, missing).verdict == "fail"
    assert one(tmp_path, inv, trajectory("fetch", attributes=truth)).verdict == "not_applicable"


def test_arg_equals_uncaptured_args_are_indeterminate_never_pass(tmp_path):
    inv = "{id: a, arg_equals: {tool: pay, arg: amount_gbp, value: 10}}"
    t = trajectory(step("pay", args_status="redacted"))
    v = one(tmp_path, inv, t)
    assert v.verdict == "indeterminate" and "redacted" in v.message and v.step_index == 0


def test_arg_equals_value_tolerance_text_and_set(tmp_path):
    t = trajectory(step("pay", args={"amount_gbp": 100.004, "invoice_id": "inv-1029 ", "tags": ["b", "A"]}))
    assert one(tmp_path, "{id: a, arg_equals: {tool: pay, arg: amount_gbp, value: 100, tolerance: 0.01}}", t).verdict \
        == "pass"  # fmt: skip
    assert one(tmp_path, "{id: a, arg_equals: {tool: pay, arg: amount_gbp, value: 100}}", t).verdict == "fail"
    assert one(tmp_path, "{id: a, arg_equals: {tool: pay, arg: invoice_id, value: INV-1029}}", t).verdict == "pass"
    exact = "{id: a, arg_equals: {tool: pay, arg: invoice_id, value: INV-1029, compare: exact}}"
    assert one(tmp_path, exact, t).verdict == "fail"
    as_set = "{id: a, arg_equals: {tool: pay, arg: tags, value: [a, b], compare: set}}"
    assert one(tmp_path, as_set, t).verdict == "pass"
    assert one(tmp_path, "{id: a, arg_equals: {tool: pay, arg: tags, value: [a, b]}}", t).verdict == "fail"


def test_arg_equals_dataflow_from_earlier_step(tmp_path):
    inv = "{id: a, arg_equals: {tool: pay, arg: amount_gbp, step: {tool: fetch_invoice, result: total}}}"
    fetch = step("fetch_invoice", args={"invoice_id": "INV-1"}, result={"total": "4,820.00"})
    assert one(tmp_path, inv, trajectory(fetch, step("pay", args={"amount_gbp": 4820}))).verdict == "pass"
    v = one(tmp_path, inv, trajectory(fetch, step("pay", args={"amount_gbp": 48200})))
    assert v.verdict == "fail" and v.step_index == 1
    # the source step came after the payment, or its result was not captured: unknown
    assert one(tmp_path, inv, trajectory(step("pay", args={"amount_gbp": 1}), fetch)).verdict == "indeterminate"
    no_result = step("fetch_invoice", args={"invoice_id": "INV-1"})
    assert one(tmp_path, inv, trajectory(no_result, step("pay", args={"amount_gbp": 1}))).verdict == "indeterminate"
    by_arg = "{id: a, arg_equals: {tool: pay, arg: invoice_id, step: {tool: fetch_invoice, arg: invoice_id}}}"
    assert one(tmp_path, by_arg, trajectory(fetch, step("pay", args={"invoice_id": "inv-1"}))).verdict == "pass"


def test_arg_equals_nested_path_and_list_index(tmp_path):
    t = trajectory(step("pay", args={"lines": [{"amount": 5}, {"amount": 7}]}))
    assert one(tmp_path, "{id: a, arg_equals: {tool: pay, arg: 'lines[1].amount', value: 7}}", t).verdict == "pass"
    assert one(tmp_path, "{id: a, arg_equals: {tool: pay, arg: lines.0.amount, value: 5}}", t).verdict == "pass"


def test_arg_matches(tmp_path):
    inv = "{id: m, arg_matches: {tool: send_email, arg: to, regex: '@example\\.com$'}}"
    assert one(tmp_path, inv, trajectory(step("send_email", args={"to": "a@example.com"}))).verdict == "pass"
    v = one(tmp_path, inv, trajectory(step("send_email", args={"to": "a@evil.com"})))
    assert v.verdict == "fail" and v.got == "a@evil.com"
    assert one(tmp_path, inv, trajectory(step("send_email", args_status="absent"))).verdict == "indeterminate"
    assert one(tmp_path, inv, trajectory("other")).verdict == "not_applicable"


@pytest.mark.parametrize(
    ("args", "arg", "why"),
    [
        ({"to": "<REDACTED>", "body": "hi"}, "to", "to is a redaction placeholder"),
        ({"to": "***"}, "to", "to is a redaction placeholder"),
        # otel-plumb's own markers, in spans forwarded with redact_forwarded (or files made from them)
        ({"to": "[redacted:email]"}, "to", "to is redacted ([redacted:email])"),
        ({"to": "[hmac:0123456789abcdef]"}, "to", "to is redacted ([hmac:"),
        ({"to": "bob@ev… [12 characters redacted]"}, "to", "characters redacted"),
        ({"to": "mail [redacted:email] now"}, "to", "to is redacted"),  # a pattern masked inside the text
        ({"to": {"address": "<REDACTED>"}}, "to.address", "to.address is a redaction placeholder"),
        ({"to": "<REDACTED>"}, "to.address", "to is a redaction placeholder"),  # on the way
        ({"to": ["a@example.com", "<hidden>"]}, "to", "to[1] is a redaction placeholder"),
    ],
)
def test_argument_checks_on_a_placeholder_are_indeterminate_never_fail(tmp_path, args, arg, why):
    """A placeholder inside captured arguments is not the value the call sent."""
    t = trajectory(step("send_email", args=args))
    for check in (f"arg_matches: {{tool: send_email, arg: '{arg}', regex: '@example\\.com$'}}",
                  f"arg_equals: {{tool: send_email, arg: '{arg}', value: a@example.com}}"):  # fmt: skip
        v = one(tmp_path, f"{{id: a, {check}}}", t)
        assert v.verdict == "indeterminate", (check, v.message)
        assert f"argument {arg} cannot be read" in v.message and why in v.message and v.step_index == 0


def test_argument_checks_read_the_fields_beside_a_placeholder(tmp_path):
    t = trajectory(step("send_email", args={"to": "a@evil.com", "body": "<REDACTED>"}))
    v = one(tmp_path, "{id: m, arg_matches: {tool: send_email, arg: to, regex: '@example\\.com$'}}", t)
    assert v.verdict == "fail" and v.got == "a@evil.com"
    assert one(tmp_path, "{id: m, arg_equals: {tool: send_email, arg: to, value: a@evil.com}}", t).verdict == "pass"


def test_arg_equals_against_a_placeholder_in_the_source_step_is_indeterminate(tmp_path):
    inv = "{id: a, arg_equals: {tool: pay, arg: amount_gbp, step: {tool: fetch_invoice, result: total}}}"
    fetch = step("fetch_invoice", args={"invoice_id": "INV-1"}, result={"total": "[redacted:amount]"})
    v = one(tmp_path, inv, trajectory(fetch, step("pay", args={"amount_gbp": 4820})))
    assert v.verdict == "indeterminate" and "compared with is redacted" in v.message


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ("bob@evil.com", "the arguments are text, not named arguments"),  # OpenInference input.value
        ('{"to": "bob@evil.com", "bo', "the arguments are JSON text that does not decode"),  # cut off inside
        (42, "the arguments are a number"),
        (["bob@evil.com"], "the arguments are a list"),
    ],
)
def test_argument_checks_on_arguments_that_are_not_named_are_indeterminate(tmp_path, args, why):
    t = trajectory(step("send_email", args=args))
    for check in ("arg_matches: {tool: send_email, arg: to, regex: '@evil\\.com$'}",
                  "arg_equals: {tool: send_email, arg: to, value: bob@evil.com}"):  # fmt: skip
        v = one(tmp_path, f"{{id: a, {check}}}", t)
        assert v.verdict == "indeterminate" and "argument to cannot be read" in v.message and why in v.message


def test_argument_path_through_text(tmp_path):
    inv = "{id: a, arg_equals: {tool: pay, arg: card.last4, value: '1234'}}"
    v = one(tmp_path, inv, trajectory(step("pay", args={"card": '{"last4": "12'})))  # JSON cut off: cannot say
    assert v.verdict == "indeterminate" and "card is JSON text that does not decode" in v.message
    assert one(tmp_path, inv, trajectory(step("pay", args={"card": '{"last4": "1234"}'}))).verdict == "pass"
    # plain text has no fields, and a mapping without the key is what the call sent: both fail
    assert one(tmp_path, inv, trajectory(step("pay", args={"card": "visa"}))).verdict == "fail"
    assert one(tmp_path, inv, trajectory(step("pay", args={"card": {"brand": "visa"}}))).verdict == "fail"


def test_arg_satisfies(tmp_path):
    inv = "{id: s, arg_satisfies: {tool: approve, expr: 'args.limit >= ctx.amount'}}"
    truth = {"plumb.context.amount": 5000}
    assert one(tmp_path, inv, trajectory(step("approve", args={"limit": 10000}), attributes=truth)).verdict == "pass"
    v = one(tmp_path, inv, trajectory(step("approve", args={"limit": 1000}), attributes=truth))
    assert v.verdict == "fail" and v.step_index == 0
    v = one(tmp_path, inv, trajectory(step("approve", args={"other": 1}), attributes=truth))
    assert v.verdict == "indeterminate" and "limit" in v.message  # run-time error, no crash
    assert one(tmp_path, inv, trajectory(step("approve", args_status="absent"))).verdict == "indeterminate"


def test_budget(tmp_path):
    inv = "{id: b, budget: {max_steps: 3, max_tool_errors: 1}}"
    assert one(tmp_path, inv, trajectory("a", "b")).verdict == "pass"
    v = one(tmp_path, inv, trajectory("a", "b", "c", "d"))
    assert v.verdict == "fail" and v.step_index == 3 and v.got == 4
    v = one(tmp_path, inv, trajectory(step("a", error="x"), step("a", error="x")))
    assert v.verdict == "fail" and v.step_index == 1
    dur = "{id: b, budget: {max_duration_ms: 25}}"
    v = one(tmp_path, dur, trajectory("a", "b", "c"))
    assert v.verdict == "fail" and v.step_index == 2
    tok = "{id: b, budget: {max_tokens: 100}}"
    v = one(tmp_path, tok, trajectory(step("m", "llm", tokens=60), step("m", "llm", tokens=60)))
    assert v.verdict == "fail" and v.got == 120 and v.step_index == 1
    assert one(tmp_path, tok, trajectory(step("m", "llm"))).verdict == "indeterminate"


def test_max_tokens_with_a_model_call_without_a_count(tmp_path):
    """The uncounted call may hold the tokens that cross the limit; counted ones over it are a fail."""
    tok = "{id: b, budget: {max_tokens: 150}}"
    v = one(tmp_path, tok, trajectory(step("m", "llm", tokens=100), step("m", "llm")))
    assert v.verdict == "indeterminate" and v.got == 100 and v.step_index == 1
    assert "1 model call(s) recorded no token count" in v.message
    v = one(tmp_path, tok, trajectory(step("m", "llm"), step("m", "llm", tokens=100), step("m", "llm", tokens=60)))
    assert v.verdict == "fail" and v.got == 160 and v.step_index == 2
    both = trajectory(step("m", "llm", tokens=100), step("m", "llm", tokens=40), "a")  # a tool call has no count
    assert one(tmp_path, tok, both).verdict == "pass"


def test_expr(tmp_path):
    inv = "{id: e, expr: \"size(steps.filter(s, s.kind == 'tool')) > 0\"}"
    assert one(tmp_path, inv, trajectory("a")).verdict == "pass"
    v = one(tmp_path, inv, trajectory(step("m", "llm")))
    assert v.verdict == "fail" and v.step_index is None
    v = one(tmp_path, "{id: e, expr: 'ctx.x > 1'}", trajectory("a"))
    assert v.verdict == "indeterminate" and "x" in v.message
    v = one(tmp_path, "{id: e, expr: 'trajectory.step_count'}", trajectory("a"))
    assert v.verdict == "indeterminate" and "true or false" in v.message
    # an expression that is false on an incomplete trajectory may turn true later
    assert one(tmp_path, inv, trajectory(step("m", "llm"), complete=False)).verdict == "indeterminate"


@pytest.mark.parametrize(
    ("scope", "expected", "at"),
    [("{after: match}", "fail", 3), ("{before: match}", "fail", 1), ("{between: [match, audit]}", "fail", 3),
     ("{between: [audit, match]}", "pass", None), ("{before: fetch}", "pass", None),
     ("{after: nothing}", "not_applicable", None)],
)  # fmt: skip
def test_scope(tmp_path, scope, expected, at):
    # pay is called once before match and once between match and audit
    t = trajectory("fetch", "pay", "match", "pay", "audit", "log")
    v = one(tmp_path, f"{{id: s, never_call: pay, scope: {scope}}}", t)
    assert (v.verdict, v.step_index) == (expected, at)


def test_applies_to_policy_and_invariant(tmp_path):
    p = policy(
        tmp_path,
        """
        policy: t
        applies_to: {service: "ap-*"}
        invariants:
          - {id: a, must_call: x, applies_to: {agent: "invoice-*"}}
          - {id: b, must_call: x, applies_to: {agent: "refund-*"}}
        """,
    )
    t = trajectory("x")
    assert p.applies_to(t)
    assert [v.verdict for v in p.evaluate(t)] == ["pass", "not_applicable"]
    assert not p.applies_to(trajectory("x", service="billing"))
    assert not p.applies_to(trajectory("x", service=None))


def test_pass_on_incomplete_trajectory_is_indeterminate(tmp_path):
    v = one(tmp_path, "{id: n, never_call: pay}", trajectory("fetch", complete=False))
    assert v.verdict == "indeterminate" and "max_wait" in v.message


def test_context_file_keyed_by_task_overrides_attributes(tmp_path):
    (tmp_path / "truth.json").write_text('{"INV-1": {"expected": 4820}}')
    extra = "task: {attribute: invoice.id}\ncontext: {file: truth.json}\n"
    inv = "{id: a, arg_equals: {tool: pay, arg: amount, context: expected}}"
    attrs = {"invoice.id": "INV-1", "plumb.context.expected": 1}
    assert one(tmp_path, inv, trajectory(step("pay", args={"amount": "4820.00"}), attributes=attrs), extra).verdict \
        == "pass"  # fmt: skip
    other = {"invoice.id": "INV-2"}
    assert one(tmp_path, inv, trajectory(step("pay", args={"amount": 1}), attributes=other), extra).verdict \
        == "indeterminate"  # fmt: skip


def test_early_failures_only_certain_fails(tmp_path):
    p = policy(
        tmp_path,
        """
        policy: t
        invariants:
          - {id: must, must_call: audit}
          - {id: never, never_call: pay}
          - {id: guarded, never_call: pay, when: "ctx.vendor_status == 'sanctioned'"}
          - {id: order, precedes: {first: match, then: pay}}
          - {id: once, call_count: {tool: pay, max: 1}}
          - {id: budget, budget: {max_steps: 3}}
          - {id: scoped, never_call: pay, scope: {before: audit}}
          - {id: args, arg_equals: {tool: pay, arg: amount, value: 1}}
        """,
    )
    sanctioned = {"plumb.context.vendor_status": "sanctioned"}
    partial = trajectory("fetch", "pay", "pay", "log", attributes=sanctioned)
    early = {v.invariant: v for v in p.early_failures(partial)}
    assert set(early) == {"never", "order", "once", "budget"}
    # in flight, indices are provisional: the offending step is named by its span
    assert early["once"].span_id == partial.steps[2].span_id and early["order"].span_id == partial.steps[1].span_id
    assert all(v.step_index is None for v in early.values())
    assert [v.invariant for v in p.early_failures(trajectory("fetch", "match", "pay"))] == ["never"]
    assert {v.invariant for v in p.evaluate(partial) if v.verdict == "fail"} >= set(early)


def test_argument_check_without_calls_on_incomplete_trajectory_is_indeterminate(tmp_path):
    inv = "{id: a, arg_equals: {tool: pay, arg: amount, value: 1}}"
    assert one(tmp_path, inv, trajectory("fetch")).verdict == "not_applicable"
    assert one(tmp_path, inv, trajectory("fetch", complete=False)).verdict == "indeterminate"
