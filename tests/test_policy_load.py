"""Policies are refused before anything runs, with file, line and reason."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_check_support import policy, step, trajectory

from otel_plumb.check import PolicyError, decide, load_policies, load_policy

ROOT = Path(__file__).resolve().parent.parent

HEAD = "policy: p\ninvariants:\n  - {id: ok, must_call: a}\n"


@pytest.mark.parametrize(
    ("body", "line", "words"),
    [
        (HEAD + "  - {id: x, must_call: a, colour: red}\n", 4, "unknown key 'colour'"),
        (HEAD + "  - id: x\n    must_call: a\n    never_call: b\n", 4, "2 checks (must_call, never_call)"),
        (HEAD + "  - {id: x, severity: high}\n", 4, "has no check"),
        (HEAD + "  - {id: ok, must_call: b}\n", 4, "duplicate invariant id 'ok'"),
        (HEAD + "  - id: x\n    severity: urgent\n    must_call: a\n", 5, "'critical', 'high', 'medium' or 'low'"),
        (HEAD + "  - id: x\n    when: 'ctx.a >'\n    must_call: a\n", 5, "does not compile"),
        (HEAD + "  - {id: x, expr: 'nosuch.a > 1'}\n", 4, "unknown variable 'nosuch'"),
        (HEAD + "  - {id: x, expr: 'frob(ctx) > 1'}\n", 4, "unknown function 'frob'"),
        (HEAD + "  - id: x\n    arg_matches:\n      tool: a\n      arg: b\n      regex: '(['\n", 8, "does not compile"),
        (HEAD + "  - {id: x, arg_equals: {tool: a, arg: b}}\n", 4, "exactly one of value, context or step"),
        (HEAD + "  - {id: x, arg_equals: {tool: a, arg: 'b[', value: 1}}\n", 4, "bad path"),
        (HEAD + "  - {id: x, call_count: {tool: a, min: 3, max: 1}}\n", 4, "min 3 is above max 1"),
        (HEAD + "  - {id: x, budget: {}}\n", 4, "at least one limit"),
        (HEAD + "  - {id: x, must_call: a, attempts: true}\n", 4, "attempts only goes with never_call"),
        (HEAD + "  - {id: x, never_call: a, scope: {after: a, before: b}}\n", 4, "exactly one of after"),
        ("policy: 'bad name!'\ninvariants:\n  - {id: x, must_call: a}\n", 1, "policy: String should match"),
        ("policy: p\ninvariants: []\n", 2, "at least 1 item"),
        ("policy: p\npolicy: q\ninvariants: []\n", 2, "duplicate key 'policy'"),
        ("policy: p\ninvariants:\n  - {id: x, must_call: [a\n", 4, "not valid YAML"),
        ("policy: p\ntask: {attribute: id}\ncontext: {file: nope.yaml}\n" + HEAD[10:], 3, "cannot be read"),
        ("policy: p\ncontext: {file: nope.yaml}\n" + HEAD[10:], 2, "needs task.attribute"),
        ("- a\n- b\n", 1, "a policy is a mapping"),
    ],
)
def test_bad_policy_names_line_and_reason(tmp_path, body, line, words):
    with pytest.raises(PolicyError) as info:
        policy(tmp_path, body)
    err = info.value
    assert err.path.endswith("p.yaml")
    assert err.line == line, str(err)
    assert words in err.message, str(err)
    assert str(err) == f"{err.path}:{line}: {err.message}"


def test_every_problem_is_collected(tmp_path):
    body = HEAD + "  - {id: x, expr: 'frob(1)'}\n  - {id: y, arg_matches: {tool: a, arg: b, regex: '(['}}\n"
    with pytest.raises(PolicyError) as info:
        policy(tmp_path, body)
    assert [p.line for p in info.value.problems] == [4, 5]


def test_missing_file_and_duplicate_policy_names(tmp_path):
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_policy(tmp_path / "nope.yaml")
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(HEAD)
    b.write_text(HEAD)
    with pytest.raises(PolicyError, match="also used by"):
        load_policies([a, b])


def test_spec_example_policy_loads_and_evaluates(tmp_path):
    # The example from the product specification, verbatim apart from the context file.
    (tmp_path / "truth.yaml").write_text("INV-1: {amount: 5000}\n")
    p = policy(
        tmp_path,
        textwrap.dedent("""
        policy: ap-controls
        applies_to: {service: ap-agent, agent: "invoice-*"}
        task: {attribute: invoice.id}
        context:
          attributes_prefix: "plumb.context."
          file: truth.yaml
        invariants:
          - id: dup-check
            severity: critical
            when: "ctx.amount > 1000"
            must_call: check_duplicate
          - {id: no-pay-sanctioned, never_call: schedule_payment, when: "ctx.vendor_status == 'sanctioned'"}
          - {id: match-before-pay, precedes: {first: match_purchase_order, then: schedule_payment}}
          - {id: audit-after-flag, responds: {trigger: flag_exception, then: post_audit_log}}
          - {id: pay-once, call_count: {tool: schedule_payment, max: 1}}
          - {id: pay-amount, arg_equals: {tool: schedule_payment, arg: amount_gbp, context: expected_amount_gbp}}
          - {id: pay-as-invoiced, arg_equals: {tool: schedule_payment, arg: amount_gbp,
                                               step: {tool: fetch_invoice, result: total}}}
          - {id: mail-domain, arg_matches: {tool: send_email, arg: to, regex: '@example\\.com$'}}
          - {id: approver, arg_satisfies: {tool: request_approval, expr: "args.limit >= ctx.amount"}}
          - {id: no-runaway, budget: {max_steps: 40, max_tool_errors: 3, max_duration_ms: 120000}}
          - {id: custom, expr: "size(steps.filter(s, s.kind == 'tool')) > 0"}
        """),
    )
    assert len(p.invariants) == 11 and p.invariants[0].severity == "critical"
    t = trajectory("check_duplicate", attributes={"invoice.id": "INV-1"})
    verdicts = {v.invariant: v.verdict for v in decide([p], t).verdicts}
    assert verdicts["dup-check"] == "pass" and verdicts["custom"] == "pass"
    assert verdicts["no-pay-sanctioned"] == "indeterminate"  # no vendor_status ground truth
    assert verdicts["mail-domain"] == "not_applicable"
    assert decide([p], trajectory("x", service="other")).status == "unchecked"


def test_shipped_policies_load():
    for path in sorted((ROOT / "configs" / "policies").glob("*.yaml")):
        if path.name.endswith("-truth.yaml"):
            continue
        assert load_policy(path).invariants


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 6),
    st.data(),
    st.sampled_from(["colour", "must_cal", "Severity"]),
    st.booleans(),
)
def test_unknown_key_line_is_exact(tmp_path_factory, count, data, key, flow):
    bad = data.draw(st.integers(0, count - 1))
    lines = ["# leading comment", "policy: p", "invariants:"]
    expected = 0
    for i in range(count):
        if flow:
            extra = f", {key}: 1" if i == bad else ""
            lines.append(f"  - {{id: i{i}, must_call: t{extra}}}")
            if i == bad:
                expected = len(lines)
        else:
            lines += [f"  - id: i{i}", "", "    must_call: t"]
            if i == bad:
                lines.append(f"    {key}: 1")
                expected = len(lines)
    path = tmp_path_factory.mktemp("p") / "p.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.line == expected and f"unknown key {key!r}" in info.value.message


def test_yaml_anchors_merge_keys_and_dates(tmp_path):
    (tmp_path / "truth.yaml").write_text("INV-1: {due: 2026-01-31}\n")
    p = policy(
        tmp_path,
        """
        policy: p
        task: {attribute: invoice.id}
        context: {file: truth.yaml}
        invariants:
          - &pay {id: a, severity: low, arg_equals: {tool: pay, arg: due, context: due}}
          - {<<: *pay, id: b}
          - {id: c, arg_equals: {tool: pay, arg: due, value: 2026-01-31}}
        """,
    )
    assert [(i.id, i.severity) for i in p.invariants] == [("a", "low"), ("b", "low"), ("c", "high")]
    t = trajectory(step("pay", args={"due": "2026-01-31"}), attributes={"invoice.id": "INV-1"})
    assert [v.verdict for v in p.evaluate(t)] == ["pass", "pass", "pass"]
