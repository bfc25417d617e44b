"""``matches_reference``: every trajectory and argument mode against LangChain's agentevals
itself on generated cases (differential) and the unordered modes against a brute-force
pairing, localisation to the first divergent step, indeterminate when arguments were not
captured, are redacted or do not decode, or the trajectory is incomplete, and the policy file
forms (reference from context or from a file by task) through replay."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from itertools import permutations, product
from pathlib import Path
from typing import Any

import pytest
from agentevals.trajectory.match import create_trajectory_match_evaluator
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from otel_plumb.check import PolicyError, decide, load_policy
from otel_plumb.check.checks import Run
from otel_plumb.check.reference import MatchesReference, context_reference
from otel_plumb.model import Step, Trajectory
from otel_plumb.model.placeholders import stand_in

MODES = ("strict", "unordered", "subset", "superset")
ARGS = ("exact", "ignore", "subset", "superset")
call = st.tuples(st.sampled_from(["a", "b", "c"]),
                 st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 2), max_size=2))  # fmt: skip


def steps(calls: Sequence[tuple[str, Any]], args_status: str = "captured") -> list[Step]:
    return [Step(index=i, kind="tool", name=n, span_id=f"{i:016x}", parent_span_id=None, trace_id="t", start_ns=i,
                 end_ns=i + 1, convention="genai", args=a, args_status=args_status)  # type: ignore[arg-type]
            for i, (n, a) in enumerate(calls)]  # fmt: skip


def ours(calls: Sequence[tuple[str, Any]], reference: Sequence[tuple[str, Mapping[str, Any] | None]], mode: str,
         args: str, complete: bool = True, args_status: str = "captured") -> Any:  # fmt: skip
    """Our verdict; a reference call's args None: the reference gives only the name."""
    check = MatchesReference(context_reference("ref"), mode, args, {})  # type: ignore[arg-type]
    t = Trajectory(key="t", trace_ids=["t"], steps=steps(calls, args_status), complete=complete)
    ctx = {"ref": [{"name": n, "args": a} for n, a in reference]}
    return check.run(Run(t, ctx, complete=complete), t.steps)


def messages(calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One assistant message per call: calls of one message are unordered to agentevals, and a
    trajectory's steps are ordered."""
    turns = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": n, "arguments": json.dumps(a)}}]}
             for n, a in calls]  # fmt: skip
    return [{"role": "user", "content": "go"}, *turns]


# agentevals 0.0.9 departs from its own documentation in two places, where otel-plumb keeps the
# documented meaning (tested below): in `unordered` mode it requires exact arguments whatever the
# argument mode, and in `subset` mode it compares arguments the other way round.
AGREED = [(m, a) for m in MODES for a in ARGS if not (m in ("unordered", "subset") and a in ("subset", "superset"))]


def fits(args: str, got: dict[str, Any], expected: dict[str, Any] | None) -> bool:
    """The documented argument modes, on the plain values generated here."""
    if args == "ignore" or expected is None:
        return True
    if args == "exact":
        return got == expected
    fewer, more = (got, expected) if args == "subset" else (expected, got)
    return all(k in more and more[k] == v for k, v in fewer.items())


def pairing_is_free(calls: list[Any], reference: list[Any], args: str) -> bool:
    """Whether any first fit pairs as many calls as can be: calls that fit a common reference
    call fit the same ones (the pairs form complete blocks, as under an equivalence)."""
    rows = [frozenset(i for i, r in enumerate(reference) if c[0] == r[0] and fits(args, c[1], r[1])) for c in calls]
    return all(a == b or not a & b for a in rows for b in rows)


# A third departure: agentevals pairs calls by first fit (`_is_trajectory_superset`), which can
# miss a one-to-one pairing that exists (test_a_pairing_that_exists_is_found). Under `exact` and
# `ignore` the pairs form complete blocks, where first fit is as good as any; `superset` mode
# with `subset` / `superset` arguments is compared only on such cases, and every case against a
# brute-force pairing in test_unordered_modes_agree_with_brute_force.
@settings(max_examples=400, deadline=None)
@given(st.lists(call, max_size=4), st.lists(call, max_size=4), st.sampled_from(AGREED))
def test_every_mode_agrees_with_agentevals(calls: list[Any], reference: list[Any], modes: tuple[str, str]) -> None:
    mode, args = modes
    assume(mode == "strict" or pairing_is_free(calls, reference, args))
    evaluator = create_trajectory_match_evaluator(trajectory_match_mode=mode, tool_args_match_mode=args)  # type: ignore[arg-type]
    theirs = evaluator(outputs=messages(calls), reference_outputs=messages(reference))["score"]
    assert (ours(calls, reference, mode, args).verdict == "pass") == theirs, (calls, reference, mode, args)


def paired(calls: list[Any], reference: list[Any], mode: str, args: str) -> bool:
    """Brute force: whether some one-to-one pairing satisfies the mode (every call paired for
    ``subset``, every reference call for ``superset``, both for ``unordered``), trying every
    injective assignment; ``strict``: call k is reference call k."""

    def fit(c: Any, r: Any) -> bool:
        return bool(c[0] == r[0] and fits(args, c[1], r[1]))

    if mode in ("strict", "unordered") and len(calls) != len(reference):
        return False
    if mode == "strict":
        return all(fit(c, r) for c, r in zip(calls, reference, strict=True))
    if mode == "superset":
        return any(all(fit(calls[j], r) for r, j in zip(reference, p, strict=True))
                   for p in permutations(range(len(calls)), len(reference)))  # fmt: skip
    return any(all(fit(c, reference[i]) for c, i in zip(calls, p, strict=True))
               for p in permutations(range(len(reference)), len(calls)))  # fmt: skip


UNORDERED = ("unordered", "subset", "superset")
names = st.sampled_from(["a", "a", "b"])  # mostly one tool: more calls compete for a reference call
small_call = st.tuples(names, st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 1), max_size=2))
# A reference call with only a name fits calls with any arguments: first fit can pick wrong.
reference_call = st.one_of(small_call, st.tuples(names, st.none()))


@settings(max_examples=1000, deadline=None)
@given(st.lists(small_call, max_size=4), st.lists(reference_call, max_size=4), st.sampled_from(UNORDERED),
       st.sampled_from(ARGS))  # fmt: skip
# First fit fails this one; random search meets such a case in most runs, not all.
@example([("a", {"x": 1}), ("a", {"x": 2})], [("a", None), ("a", {"x": 1})], "unordered", "exact")
def test_unordered_modes_agree_with_brute_force(calls: list[Any], reference: list[Any], mode: str, args: str) -> None:
    verdict = ours(calls, reference, mode, args).verdict
    assert verdict == ("pass" if paired(calls, reference, mode, args) else "fail"), (calls, reference, mode, args)


@pytest.mark.parametrize("mode", UNORDERED)
def test_a_pairing_that_exists_is_found(mode: str) -> None:
    """First fit pairs a(x=1) with the name-only reference call, and a(x=2) then fits nothing;
    a(x=2) with the name-only one and a(x=1) with a(x=1) pairs them all."""
    assert ours([("a", {"x": 1}), ("a", {"x": 2})], [("a", None), ("a", {"x": 1})], mode, "exact").verdict == "pass"
    # The same with arguments everywhere, in `superset` argument mode (where agentevals pairs by
    # first fit too, and fails): a(x=0, y=0) fits both reference calls, a(x=0) only the first.
    calls, reference = [("a", {"x": 0, "y": 0}), ("a", {"x": 0})], [("a", {"x": 0}), ("a", {"x": 0, "y": 0})]
    assert ours(calls, reference, mode, "superset").verdict == "pass"
    # What is left unpaired by a largest pairing is what a fail reports: a(x=1) is always paired.
    extra = ours([("a", {"x": 1}), ("a", {"x": 2}), ("a", {"x": 3})], [("a", None), ("a", {"x": 1})], mode, "exact")
    assert extra.verdict == ("pass" if mode == "superset" else "fail")
    if mode != "superset":
        assert extra.step is not None and extra.step.index in (1, 2) and "matches no call" in extra.message
    # The trajectory makes a(x=1): what it lacks is the second name-only call.
    missing = ours([("a", {"x": 1}), ("a", {"x": 2})], [("a", None), ("a", None), ("a", {"x": 1})], mode, "exact")
    assert missing.verdict == ("pass" if mode == "subset" else "fail")
    if mode != "subset":
        assert missing.message == "the reference calls a; the trajectory does not"


@pytest.mark.parametrize("mode", ["unordered", "subset"])
def test_argument_modes_mean_what_they_say_in_every_trajectory_mode(mode: str) -> None:
    """Where agentevals departs from its documentation: a call's arguments that are a subset of
    the reference's pass in ``subset`` argument mode, a superset in ``superset`` mode."""
    fewer, more = [("a", {"x": 0})], [("a", {"x": 0, "y": 1})]
    assert ours(fewer, more, mode, "subset").verdict == "pass"
    assert ours(more, fewer, mode, "subset").verdict == "fail"
    assert ours(more, fewer, mode, "superset").verdict == "pass"
    assert ours(fewer, more, mode, "superset").verdict == "fail"


def test_a_strict_mismatch_is_localised_where_it_happens() -> None:
    reference = [("fetch", {}), ("check", {}), ("pay", {}), ("log", {})]
    skipped = ours([("fetch", {}), ("pay", {}), ("log", {})], reference, "strict", "ignore")
    assert skipped.verdict == "fail" and skipped.step is None and "check" in skipped.message
    swapped = ours([("fetch", {}), ("check", {}), ("refund", {}), ("log", {})], reference, "strict", "ignore")
    assert swapped.verdict == "fail" and swapped.step is not None and swapped.step.index == 2  # not a cascade
    extra = ours([("fetch", {}), ("check", {}), ("pay", {}), ("pay", {}), ("log", {})], reference, "strict", "ignore")
    assert extra.step is not None and extra.step.name == "pay" and "not in the reference" in extra.message


def test_missing_data_is_indeterminate_never_a_fail() -> None:
    reference = [("a", {"x": 1})]
    hidden = ours([("a", {"x": 2})], reference, "strict", "exact", args_status="absent")
    assert hidden.verdict == "indeterminate" and "absent" in hidden.message
    assert ours([("a", {"x": 2})], reference, "strict", "ignore", args_status="absent").verdict == "pass"
    check = MatchesReference(context_reference("nope"), "strict", "ignore", {})
    t = Trajectory(key="t", trace_ids=["t"], steps=steps([("a", {})]))
    assert check.run(Run(t, {}, complete=True), t.steps).verdict == "indeterminate"


STAND_INS = ["<REDACTED>", "***", "[redacted:email]", "[hmac:0123456789abcdef]", "49… [12 characters redacted]"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("value", STAND_INS)
def test_a_redacted_value_the_mode_compares_is_indeterminate_not_a_fail(mode: str, value: str) -> None:
    reference = [("lookup", {"id": 7}), ("refund", {"amount": 5})]
    calls = [("lookup", {"id": 7}), ("refund", {"amount": value})]
    for args in ("exact", "subset", "superset"):
        out = ours(calls, reference, mode, args)
        assert out.verdict == "indeterminate" and out.step is not None and out.step.index == 1, (args, out.message)
        assert out.message.startswith("arguments of step 1 (refund) cannot be compared with the reference: amount")
    assert ours(calls, reference, mode, "exact").message.endswith(f"amount is {stand_in(value)}")
    nested = ours([("lookup", {"id": 7}), ("refund", {"amount": {"to": ["x", value]}})], reference, mode, "exact")
    assert nested.verdict == "indeterminate" and "amount.to[1] is " in nested.message
    assert ours(calls, reference, mode, "ignore").verdict == "pass"


@pytest.mark.parametrize("mode", MODES)
def test_a_redacted_value_the_mode_does_not_compare_does_not_matter(mode: str) -> None:
    calls = [("refund", {"amount": 5, "note": "<REDACTED>"})]
    assert ours(calls, [("refund", {"amount": 5})], mode, "superset").verdict == "pass"
    assert ours(calls, [("refund", {"amount": 6})], mode, "superset").verdict == "fail"
    assert ours(calls, [("refund", None)], mode, "exact").verdict == "pass"  # names only


@pytest.mark.parametrize("mode", MODES)
def test_a_certain_mismatch_beside_a_redacted_value_still_fails(mode: str) -> None:
    reference = [("refund", {"amount": 5, "note": "ok"})]
    assert ours([("refund", {"amount": 50, "note": "<REDACTED>"})], reference, mode, "exact").verdict == "fail"
    assert ours([("refund", {"note": "<REDACTED>"})], reference, mode, "exact").verdict == "fail"  # keys differ
    assert ours([("refund", {"amount": "***", "to": "x"})], reference, mode, "subset").verdict == "fail"
    # A call the reference does not have fails whatever the redacted one was.
    two = [("refund", {"amount": "<REDACTED>", "note": "ok"}), ("delete", {})]
    verdict = ours(two, reference, mode, "exact").verdict
    assert verdict == ("indeterminate" if mode == "superset" else "fail")


@pytest.mark.parametrize("mode", MODES)
def test_arguments_that_are_a_stand_in_or_cut_off_json_are_indeterminate(mode: str) -> None:
    reference = [("refund", {"amount": 5, "note": "abc"})]
    cut = '{"amount": 5, "note": "ab'
    for args in ("<REDACTED>", '"***"', cut, json.dumps(cut), "[redacted: nested too deep]"):
        out = ours([("refund", args)], reference, mode, "superset")
        assert out.verdict == "indeterminate" and "cannot be compared" in out.message, args
    whole = ours([("refund", "<REDACTED>")], reference, mode, "exact")
    assert whole.message.endswith("the arguments are a redaction placeholder")
    # JSON text is compared decoded, twice-encoded too.
    assert ours([("refund", '{"amount": "5.0", "note": "abc"}')], reference, mode, "exact").verdict == "pass"
    assert ours([("refund", json.dumps('{"amount": 5, "note": "abc"}'))], reference, mode, "exact").verdict == "pass"
    assert ours([("refund", '{"amount": 6, "note": "abc"}')], reference, mode, "exact").verdict == "fail"
    # Text or a list is not named arguments, as read_argument reads them: which names it went by is unknown.
    for args in ("amount=5 note=abc", '[5, "abc"]'):
        assert ours([("refund", args)], reference, mode, "exact").verdict == "indeterminate", args


def test_strict_mode_with_a_redacted_argument() -> None:
    reference = [("lookup", {"id": 7}), ("refund", {"amount": 5}), ("log", {})]
    hidden = {"amount": "<REDACTED>"}
    unsure = ours([("lookup", {"id": 7}), ("refund", hidden), ("log", {})], reference, "strict", "exact")
    assert unsure.verdict == "indeterminate" and unsure.step is not None and unsure.step.index == 1
    assert "amount is a redaction placeholder" in unsure.message
    # A certain divergence elsewhere fails, localised as if the redacted value matched.
    wrong = ours([("lookup", {"id": 8}), ("refund", hidden), ("log", {})], reference, "strict", "exact")
    assert wrong.verdict == "fail" and wrong.step is not None and wrong.step.index == 0
    out = ours([("lookup", {"id": 7}), ("refund", hidden), ("pay", {}), ("log", {})], reference, "strict", "exact")
    assert out.verdict == "fail" and out.step is not None and out.step.index == 2
    assert out.message == "pay at step 2 is not in the reference"


REDACTED = "<REDACTED>"
maybe_redacted = st.one_of(st.integers(0, 1), st.just(REDACTED))
redacted_call = st.tuples(names, st.dictionaries(st.sampled_from(["x", "y"]), maybe_redacted, max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.lists(redacted_call, max_size=3), st.lists(reference_call, max_size=3), st.sampled_from(MODES),
       st.sampled_from(ARGS))  # fmt: skip
def test_redacted_values_against_every_value_they_could_stand_for(calls: list[Any], reference: list[Any], mode: str,
                                                                  args: str) -> None:  # fmt: skip
    """pass when every value the stand-ins could hide passes, fail when none does, else
    indeterminate; each stand-in tried as 0, 1 or a value no reference has (2)."""
    holes = [(i, k) for i, (_, a) in enumerate(calls) for k, v in a.items() if v == REDACTED]
    outcomes = set()
    for fill in product(range(3), repeat=len(holes)):
        filled = [(n, dict(a)) for n, a in calls]
        for (i, k), v in zip(holes, fill, strict=True):
            filled[i][1][k] = v
        outcomes.add(paired(filled, reference, mode, args))
    want = "pass" if outcomes == {True} else "fail" if outcomes == {False} else "indeterminate"
    assert ours(calls, reference, mode, args).verdict == want, (calls, reference, mode, args)


def _policy(tmp_path: Path, check: str, extra: str = "") -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(f"policy: p\ntask: {{attribute: order.id}}\n{extra}invariants:\n  - id: follows\n"
                    f"    severity: high\n    matches_reference: {check}\n")  # fmt: skip
    return path


def test_policy_forms_decide_through_the_engine(tmp_path: Path) -> None:
    (tmp_path / "refs.yaml").write_text("ORD-1: [lookup, {name: refund, args: {amount: 5}}]\n")
    policy = load_policy(_policy(tmp_path, "{reference: {file: refs.yaml}, mode: strict, args: superset}"))
    good = Trajectory(key="t", trace_ids=["t"], steps=steps([("lookup", {}), ("refund", {"amount": "5.0", "x": 1})]),
                      attributes={"order.id": "ORD-1"})  # fmt: skip
    assert decide([policy], good).verdicts[0].verdict == "pass"  # typed comparison: "5.0" equals 5
    bad = Trajectory(key="t", trace_ids=["t"], steps=steps([("lookup", {}), ("refund", {"amount": 50})]),
                     attributes={"order.id": "ORD-1"})  # fmt: skip
    (v,) = decide([policy], bad).verdicts
    assert v.verdict == "fail" and v.step_index == 1
    unknown = Trajectory(key="t", trace_ids=["t"], steps=steps([("lookup", {})]), attributes={"order.id": "ORD-9"})
    assert decide([policy], unknown).verdicts[0].verdict == "indeterminate"
    cut = Trajectory(key="t", trace_ids=["t"], steps=steps([("lookup", {})]), complete=False,
                     incomplete_reason="max_wait", attributes={"order.id": "ORD-1"})  # fmt: skip
    assert decide([policy], cut).verdicts[0].verdict == "indeterminate"  # the rest may still come


def test_bad_references_are_refused_at_load_with_the_line(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="exactly one of context or file"):
        load_policy(_policy(tmp_path, "{reference: {}}"))
    (tmp_path / "refs.yaml").write_text("ORD-1: [{args: {}}]\n")
    with pytest.raises(PolicyError, match="entry 'ORD-1': reference call 0 has no name") as exc:
        load_policy(_policy(tmp_path, "{reference: {file: refs.yaml}}"))
    assert exc.value.line == 6  # the matches_reference line
    with pytest.raises(PolicyError, match="outside the policy's folder"):
        load_policy(_policy(tmp_path, "{reference: {file: /etc/hostname}}"))
