"""The accounts-payable policy on traces captured from a real pydantic-ai agent
(tests/fixtures/ap/capture.py), read back through the replay pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_plumb.check import load_policy
from otel_plumb.model import trajectory_status
from otel_plumb.replay import replay

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "ap"
POLICY = load_policy(ROOT / "configs" / "policies" / "ap.yaml")

# scenario -> (trajectory status, {invariant: (verdict, name of the step it is localised to or None)})
# for every verdict that is neither pass nor not_applicable.
EXPECTED = {
    "clean": ("conformant", {}),
    "skipped_duplicate_check": ("violating", {
        "dup-check": ("fail", None), "dup-before-pay": ("fail", "schedule_payment")}),
    "payment_before_match": ("violating", {"match-before-pay": ("fail", "schedule_payment")}),
    "double_payment": ("violating", {"pay-once": ("fail", "schedule_payment")}),
    "wrong_amount": ("violating", {
        "pay-amount": ("fail", "schedule_payment"), "pay-as-invoiced": ("fail", "schedule_payment")}),
    "transient_error_retried": ("conformant", {}),
    "error_then_flag_and_audit": ("violating", {"pay-clean-invoice": ("fail", None)}),
    "sanctioned_vendor_paid": ("violating", {"no-pay-sanctioned": ("fail", "schedule_payment")}),
    "no_argument_capture": ("indeterminate", {
        "pay-amount": ("indeterminate", "schedule_payment"), "pay-as-invoiced": ("indeterminate", "schedule_payment"),
        "pay-right-invoice": ("indeterminate", "schedule_payment")}),
}  # fmt: skip


def test_every_scenario_has_a_fixture():
    assert {p.stem for p in FIXTURES.glob("*.jsonl")} == set(EXPECTED)


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_ap_scenario_verdicts(scenario):
    result = replay([FIXTURES / f"{scenario}.jsonl"])
    assert result.stats.errors_total == 0
    (t,) = result.trajectories
    assert POLICY.applies_to(t)
    verdicts = POLICY.evaluate(t)
    assert len(verdicts) == len(POLICY.invariants)
    status, notable = EXPECTED[scenario]
    got = {}
    for v in verdicts:
        if v.verdict in ("pass", "not_applicable"):
            continue
        step = t.steps[v.step_index] if v.step_index is not None else None
        assert step is None or step.span_id == v.span_id
        got[v.invariant] = (v.verdict, step.name if step else None)
    assert got == notable
    assert trajectory_status(t, verdicts) == status


def test_wrong_amount_names_expected_and_got():
    (t,) = replay([FIXTURES / "wrong_amount.jsonl"]).trajectories
    v = next(v for v in POLICY.evaluate(t) if v.invariant == "pay-amount")
    assert (v.expected, v.got) == (4820.0, 48200.0)


def test_transient_error_is_not_a_call_but_counts_in_the_budget():
    (t,) = replay([FIXTURES / "transient_error_retried.jsonl"]).trajectories
    matches = [s for s in t.tool_steps if s.name == "match_purchase_order"]
    assert [s.error is not None for s in matches] == [True, False]
    assert POLICY.early_failures(t) == []
