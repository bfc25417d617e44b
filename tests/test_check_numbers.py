"""Numbers in argument checks: ``arg_matches`` never matches a regex against a re-rendered float,
and ``arg_equals`` with ``compare: set`` keeps its ``tolerance``."""

from __future__ import annotations

import itertools
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st
from test_check_support import one, step, trajectory

from otel_plumb.check.values import equal

TWO_PLACES = r"{id: m, arg_matches: {tool: pay, arg: amount_gbp, regex: '^\d+\.\d{2}$'}}"
NOT_KEPT = "the text the call sent is not kept"


def test_arg_matches_on_a_decoded_float_is_indeterminate_not_a_fail(tmp_path):
    # 4820.00 decodes to 4820.0: today '4820.0' is quoted as not matching, text the agent never sent
    sent = '{"amount_gbp": 4820.00, "ref": 0.00001}'
    t = trajectory(step("pay", args=sent))
    v = one(tmp_path, TWO_PLACES, t)
    assert v.verdict == "indeterminate" and v.step_index == 0, v.message
    assert "amount_gbp at step 0 is the number 4820.0" in v.message and NOT_KEPT in v.message
    # 0.00001 decodes to 1e-05
    v = one(tmp_path, r"{id: m, arg_matches: {tool: pay, arg: ref, regex: '^0\.\d+$'}}", t)
    assert v.verdict == "indeterminate" and "ref at step 0 is the number 1e-05" in v.message
    # arguments recorded already decoded, and a float that re-renders without the regex's digits
    t = trajectory(step("pay", args={"amount_gbp": 4820.5}))
    assert one(tmp_path, TWO_PLACES, t).verdict == "indeterminate"
    t = trajectory(step("pay", args={"amount_gbp": Decimal("4820.00")}))
    assert one(tmp_path, TWO_PLACES, t).verdict == "indeterminate"


def test_an_unknown_float_does_not_hide_a_real_fail_at_another_call(tmp_path):
    t = trajectory(step("pay", args={"amount_gbp": 4820.00}), step("pay", args={"amount_gbp": "4820.5"}))
    v = one(tmp_path, TWO_PLACES, t)
    assert v.verdict == "fail" and v.step_index == 1 and v.got == "4820.5"


def test_arg_matches_on_an_integer_matches_its_digits(tmp_path):
    inv = r"{id: m, arg_matches: {tool: pay, arg: n, regex: '^\d{4}$'}}"
    assert one(tmp_path, inv, trajectory(step("pay", args='{"n": 4820}'))).verdict == "pass"
    v = one(tmp_path, inv, trajectory(step("pay", args='{"n": 48200}')))
    assert v.verdict == "fail" and "'48200' does not match" in v.message and v.got == 48200


def test_arg_matches_on_other_values_that_are_not_text_fails(tmp_path):
    inv = r"{id: m, arg_matches: {tool: pay, arg: flag, regex: '^(true|false|null|\[.*\]|\{.*\})$'}}"
    for sent in ("true", "null", "[1]", '{"a": 1}'):
        v = one(tmp_path, inv, trajectory(step("pay", args=f'{{"flag": {sent}}}')))
        assert v.verdict == "fail" and "flag at step 0 is not text" in v.message, sent


SET = "{id: s, arg_equals: {tool: pay, arg: amounts, value: [10, 20], compare: set, tolerance: 0.01}}"


def _set_verdict(tmp_path, amounts, inv=SET):
    return one(tmp_path, inv, trajectory(step("pay", args={"amounts": amounts}))).verdict


def test_set_compare_keeps_the_tolerance(tmp_path):
    assert _set_verdict(tmp_path, [20.004, 10]) == "pass"  # failed before: set ignored the tolerance
    assert _set_verdict(tmp_path, ["20.004", 9.995]) == "pass"
    assert _set_verdict(tmp_path, [10, 20.004, 10]) == "pass"  # repeats are ignored, as without tolerance
    mixed = "{id: s, arg_equals: {tool: pay, arg: amounts, value: [10, ' GBP', 20], compare: set, tolerance: 0.01}}"
    assert _set_verdict(tmp_path, ["gbp", 20.004, 10], mixed) == "pass"
    # still fails where it should
    assert _set_verdict(tmp_path, [20.02, 10]) == "fail"
    assert _set_verdict(tmp_path, [20.004, 10, 30]) == "fail"
    assert _set_verdict(tmp_path, [20.004]) == "fail"
    assert _set_verdict(tmp_path, [10, 10.004]) == "fail"  # two distinct numbers where one is expected: no pair
    assert _set_verdict(tmp_path, ["usd", 20.004, 10], mixed) == "fail"
    # without tolerance, unchanged
    exact = "{id: s, arg_equals: {tool: pay, arg: amounts, value: [10, 20], compare: set}}"
    assert _set_verdict(tmp_path, [20, 10, 10.0], exact) == "pass"
    assert _set_verdict(tmp_path, [20.004, 10], exact) == "fail"


def _oracle(a: list[Decimal], b: list[Decimal], tolerance: Decimal) -> bool:
    """Set convention: distinct values pair one to one within tolerance, by brute force."""
    da, db = sorted(set(a)), list(set(b))
    if len(da) != len(db):
        return False
    return any(all(abs(x - y) <= tolerance for x, y in zip(da, p, strict=True)) for p in itertools.permutations(db))


# Hundredths near each other, so pairs within and just past the tolerance are common.
_HUNDREDTHS = st.integers(0, 30).map(lambda i: Decimal(i) / 100)


def _rendered(d: Decimal) -> st.SearchStrategy[object]:
    """``d`` as an argument may carry it: a Decimal, a float, text, an int when whole."""
    forms: list[object] = [d, float(d), str(d)]
    if d == d.to_integral_value():
        forms.append(int(d))
    return st.sampled_from(forms)


@settings(max_examples=600, deadline=None)
@given(
    st.lists(_HUNDREDTHS, max_size=5),
    st.lists(_HUNDREDTHS, max_size=5),
    st.integers(0, 6).map(lambda i: Decimal(i) / 100),
    st.data(),
)
def test_set_with_tolerance_matches_a_brute_force_pairing(a, b, tolerance, data):
    sent_a = [data.draw(_rendered(x)) for x in a]
    sent_b = [data.draw(_rendered(x)) for x in b]
    expected = _oracle(a, b, tolerance)
    assert equal(sent_a, sent_b, "set", tolerance) is expected
    assert equal(sent_b, sent_a, "set", tolerance) is expected


@settings(max_examples=300, deadline=None)
@given(st.lists(_HUNDREDTHS, min_size=1, max_size=5), st.data())
def test_set_with_tolerance_pairs_a_shuffled_perturbed_copy(a, data):
    """A permutation of ``a`` moved by at most the tolerance always compares equal (when the
    moves do not merge or split distinct values, which the oracle would judge differently)."""
    tolerance = Decimal("0.01")
    distinct = sorted(set(a))
    moved = [x + data.draw(st.sampled_from([Decimal("-0.01"), Decimal(0), Decimal("0.01")])) for x in distinct]
    b = data.draw(st.permutations(moved))
    assert equal(b, distinct, "set", tolerance) is _oracle(distinct, b, tolerance)
    if len(set(moved)) == len(distinct):
        assert equal(b, distinct, "set", tolerance)
