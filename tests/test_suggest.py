"""Mining candidate invariants (otel_plumb.suggest) on trajectories built directly: support is
what the check itself says, planted invariants are found, implied ones are dropped."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import re2
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from otel_plumb.check import CompiledPolicy, load_policy
from otel_plumb.model import Step, Trajectory
from otel_plumb.suggest import Candidate, Miner, Options, mine
from otel_plumb.suggest.candidates import build, prune
from otel_plumb.suggest.formats import regex, shape_of
from otel_plumb.suggest.mine import GroupCounts, Limits, bucket_down, bucket_up
from otel_plumb.suggest.render import flow, policy_yaml

LIMIT = Limits().examples


def step(i: int, name: str, args: Any = None, result: Any = None, error: str | None = None, kind: str = "tool",
         tokens: int | None = None) -> Step:  # fmt: skip
    return Step(
        i, kind, name, f"{i:016x}", None, "t", i * 10, i * 10 + 5, "test",  # type: ignore[arg-type]
        args=args, args_status="captured" if args is not None else "absent",
        result=result, result_status="captured" if result is not None else "absent", error=error, tokens=tokens,
    )  # fmt: skip


def trajectory(trace_id: str, calls: Sequence[tuple[str, Any, Any] | tuple[str, Any, Any, str]]) -> Trajectory:
    steps = [step(0, "agent", kind="agent")]
    for name, args, result, *error in calls:
        steps.append(step(len(steps), name, args, result, error[0] if error else None))
    return Trajectory(trace_id, [trace_id], steps)


def compile_candidates(candidates: Sequence[Candidate]) -> CompiledPolicy:
    guard = lambda c: {"when": c.when} if c.when else {}  # noqa: E731
    text = "policy: mined\ninvariants:\n" + "".join(f"  - {flow({'id': c.id, **guard(c), **c.check})}\n"
                                                    for c in candidates)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.yaml"
        path.write_text(text)
        return load_policy(path)


def verdicts(policy: CompiledPolicy, trajectories: Sequence[Trajectory]) -> dict[str, dict[str, str]]:
    """invariant id -> trace id -> verdict."""
    out: dict[str, dict[str, str]] = {}
    for t in trajectories:
        for v in policy.evaluate(t):
            out.setdefault(v.invariant, {})[t.trace_id] = v.verdict
    return out


def all_candidates(trajectories: Sequence[Trajectory], min_support: float = 0.0) -> list[Candidate]:
    counts = GroupCounts(Limits())
    for t in trajectories:
        counts.add(t)
    counts.end_warmup()
    return build(counts, min_support, 1)


# ---- random trajectories -----------------------------------------------------------------

TOOLS = ("a", "b", "c", "d")
IDS = ("X1", "X2", "x1 ", "Y-10", 7, 7.0, "7")


@st.composite
def random_trajectories(draw: st.DrawFn) -> list[Trajectory]:
    out = []
    for n in range(draw(st.integers(1, 12))):
        calls: list[Any] = []
        for _ in range(draw(st.integers(0, 7))):
            name = draw(st.sampled_from(TOOLS))
            # Arguments often copy an earlier result, as an agent passes values along.
            earlier = [c[2] for c in calls if c[2] is not None]
            if earlier and draw(st.booleans()):
                value = draw(st.sampled_from(earlier))["id"]
            else:
                value = draw(st.sampled_from(IDS))
            args = draw(st.sampled_from([None, {"id": value, "n": draw(st.integers(0, 300))}, {"n": 3}]))
            result = (
                {"id": draw(st.sampled_from(IDS)), "total": draw(st.integers(0, 50))} if draw(st.booleans()) else None
            )
            error = "boom" if draw(st.integers(0, 9)) == 0 else None
            calls.append((name, args, result, error) if error else (name, args, result))
        t = trajectory(f"t{n:02d}", calls)
        if draw(st.booleans()):
            t.steps.append(step(len(t.steps), "chat", kind="llm", tokens=draw(st.integers(0, 500))))
        out.append(t)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_trajectories())
def test_support_and_counter_examples_are_what_the_check_says(trajectories: list[Trajectory]) -> None:
    """Every candidate, at any support: the trajectories the check fails are its counter-examples
    (all of them while there are at most LIMIT), and their number is applied - held."""
    candidates = all_candidates(trajectories)
    if not candidates:
        return
    got = verdicts(compile_candidates(candidates), trajectories)
    for c in candidates:
        failed = sorted(tid for tid, v in got[c.id].items() if v == "fail")
        assert len(failed) == c.failed, (c.text, failed, c.examples)
        assert set(c.examples) <= set(failed), c.text
        if len(failed) <= LIMIT:
            assert sorted(c.examples) == failed, c.text
        passed = sum(1 for v in got[c.id].values() if v == "pass")
        assert passed >= c.held, c.text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_trajectories())
def test_nothing_a_counter_example_refutes_survives_at_full_support(trajectories: list[Trajectory]) -> None:
    result = mine(trajectories, Options(min_support=1.0, min_applied=1))
    kept = [c for g in result.groups for c in g.kept]
    if not kept:
        return
    for inv, by_trace in verdicts(compile_candidates(kept), trajectories).items():
        assert "fail" not in by_trace.values(), inv


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_trajectories(), st.sampled_from([0.5, 0.8, 1.0]))
def test_an_implied_candidate_holds_wherever_its_premises_hold(trajectories: list[Trajectory], s: float) -> None:
    """The implication rules are sound on the data: where no premise fails, the dropped one does
    not fail either; premises are written (kept) and at least as well supported."""
    candidates = all_candidates(trajectories, s)
    kept, implied = prune(candidates)
    if not implied:
        return
    by_id = {c.id: c for c in candidates}
    kept_ids = {c.id for c in kept}
    got = verdicts(compile_candidates(candidates), trajectories)
    for c in implied:
        assert set(c.implied_by) <= kept_ids, c.text
        assert all(by_id[p].rate >= c.rate for p in c.implied_by), c.text
        for t in trajectories:
            if all(got[p][t.trace_id] != "fail" for p in c.implied_by):
                assert got[c.id][t.trace_id] != "fail", (c.text, c.implied_by, t.trace_id)


# ---- planted invariants --------------------------------------------------------------------


def planted(i: int, fault: str | None = None, noise: bool = False) -> Trajectory:
    """fetch -> [lookup] -> check -> pay -> audit: the invoice id flows from fetch to check and
    pay, the amount from fetch's result to pay; ``fault`` breaks one thing."""
    inv, total = f"ORD-{1000 + i}", 100 + 7 * i
    calls: list[Any] = [("fetch", {"id": inv}, {"id": inv, "total": total})]
    if noise:
        calls.append(("lookup", {"q": "x"}, None))
    if fault != "skip_check":
        calls.append(("check", {"id": inv}, {"ok": True}))
    amount = total * 10 if fault == "wrong_amount" else total
    calls.append(("pay", {"id": inv, "amount": amount}, {"paid": True}))
    if fault == "pay_twice":
        calls.append(("pay", {"id": inv, "amount": amount}, {"paid": True}))
    if fault != "no_audit":
        calls.append(("audit", {"id": inv}, None))
    return trajectory(f"{'bad' if fault else 'ok'}{i:03d}", calls)


def _found(result: Any, key: tuple[Any, ...]) -> Candidate:
    for g in result.groups:
        for c in g.kept + g.implied:
            if c.key == key:
                return c  # type: ignore[no-any-return]
    raise AssertionError(f"{key} not proposed")


FAULTS = ("skip_check", "wrong_amount", "pay_twice", "no_audit")


@settings(max_examples=25, deadline=None)
@given(
    st.integers(10, 40),
    st.lists(st.sampled_from(FAULTS), max_size=2),
    st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_planted_invariants_are_found_with_their_support(good: int, faults: list[str], noise: list[bool]) -> None:
    trajectories = [planted(i, noise=noise[i]) for i in range(good)]
    trajectories += [planted(good + j, fault) for j, fault in enumerate(faults)]
    n = len(trajectories)
    result = mine(trajectories, Options(min_support=0.8, min_applied=5))
    broken = {f: [t.trace_id for t, x in zip(trajectories[good:], faults, strict=True) if x == f] for f in FAULTS}

    c = _found(result, ("must_call", "check"))
    assert (c.held, c.applied, sorted(c.examples)) == (n - len(broken["skip_check"]), n, broken["skip_check"])
    c = _found(result, ("precedes", "fetch", "pay"))
    assert (c.held, c.applied) == (n, n)  # every trajectory pays
    c = _found(result, ("responds", "pay", "audit"))
    assert (c.held, c.applied, sorted(c.examples)) == (n - len(broken["no_audit"]), n, broken["no_audit"])
    c = _found(result, ("call_count", "pay", None, 1))
    assert (c.held, sorted(c.examples)) == (n - len(broken["pay_twice"]), broken["pay_twice"])
    from otel_plumb.suggest.mine import Source

    c = _found(result, ("flow", "pay", "amount", Source("fetch", "result", "total")))
    assert (c.held, c.applied, sorted(c.examples)) == (n - len(broken["wrong_amount"]), n, broken["wrong_amount"])
    c = _found(result, ("flow", "check", "id", Source("fetch", "arg", "id")))
    assert c.held == c.applied == n - len(broken["skip_check"])
    c = _found(result, ("format", "fetch", "id"))
    assert c.check["arg_matches"]["regex"] == r"^ORD\-[0-9]{4}$" and c.held == n
    c = _found(result, ("never_after", "pay", "audit"))
    assert c.held == c.applied == n - len(broken["no_audit"])


def test_implied_orderings_and_sources_are_dropped_with_what_implies_them() -> None:
    trajectories = [planted(i) for i in range(20)]
    g = mine(trajectories, Options(min_support=1.0)).groups[0]
    kept = {c.key[:3] for c in g.kept}
    implied = {c.key[:3]: c for c in g.implied}
    # A chain fetch -> check -> pay -> audit: only its links are written.
    assert {("precedes", "fetch", "check"), ("precedes", "check", "pay"), ("precedes", "pay", "audit")} <= kept
    assert ("precedes", "fetch", "pay") not in kept
    assert implied[("precedes", "fetch", "pay")].implied_by == ["fetch-before-check", "check-before-pay"]
    # Each call once, in order: responds and never_call follow from precedes, count and must_call.
    assert not any(k[0] in ("responds", "never_after") for k in kept)
    assert set(implied[("responds", "fetch", "check")].implied_by) == {"fetch-before-check", "count-fetch",
                                                                       "must-call-check"}  # fmt: skip
    # pay's id equals check's, which equals fetch's: only fetch (called once) is the source written.
    flows = [c.key[3] for c in g.kept if c.kind == "flow" and c.key[1:3] == ("pay", "id")]
    assert {(s.tool, s.field) for s in flows} == {("fetch", "arg"), ("fetch", "result")}


def test_a_constant_is_not_proposed_as_dataflow() -> None:
    trajectories = [trajectory(f"t{i}", [("a", {"x": 1}, {"y": "k"}), ("b", {"z": "K"}, None)]) for i in range(10)]
    result = mine(trajectories, Options(min_support=1.0))
    assert not [c for c in result.groups[0].kept if c.kind == "flow"]


def test_incomplete_trajectories_are_left_out_and_the_policy_text_loads(tmp_path: Path) -> None:
    trajectories = [planted(i) for i in range(12)]
    trajectories[0].complete = False
    trajectories[0].steps = trajectories[0].steps[:2]
    result = mine(trajectories, Options(min_support=1.0))
    assert (result.trajectories, result.incomplete) == (12, 1)
    text = policy_yaml(result, "mined", "t.jsonl")
    path = tmp_path / "p.yaml"
    path.write_text(text)
    policy = load_policy(path)
    assert {i.id for i in policy.invariants} == {c.id for c in result.groups[0].kept}
    assert "# must_call check: 11/11 (1.000, Wilson 95% lower bound 0.741)" in text


def test_group_by_agent_guards_each_groups_invariants(tmp_path: Path) -> None:
    trajectories = []
    for i in range(10):
        a = planted(i)
        a.agent = "payer"
        b = trajectory(f"r{i}", [("refund", {"id": f"R-{i}"}, None)])
        b.agent = "refunder"
        trajectories += [a, b]
    result = mine(trajectories, Options(min_support=1.0, group_by="agent"))
    assert {g.value for g in result.groups} == {"payer", "refunder"}
    path = tmp_path / "p.yaml"
    path.write_text(policy_yaml(result, "mined", "x"))
    policy = load_policy(path)
    got = verdicts(policy, trajectories)
    # must_call refund holds for the refunder and does not apply to the payer.
    assert set(got["refunder.must-call-refund"].values()) == {"pass", "not_applicable"}
    assert all(v != "fail" for by_trace in got.values() for v in by_trace.values())


def test_miner_needs_the_attribute_name_to_group_by_it() -> None:
    try:
        Miner(Options(group_by="attribute"))
    except ValueError as exc:
        assert "attribute" in str(exc)
    else:
        raise AssertionError("no error")


# ---- formats and buckets -------------------------------------------------------------------


def _regex_of(values: list[str], literal: bool = True) -> str:
    from otel_plumb.suggest.formats import ShapeStats

    stats: dict[Any, ShapeStats] = {}
    order = []
    for v in values:
        shape, parts = shape_of(v)
        assert parts is not None
        if shape in stats:
            stats[shape].add(parts)
        else:
            stats[shape] = ShapeStats(parts)
            order.append(shape)
    return regex(order, stats, literal)


def test_formats_generalise_by_character_class_and_keep_constant_text() -> None:
    assert _regex_of(["INV-1001", "INV-1002", "INV-1093"]) == r"^INV\-[0-9]{4}$"
    assert _regex_of(["INV-1001", "INV-1002", "INV-1093"], literal=False) == r"^[A-Z]{3}\-[0-9]{4}$"
    assert _regex_of(["ab12", "abc123"], literal=False) == r"^[a-z]{2,3}[0-9]{2,3}$"
    assert _regex_of(["PO-7", "po.8"], literal=False) == r"^(?:[A-Z]{2}\-[0-9]|[a-z]{2}\.[0-9])$"
    assert shape_of("x" * 201)[1] is None  # free text is not a format


@given(st.lists(st.text(alphabet="AZaz09-_. é", min_size=1, max_size=12), min_size=1, max_size=6))
def test_a_generalised_regex_matches_every_value_and_compiles_with_re2(values: list[str]) -> None:
    pattern = _regex_of(values, literal=len(set(values)) >= 3)
    compiled = re2.compile(pattern)
    assert all(compiled.search(v) for v in values), pattern


@given(st.one_of(st.integers(-(10**9), 10**9), st.floats(-1e9, 1e9, allow_nan=False)))
def test_buckets_are_outward_with_two_significant_digits(value: float) -> None:
    up, down = bucket_up(value), bucket_down(value)
    assert down <= value <= up
    for edge in (up, down):
        if edge and abs(edge) > 100:
            digits = str(abs(int(edge))).rstrip("0")
            assert len(digits) <= 2, edge


def test_group_by_a_task_attribute_guards_with_its_value(tmp_path: Path) -> None:
    trajectories = []
    for i in range(12):
        t = planted(i) if i % 2 else trajectory(f"r{i}", [("refund", {"id": f"R-{i}"}, None)])
        t.attributes["intent"] = "pay" if i % 2 else "refund"
        trajectories.append(t)
    trajectories.append(trajectory("none", [("other", None, None)]))
    result = mine(trajectories, Options(min_support=1.0, group_by="attribute", attribute="intent"))
    assert result.ungrouped == 1
    assert {g.value: g.trajectories for g in result.groups} == {"pay": 6, "refund": 6}
    path = tmp_path / "p.yaml"
    path.write_text(policy_yaml(result, "mined", "x"))
    got = verdicts(load_policy(path), trajectories)
    refunds = got["refund.must-call-refund"]
    assert {tid for tid, v in refunds.items() if v == "pass"} == {f"r{i}" for i in range(0, 12, 2)}
    assert all(v != "fail" for by_trace in got.values() for v in by_trace.values())


# ---- branches decided by a tool's answer ---------------------------------------------------

PAYING = "ok"
VENDORS = ("Acme", "Globex", "Initech")
BRANCH_FAULTS = ("skip_dup", "pay_twice", "no_audit")


def ap_run(task: int, run: int, status: str, faults: frozenset[str], case_id: bool = True) -> Trajectory:
    """fetch -> check_dup -> vendor_check -> pay (status ok) or flag (any other status) -> audit;
    the vendor (three, shared by tasks) is no branch; ``faults`` break the paying path."""
    inv, vendor = f"INV-{task:03d}", VENDORS[task % len(VENDORS)]
    calls: list[Any] = [("fetch", {"id": inv}, {"id": inv, "vendor": vendor})]
    if "skip_dup" not in faults:
        calls.append(("check_dup", {"id": inv}, {"duplicate": False}))
    calls.append(("vendor_check", {"vendor": vendor}, {"vendor": vendor, "status": status}))
    if status == PAYING:
        calls += [("pay", {"id": inv}, {"paid": True})] * (2 if "pay_twice" in faults else 1)
    else:
        calls.append(("flag", {"id": inv, "reason": status}, {"flagged": True}))
    if "no_audit" not in faults:
        calls.append(("audit", {"id": inv}, {"logged": True}))
    t = trajectory(f"t{task:02d}r{run}", calls)
    if case_id:
        t.attributes["plumb.case.id"] = inv
    return t


@st.composite
def branched(draw: st.DrawFn) -> tuple[list[Trajectory], dict[str, str], dict[str, frozenset[str]]]:
    """Tasks with a vendor status each, a few runs each: every status is given to two fault-free
    tasks at least, and each fault is planted in every run of one of the other paying tasks, or
    none. Returns the runs, the status of each run and the faults of each run (by trace id)."""
    statuses = draw(st.sampled_from([(PAYING, "hold"), (PAYING, "hold", "deny")]))
    n = draw(st.integers(2 * len(statuses) + 1, 10))
    clean = list(statuses) * 2
    of_task = clean + [draw(st.sampled_from(statuses)) for _ in range(n - len(clean))]
    order = draw(st.permutations(range(n)))  # task order[j] gets status j
    status_of = {order[j]: s for j, s in enumerate(of_task)}
    # A vendor shared by exactly the non-paying tasks would be a second explanation of the branch.
    stopped = {i for i in range(n) if status_of[i] != PAYING}
    assume(all(stopped != {i for i in range(n) if i % len(VENDORS) in vs} for vs in ({0}, {1}, {2}, {0, 1},
                                                                                     {0, 2}, {1, 2})))  # fmt: skip
    may_fail = [order[j] for j in range(len(clean), n) if of_task[j] == PAYING]
    faulty = {f: draw(st.sampled_from([None, *may_fail])) for f in BRANCH_FAULTS}
    runs, status, faults = [], {}, {}
    for i in range(n):
        planted_here = frozenset(f for f, task in faulty.items() if task == i)
        for r in range(draw(st.integers(3, 5))):
            t = ap_run(i, r, status_of[i], planted_here)
            runs.append(t)
            status[t.trace_id], faults[t.trace_id] = status_of[i], planted_here
    return runs, status, faults


def _candidates(result: Any) -> list[Candidate]:
    return [c for g in result.groups for c in g.kept + g.implied]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(branched())
def test_a_branch_decided_by_a_tools_answer_is_proposed_guarded(
    planted_runs: tuple[list[Trajectory], dict[str, str], dict[str, frozenset[str]]],
) -> None:
    runs, status, faults = planted_runs
    result = mine(runs, Options(min_support=0.6, min_applied=5))
    candidates = _candidates(result)
    got = verdicts(compile_candidates(candidates), runs)
    # Nothing proposed fails a run without a fault, the stopped (non-paying) ones included.
    for c in candidates:
        assert not [tid for tid, v in got[c.id].items() if v == "fail" and not faults[tid]], (c.text, c.when)
    # Support is what the check says, guarded candidates included.
    for c in candidates:
        assert sum(v == "fail" for v in got[c.id].values()) == c.failed, c.text
        assert sum(v == "pass" for v in got[c.id].values()) >= c.held, c.text
    # Paying is proposed where the vendor check said ok, and not paying where it did not.
    pays = {tid for tid, s in status.items() if s == PAYING}
    must = [c for c in candidates if c.key == ("must_call", "pay")]
    assert len(must) == 1 and must[0].when is not None
    assert (must[0].held, must[0].applied) == (len(pays), len(pays))
    assert {tid for tid, v in got[must[0].id].items() if v == "pass"} == pays
    never = [c for c in candidates if c.key == ("never_call", "pay")]
    assert len(never) == 1 and (never[0].held, never[0].applied) == (len(runs) - len(pays),) * 2
    assert {tid for tid, v in got[never[0].id].items() if v == "pass"} == set(status) - pays
    # Paying is guarded by the status; no guard reads the invoice id (the task).
    assert '["status"]' in str(must[0].when) and '["status"]' in str(never[0].when)
    assert not [c.when for c in candidates if c.when and '["id"]' in c.when]
    # The faults stay counter-examples, of unguarded rules (proposed when supported enough).
    pays_twice = {tid for tid, f in faults.items() if "pay_twice" in f}
    for fault, key, applies in (("skip_dup", ("must_call", "check_dup"), set(status)),
                                ("pay_twice", ("call_count", "pay", None, 1), set(status)),
                                ("no_audit", ("responds", "pay", "audit"), pays)):  # fmt: skip
        broken = sorted(tid for tid, f in faults.items() if fault in f)
        assert not [c.text for c in candidates if c.key[:2] == key[:2] and c.when], fault
        if broken and 1 - len(broken) / len(applies) >= 0.6 and not (fault == "pay_twice" and len(pays_twice)
                                                                       / len(runs) > 0.4):  # fmt: skip
            c = _found(result, key)
            assert c.failed == len(broken) and c.applied == len(applies) and sorted(c.examples) == broken[:LIMIT]


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 4), st.integers(0, 3), st.integers(5, 7))
def test_a_field_that_names_the_task_never_guards(tasks: int, faulty: int, runs: int) -> None:
    """The invoice id (one per task, as few values as a branch's) separates a fault planted in
    every run of one task exactly; it is still a fault. Tasks are told by the first call's
    arguments here (no case id)."""
    faulty %= tasks
    trajectories = [ap_run(i, r, PAYING, frozenset({"skip_dup"}) if i == faulty else frozenset(), case_id=False)
                    for i in range(tasks) for r in range(runs)]  # fmt: skip
    result = mine(trajectories, Options(min_support=0.5, min_applied=5))
    assert not [c.text for c in _candidates(result) if c.when]
    c = _found(result, ("must_call", "check_dup"))
    assert (c.failed, c.applied) == (runs, tasks * runs)


@settings(max_examples=25, deadline=None)
@given(st.sets(st.integers(0, 29), min_size=5, max_size=9), st.booleans())
def test_an_answer_after_the_fault_does_not_explain_it(twice: set[int], before: bool) -> None:
    """A payment check answering "twice" once a payment was made twice reports the fault: it
    comes after the second payment, so the double payment stays a counter-example. Asked
    before the second payment (the agent paid again because of the answer) it is a branch."""
    trajectories = []
    for i in range(30):
        again = i in twice
        answer = ("verify", {"id": i}, {"status": "twice" if again else "once"})
        pay = ("pay", {"id": i}, {"paid": True})
        calls: list[Any] = [("fetch", {"id": i}, {"id": i}), pay]
        calls += ([answer, pay] if before else [pay, answer]) if again else [answer]
        trajectories.append(trajectory(f"t{i:02d}", calls))
    result = mine(trajectories, Options(min_support=0.7, min_applied=5))
    counts = [c for c in _candidates(result) if c.kind == "call_count" and c.key[1] == "pay"]
    assert len(counts) == 1
    c, n_twice = counts[0], len(twice)
    if before:
        assert c.when is not None and (c.held, c.applied) == (30 - n_twice, 30 - n_twice)
    else:
        assert c.when is None and (c.failed, c.applied) == (n_twice, 30)


def test_a_branch_inside_a_group_is_guarded_by_both(tmp_path: Path) -> None:
    """Grouped by agent, the payer's branch is guarded by the group and the answer together,
    as the written policy says; the refunder's trajectories are out of both."""
    trajectories = []
    for i in range(15):
        t = ap_run(i, 0, PAYING if i % 3 else "hold", frozenset())
        t.agent = "payer"
        r = trajectory(f"r{i}", [("refund", {"id": f"R-{i}"}, {"status": "hold" if i % 3 else PAYING})])
        r.agent = "refunder"
        trajectories += [t, r]
    result = mine(trajectories, Options(min_support=0.9, group_by="agent"))
    path = tmp_path / "p.yaml"
    path.write_text(policy_yaml(result, "mined", "x"))
    got = verdicts(load_policy(path), trajectories)
    pays = {f"t{i:02d}r0" for i in range(15) if i % 3}
    must = got["payer.must-call-pay-unless-vendor_check-status-hold"]
    assert {tid for tid, v in must.items() if v == "pass"} == pays
    assert {tid for tid, v in must.items() if v == "not_applicable"} == {t.trace_id for t in trajectories} - pays
    assert all(v != "fail" for by_trace in got.values() for v in by_trace.values())


def test_a_field_past_the_warm_up_with_more_values_or_two_in_a_run_is_dropped() -> None:
    def runs(statuses: Sequence[str], start: int) -> list[Trajectory]:
        return [ap_run(start + i, 0, s, frozenset()) for i, s in enumerate(statuses)]

    warm = runs([PAYING, "hold"] * 10, 0)
    answers = [("vendor_check", {}, {"status": "hold"}), ("vendor_check", {}, {"status": PAYING})]
    for later in (runs(["deny", "stop", "wait"], 100), [trajectory("twice", answers)]):
        counts = GroupCounts(Limits(warmup=len(warm)))
        for t in warm:
            counts.add(t)
        assert ("vendor_check", "status") in [(b.tool, b.path) for b in counts.branches]
        for t in later:
            counts.add(t)
        assert ("vendor_check", "status") not in [(b.tool, b.path) for b in counts.branches]
        assert [b.path for b in counts.branches_of["vendor_check"]] == ["vendor"]
        assert not [c.text for c in build(counts, 0.5, 5) if c.when and '["status"]' in c.when]
