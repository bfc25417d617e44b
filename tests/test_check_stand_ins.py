"""CEL checks (``arg_satisfies``, ``expr``) and stand-ins in trace values: an expression that may
read a placeholder or redaction marker is indeterminate, not decided on the stand-in's text
(a false fail, or a false pass); one that never names the redacted value decides as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_check_support import one, step, trajectory

import otel_plumb.check.checks as checks_module
from otel_plumb.check import values as values_module

PLACEHOLDER = "<REDACTED>"


def satisfies(expr: str, tool: str = "send_email") -> str:
    return f'{{id: s, arg_satisfies: {{tool: {tool}, expr: "{expr}"}}}}'


def inv_expr(invariant: str) -> str:
    """The expression of an invariant made by ``satisfies``, as a message quotes it."""
    return invariant.split('expr: "', 1)[1].rsplit('"', 1)[0] + " reads"


def expr_invariant(expr: str) -> str:
    return f'{{id: e, expr: "{expr}"}}'


def test_a_redacted_argument_is_no_false_fail(tmp_path: Path) -> None:
    inv = satisfies("args.to.endsWith('@example.com')")
    t = trajectory("a", "b", "c", step("send_email", args={"to": PLACEHOLDER, "body": "hi"}))
    v = one(tmp_path, inv, t)
    assert v.verdict == "indeterminate" and v.step_index == 3
    assert v.message == (
        "send_email at step 3: args.to is a redaction placeholder, which args.to.endsWith('@example.com') reads"
    )
    assert one(tmp_path, inv, trajectory(step("send_email", args={"to": "a@example.com"}))).verdict == "pass"
    assert one(tmp_path, inv, trajectory(step("send_email", args={"to": "a@evil.com"}))).verdict == "fail"


@pytest.mark.parametrize("to", [PLACEHOLDER, "***", "[redacted:email]", "[hmac:0123456789abcdef]",
                                "bo… [12 characters redacted]"])  # fmt: skip
def test_a_redacted_argument_is_no_false_pass(tmp_path: Path, to: str) -> None:
    inv = satisfies("args.to != 'boss@corp.com'")
    v = one(tmp_path, inv, trajectory(step("send_email", args={"to": to})))
    assert v.verdict == "indeterminate" and v.step_index == 0
    assert v.message.startswith("send_email at step 0: args.to is ")
    assert v.message.endswith(", which args.to != 'boss@corp.com' reads")
    assert one(tmp_path, inv, trajectory(step("send_email", args={"to": "boss@corp.com"}))).verdict == "fail"


def test_a_redacted_value_inside_the_argument_read(tmp_path: Path) -> None:
    v = one(tmp_path, satisfies("args.to.addr == 'x@y.z'"),
            trajectory(step("send_email", args={"to": {"addr": "[redacted:email]", "name": "Bob"}})))  # fmt: skip
    assert v.verdict == "indeterminate" and "args.to.addr is redacted ([redacted:email])" in v.message
    v = one(tmp_path, satisfies("'x@y.z' in args.to"), trajectory(step("send_email", args={"to": ["a@b.c", "***"]})))
    assert v.verdict == "indeterminate" and "args.to[1] is a redaction placeholder" in v.message


def test_the_arguments_themselves_a_placeholder(tmp_path: Path) -> None:
    v = one(tmp_path, satisfies("args.to == 'x@y.z'"), trajectory(step("send_email", args=PLACEHOLDER)))
    assert v.verdict == "indeterminate"
    assert v.message == "send_email at step 0: args is a redaction placeholder, which args.to == 'x@y.z' reads"


def test_a_redacted_key_the_expression_does_not_name_decides_as_before(tmp_path: Path) -> None:
    inv = satisfies("args.amount < 100", tool="pay")
    assert one(tmp_path, inv, trajectory(step("pay", args={"amount": 50, "note": PLACEHOLDER}))).verdict == "pass"
    v = one(tmp_path, inv, trajectory(step("pay", args={"amount": 500, "note": "[redacted:email]"})))
    assert v.verdict == "fail" and v.step_index == 0
    # a redacted result is not read by an expression that never names it
    t = trajectory(step("pay", args={"amount": 50}, result={"status": PLACEHOLDER}))
    assert one(tmp_path, inv, t).verdict == "pass"


@pytest.mark.parametrize(
    ("expr", "today"),
    [
        ("args['to'] == 'x@y.z'", "pass"),
        ("args.exists(k, args[k] == 'boss@corp.com')", "pass"),
        ("!args.exists(k, args[k] == 'boss@corp.com')", "fail"),
        ("args == {'to': 'x@y.z', 'note': 'hello'}", "fail"),
        ("size(args) == 1", "fail"),
        ("args.size() == 1", "fail"),
        ("string(args).contains('boss')", "indeterminate"),  # the binding has no string() of a map
    ],
)
def test_a_whole_read_of_the_arguments_reads_every_redacted_value(tmp_path: Path, expr: str, today: str) -> None:
    """``note`` is never named, but each of these reads it (``today``: the verdict without this rule)."""
    v = one(tmp_path, satisfies(expr), trajectory(step("send_email", args={"to": "x@y.z", "note": PLACEHOLDER})))
    assert v.verdict == "indeterminate", today
    assert v.message == f"send_email at step 0: args.note is a redaction placeholder, which {expr} reads"


def test_a_redacted_result_field_read(tmp_path: Path) -> None:
    inv = satisfies("result.status == 'sent'")
    v = one(tmp_path, inv, trajectory(step("send_email", args={"to": "x@y.z"}, result={"status": PLACEHOLDER})))
    assert v.verdict == "indeterminate"
    assert v.message == "send_email at step 0: result.status is a redaction placeholder, which " + inv_expr(inv)
    hashed = {"status": "queued", "id": "[hmac:0123456789abcdef]"}
    t = trajectory(step("send_email", args={"to": "x@y.z"}, result=hashed))
    assert one(tmp_path, inv, t).verdict == "fail"


def test_a_step_field_or_another_step_read_by_arg_satisfies(tmp_path: Path) -> None:
    v = one(tmp_path, satisfies("step.args.to == 'x@y.z'"), trajectory(step("send_email", args={"to": "***"})))
    assert v.verdict == "indeterminate" and "args.to is a redaction placeholder" in v.message
    inv = satisfies("steps.exists(s, s.name == 'approve' && s.args.id == args.id)", tool="pay")
    t = trajectory(step("approve", args={"id": PLACEHOLDER}), step("pay", args={"id": "INV-1"}))
    v = one(tmp_path, inv, t)
    assert v.verdict == "indeterminate" and v.step_index == 1
    assert v.message.startswith("approve at step 0: args.id is a redaction placeholder, which steps.exists(")
    t = trajectory(step("approve", args={"id": "INV-1", "memo": PLACEHOLDER}), step("pay", args={"id": "INV-1"}))
    assert one(tmp_path, inv, t).verdict == "pass"


SENT = "steps.exists(s, s.name == 'send_email' && s.args.to == 'x@y.z')"


def test_expr_over_the_steps_with_a_redacted_value_read(tmp_path: Path) -> None:
    t = trajectory("plan", step("send_email", args={"to": "a@b.c"}), step("send_email", args={"to": PLACEHOLDER}))
    for expr in (SENT, f"!{SENT}"):  # today: fail, then pass
        v = one(tmp_path, expr_invariant(expr), t)
        assert v.verdict == "indeterminate" and v.step_index == 2
        assert v.message == f"send_email at step 2: args.to is a redaction placeholder, which {expr} reads"


def test_expr_over_the_steps_with_redaction_only_where_not_read(tmp_path: Path) -> None:
    hidden = {"to": "a@b.c", "body": PLACEHOLDER}
    t = trajectory(step("send_email", args=hidden, result={"id": "[redacted:id]"}))
    assert one(tmp_path, expr_invariant(SENT), t).verdict == "fail"
    assert one(tmp_path, expr_invariant(f"!{SENT}"), t).verdict == "pass"
    t = trajectory(step("send_email", args={**hidden, "to": "x@y.z"}))
    assert one(tmp_path, expr_invariant(SENT), t).verdict == "pass"


def test_expr_not_naming_arguments_or_results_walks_no_values(tmp_path: Path, monkeypatch: Any) -> None:
    """The hot path: an invariant over the steps that never reads their values looks at none."""

    def walked(*_: Any) -> None:
        raise AssertionError("walked the values of an expression that names neither args nor result")

    monkeypatch.setattr(checks_module, "stand_in_read", walked)
    t = trajectory(step("send_email", args={"to": PLACEHOLDER}, result=PLACEHOLDER), "log")
    assert one(tmp_path, expr_invariant("steps.exists(s, s.name == 'send_email')"), t).verdict == "pass"
    assert one(tmp_path, expr_invariant("steps.all(s, s.kind == 'llm')"), t).verdict == "fail"


def test_stand_in_read_reads_under_named_keys_or_whole() -> None:
    stand_in_read = values_module.stand_in_read
    value = {"to": {"addr": "***"}, "note": "[redacted:note]", "n": 1}
    assert stand_in_read(value, {"args", "to"}, False) == (".to.addr", "a redaction placeholder")
    assert stand_in_read(value, {"args", "note"}, False) == (".note", "redacted ([redacted:note])")
    assert stand_in_read(value, {"args", "n"}, False) is None
    assert stand_in_read(value, {"args"}, True) == (".to.addr", "a redaction placeholder")  # the first in order
    assert stand_in_read("<hidden>", (), False) == ("", "a redaction placeholder")
    assert stand_in_read({"to": "bob@example.com"}, {"to"}, True) is None


KEYS = ("amount", "limit", "count", "total", "quantity")
STAND_INS = st.sampled_from([PLACEHOLDER, "***", "[redacted:number]", "[hmac:0123456789abcdef]"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.fixed_dictionaries({k: st.integers(-5, 5) for k in KEYS}),
    hidden=st.dictionaries(st.sampled_from(KEYS), STAND_INS),
    key=st.sampled_from(KEYS),
    op=st.sampled_from(["<", "<=", "==", "!=", ">=", ">"]),
    literal=st.integers(-5, 5),
)
def test_property_indeterminate_iff_the_compared_key_is_a_stand_in(
    tmp_path: Path, values: dict[str, int], hidden: dict[str, str], key: str, op: str, literal: int
) -> None:
    inv = satisfies(f"args.{key} {op} {literal}", tool="pay")
    clear = one(tmp_path, inv, trajectory(step("pay", args=values)))
    assert clear.verdict in ("pass", "fail")
    v = one(tmp_path, inv, trajectory(step("pay", args={**values, **hidden})))
    if key in hidden:
        assert v.verdict == "indeterminate" and f"args.{key} is " in v.message
    else:
        assert v.verdict == clear.verdict


# Ground truth carried on spans (``plumb.context.*`` attributes) may be redacted on the way too.
def _with_context(*specs: Any, **context: Any) -> Any:
    return trajectory(*specs, attributes={f"plumb.context.{k}": v for k, v in context.items()})


def test_a_guard_reading_redacted_context_is_indeterminate(tmp_path: Path) -> None:
    inv = "{id: n, never_call: pay, when: \"ctx.vendor_status == 'sanctioned'\"}"
    paid = step("pay", args={"amount": 10})
    # Redacted: whether the invariant applies is not known (before: not_applicable, a silent pass).
    v = one(tmp_path, inv, _with_context(paid, vendor_status=PLACEHOLDER))
    assert v.verdict == "indeterminate"
    assert v.message == (
        "when ctx.vendor_status == 'sanctioned': ctx.vendor_status is a redaction placeholder, which it reads"
    )
    assert one(tmp_path, inv, _with_context(paid, vendor_status="sanctioned")).verdict == "fail"
    assert one(tmp_path, inv, _with_context(paid, vendor_status="ok")).verdict == "not_applicable"
    # A redacted context value the guard does not read changes nothing.
    assert one(tmp_path, inv, _with_context(paid, vendor_status="sanctioned", note="***")).verdict == "fail"


def test_a_guard_reading_redacted_arguments_is_indeterminate(tmp_path: Path) -> None:
    inv = "{id: n, must_call: review, when: \"steps.exists(s, s.name == 'pay' && s.args.amount > 1000)\"}"
    v = one(tmp_path, inv, trajectory(step("pay", args={"amount": PLACEHOLDER})))
    assert v.verdict == "indeterminate" and "args.amount is a redaction placeholder" in v.message
    assert one(tmp_path, inv, trajectory(step("pay", args={"amount": 5000}))).verdict == "fail"


def test_arg_equals_against_redacted_context_is_indeterminate(tmp_path: Path) -> None:
    inv = "{id: a, arg_equals: {tool: pay, arg: amount, context: expected_amount}}"
    paid = step("pay", args={"amount": 4820})
    v = one(tmp_path, inv, _with_context(paid, expected_amount="[redacted:amount]"))
    assert v.verdict == "indeterminate" and "is redacted ([redacted:amount])" in v.message  # before: a fail
    assert one(tmp_path, inv, _with_context(paid, expected_amount="4820")).verdict == "pass"
    assert one(tmp_path, inv, _with_context(paid, expected_amount=4000)).verdict == "fail"


CONTEXT_READERS = [
    "arg_satisfies: {tool: pay, expr: 'args.amount <= ctx.limit'}",
    "expr: \"steps.all(s, s.name != 'pay' || s.args.amount <= ctx.limit)\"",
]


@pytest.mark.parametrize("check", CONTEXT_READERS)
def test_cel_reading_redacted_context_is_indeterminate(tmp_path: Path, check: str) -> None:
    inv = f"{{id: c, {check}}}"
    paid = step("pay", args={"amount": 50})
    v = one(tmp_path, inv, _with_context(paid, limit=PLACEHOLDER))
    assert v.verdict == "indeterminate" and "ctx.limit is a redaction placeholder" in v.message
    assert one(tmp_path, inv, _with_context(paid, limit=100)).verdict == "pass"
    assert one(tmp_path, inv, _with_context(paid, limit=10)).verdict == "fail"
    # Context read whole: any stand-in in it may be what is read.
    whole = "{id: w, expr: \"size(ctx) > 0 && ctx.exists(k, ctx[k] == 'x')\"}"
    assert one(tmp_path, whole, _with_context(paid, other="***")).verdict == "indeterminate"


@pytest.mark.parametrize(
    ("expr", "verdict", "today"),
    [
        ("steps[0] != steps[1]", "pass", "fail"),  # two steps, whose maps held no field at all
        ("steps[0] == steps[1]", "fail", "pass"),
        ("steps.filter(s, s.name == 'pay')[0] == steps.filter(s, s.name == 'pay')[1]", "fail", "pass"),
        ("steps.exists(s, s != steps[0] && s.name == 'pay')", "pass", "fail"),
        ("steps.filter(s, s.name == 'pay') == []", "fail", "fail"),
        ("steps.map(s, s).exists(s, s == steps[2])", "pass", "pass"),
        ("steps.exists(s, size(s) > 3)", "pass", "fail"),  # the size of a map: its fields
    ],
)
def test_step_maps_compared_whole_hold_every_field(tmp_path: Path, expr: str, verdict: str, today: str) -> None:
    """A step map compared whole is the whole step: the maps of two different calls of one
    tool with the same arguments differ (their index, span, times), where maps of only the fields
    an expression names (none here) compared equal (``today``: the verdict that gave)."""
    t = trajectory(step("pay", args={"id": "INV-1"}), step("pay", args={"id": "INV-1"}), "log")
    assert one(tmp_path, expr_invariant(expr), t).verdict == verdict, today


def test_a_step_map_compared_whole_reads_its_redacted_values(tmp_path: Path) -> None:
    """Its arguments and result are in it: a stand-in there is read, whatever the expression names."""
    t = trajectory(step("pay", args={"id": PLACEHOLDER}), step("pay", args={"id": "INV-1"}))
    v = one(tmp_path, expr_invariant("steps[0] != steps[1]"), t)
    assert v.verdict == "indeterminate"
    assert v.message == "pay at step 0: args.id is a redaction placeholder, which steps[0] != steps[1] reads"


@pytest.mark.parametrize(("expr", "verdict"), [("trajectory != {}", "pass"), ("size(trajectory) > 3", "pass"),
                                               ("trajectory.step_count == 2", "pass")])  # fmt: skip
def test_the_trajectory_map_read_whole_holds_every_field(tmp_path: Path, expr: str, verdict: str) -> None:
    """Read whole, the trajectory map is not the empty map of the fields an expression names
    (``trajectory != {}`` and ``size(trajectory) > 3`` failed)."""
    v = one(tmp_path, expr_invariant(expr), trajectory(step("pay", args={"id": "INV-1"}), "log"))
    assert v.verdict == verdict, v.message
