"""Campaign analyses, all in the trajectory's one step-index space.

Per arm and perturbation: conformance and critical conformance (Wilson 95%), consistency
against the modal baseline path of the same case (structural, argument), divergences found by
alignment, outcome agreement (``state``), pass^k. Across arms: parity with a permutation test.
Per arm: the certificate, the minimum over perturbations of the lower bound of critical
conformance.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from decimal import Decimal
from typing import Any

from otel_plumb.campaign.perturb import Discard
from otel_plumb.campaign.store import TrialRow
from otel_plumb.check.align import align
from otel_plumb.check.values import canonical, equal
from otel_plumb.stats.passk import pass_hat_k_table
from otel_plumb.stats.wilson import rate, wilson_interval

DEFAULT_TARGET_BOUND = 0.95
MAX_DIVERGENCES = 20


def _stable(value: Hashable) -> Any:
    """A canonical comparison key as JSON-ready data, independent of hash order."""
    if isinstance(value, frozenset):
        return sorted((_stable(v) for v in value), key=lambda x: json.dumps(x))
    if isinstance(value, tuple):
        return [_stable(v) for v in value]
    if isinstance(value, Decimal):
        return str(value)
    return value


def arg_key(args: Any) -> str:
    """Arguments as a string key: equal keys iff the typed comparison says the args are equal."""
    return json.dumps(_stable(canonical(args, "normalised")), separators=(",", ":"))


def state_key(state: Any) -> str | None:
    return None if state is None else arg_key(state)


def _state(t: TrialRow) -> str | None:
    """The trial's end-state key, as stored with the trial (computed once for older rows)."""
    summary = t.summary if t.summary is not None else {}
    if "state_key" not in summary:
        summary["state_key"] = state_key((t.answer or {}).get("state"))
        t.summary = summary
    key: str | None = summary["state_key"]
    return key


def runs_needed(target: float) -> int | None:
    """Clean runs (all successes) for the Wilson lower bound to reach ``target``."""
    if not 0 < target < 1:
        return None
    n = 1
    while wilson_interval(n, n)[0] < target:
        n += 1
    return n


def _mode(keys: Iterable[Any]) -> Any:
    counts = Counter(keys)
    if not counts:
        return None
    # Most common; ties broken by the key's text so the choice is the same on every run.
    return min(counts.items(), key=lambda kv: (-kv[1], json.dumps(kv[0], default=str)))[0]


def _path(t: TrialRow) -> tuple[str, ...]:
    return tuple(p[0] for p in (t.summary or {}).get("path", ()))


def _akeys(t: TrialRow) -> tuple[str, ...]:
    return tuple(p[3] for p in (t.summary or {}).get("path", ()))


class Baseline:
    """A case's modal baseline for one arm: tool path, its arguments, its end state."""

    __slots__ = ("akeys", "path", "state", "steps", "trial_id")

    def __init__(self, trials: Sequence[TrialRow]) -> None:
        states = [k for k in (_state(t) for t in trials) if k is not None]
        self.state: str | None = _mode(states) if states else None
        self.path: tuple[str, ...] | None = _mode(_path(t) for t in trials) if trials else None
        on_path = [t for t in trials if _path(t) == self.path]
        self.akeys: tuple[str, ...] | None = _mode(_akeys(t) for t in on_path) if on_path else None
        example = next((t for t in on_path if _akeys(t) == self.akeys), None)
        self.trial_id = example.trial_id if example else None
        self.steps: list[list[Any]] = (example.summary or {}).get("path", []) if example else []


def baselines(trials: Sequence[TrialRow]) -> dict[tuple[str, str], Baseline]:
    """(arm, case) -> modal baseline, from the arm's baseline trials of the case (or, when the
    campaign has no baseline perturbation, from all its trials of the case)."""
    base: dict[tuple[str, str], list[TrialRow]] = defaultdict(list)
    every: dict[tuple[str, str], list[TrialRow]] = defaultdict(list)
    for t in trials:
        if t.status != "ok":
            continue
        every[(t.arm, t.case_id)].append(t)
        if t.perturbation == "baseline":
            base[(t.arm, t.case_id)].append(t)
    return {key: Baseline(base.get(key) or group) for key, group in every.items()}


def modal_states(trials: Sequence[TrialRow]) -> dict[str, str]:
    """case -> the modal end state of its baseline trials over all arms (for parity success)."""
    by_case: dict[str, list[str]] = defaultdict(list)
    for t in trials:
        if t.status == "ok" and t.perturbation == "baseline":
            key = _state(t)
            if key is not None:
                by_case[t.case_id].append(key)
    return {case: _mode(keys) for case, keys in by_case.items()}


def _arg_diff(expected: Any, got: Any) -> tuple[Any, Any]:
    """The differing part of two argument values (keys of dicts that differ)."""
    if isinstance(expected, dict) and isinstance(got, dict):
        keys = sorted(set(expected) | set(got))
        differing = [k for k in keys if k not in expected or k not in got or not equal(expected[k], got[k])]
        return ({k: expected.get(k) for k in differing}, {k: got.get(k) for k in differing})
    return expected, got


class _Divergences:
    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self._aligned: dict[tuple[tuple[str, ...], tuple[str, ...]], list[Any]] = {}

    def add(self, kind: str, step_index: int | None, tool: str | None, expected: Any, got: Any, trial: str) -> None:
        key = json.dumps([kind, tool, expected, got], default=str, sort_keys=True)
        item = self.items.get(key)
        if item is None:
            self.items[key] = {"kind": kind, "step_index": step_index, "tool": tool, "expected": expected,
                               "got": got, "count": 1, "example_trial": trial}
        else:
            item["count"] += 1

    def compare(self, t: TrialRow, base: Baseline) -> None:
        assert base.path is not None
        steps = (t.summary or {}).get("path", [])
        path = tuple(s[0] for s in steps)
        pair = (base.path, path)
        ops = self._aligned.get(pair)
        if ops is None:
            ops = self._aligned[pair] = align(base.path, path)
        for op in ops:
            if op.kind == "skipped":
                assert op.expected is not None
                exp = base.steps[op.expected]
                self.add("skipped", exp[1], exp[0], exp[0], None, t.trial_id)
            elif op.kind == "extra":
                assert op.got is not None
                got = steps[op.got]
                self.add("extra", got[1], got[0], None, got[0], t.trial_id)
            elif op.kind == "substitute":
                assert op.expected is not None and op.got is not None
                exp, got = base.steps[op.expected], steps[op.got]
                self.add("substitute", got[1], got[0], exp[0], got[0], t.trial_id)
            else:
                assert op.expected is not None and op.got is not None
                exp, got = base.steps[op.expected], steps[op.got]
                if exp[3] != got[3]:
                    want, have = _arg_diff(exp[2], got[2])
                    self.add("argument", got[1], got[0], want, have, t.trial_id)

    def top(self, limit: int = MAX_DIVERGENCES) -> list[dict[str, Any]]:
        return sorted(self.items.values(), key=lambda d: (-d["count"], d["kind"], str(d["tool"])))[:limit]


def _discarded(discards: Sequence[Discard], perturbation: str) -> dict[str, Any]:
    reasons = Counter(_reason_class(d.reason) for d in discards if d.perturbation == perturbation)
    return {"count": sum(reasons.values()),
            "reasons": [{"reason": r, "count": c} for r, c in sorted(reasons.items(), key=lambda kv: -kv[1])]}


def _reason_class(reason: str) -> str:
    # "embedding similarity 0.412 below 0.85" -> grouped without the score
    return reason.split(" 0.")[0].split(" -")[0] if reason.startswith("embedding similarity") else reason


def perturbation_summary(trials: Sequence[TrialRow], base: dict[tuple[str, str], Baseline],
                         discards: Sequence[Discard], perturbation: str) -> dict[str, Any]:
    ok = [t for t in trials if t.status == "ok"]
    conformant = sum(t.traj_status == "conformant" for t in ok)
    critical = sum(bool(t.critical_ok) for t in ok)
    divergences = _Divergences()
    same_path = with_base = same_args = agree = with_state = 0
    per_case: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for t in ok:
        counts = per_case[t.case_id]
        counts[0] += t.traj_status == "conformant"
        counts[1] += 1
        b = base.get((t.arm, t.case_id))
        if b is None or b.path is None:
            continue
        with_base += 1
        if _path(t) == b.path:
            same_path += 1
            if _akeys(t) == b.akeys:
                same_args += 1
            else:
                divergences.compare(t, b)
        else:
            divergences.compare(t, b)
        state = _state(t)
        if state is not None and b.state is not None:
            with_state += 1
            agree += state == b.state
    return {
        "trials": len(trials),
        "errors": len(trials) - len(ok),
        "discarded": _discarded(discards, perturbation),
        "conformance": rate(conformant, len(ok)).as_dict(),
        "critical_conformance": rate(critical, len(ok)).as_dict(),
        "consistency": {"structural": rate(same_path, with_base).as_dict(),
                        "argument": rate(same_args, same_path).as_dict()},
        "outcome_agreement": rate(agree, with_state).as_dict() if with_state else None,
        "pass_k": pass_hat_k_table((c, n) for c, n in per_case.values()),
        "divergences": divergences.top(),
    }


def certificate(perturbations: dict[str, dict[str, Any]], target: float) -> dict[str, Any]:
    """The minimum over perturbations of the Wilson lower bound of critical conformance: the
    true minimum of the bounds (a small n lowers a bound even at a perfect point estimate)."""
    bounds = [(p["critical_conformance"]["lo"], name) for name, p in perturbations.items()
              if p["critical_conformance"]["n"] > 0]
    if not bounds:
        return {"bound": None, "perturbation": None, "runs_needed": runs_needed(target), "target": target}
    bound, name = min(bounds)
    return {"bound": bound, "perturbation": name, "runs_needed": runs_needed(target), "target": target}


def trial_success(t: TrialRow, case_states: dict[str, str]) -> bool:
    """Parity's per-trial success: the end state equals the case's modal baseline state when
    the agent reports state, else critical conformance."""
    state = _state(t)
    expected = case_states.get(t.case_id)
    if state is not None and expected is not None:
        return state == expected
    return bool(t.critical_ok)


def _seed(*labels: object) -> int:
    return int.from_bytes(hashlib.sha256(json.dumps(labels).encode()).digest()[:8], "big")


def _p_value(successes_a: int, n_a: int, successes_b: int, n_b: int, seed: int) -> float | None:
    """The permutation test's p-value; None without numpy (the campaign extra), so that a base
    install still runs campaigns (the demo's) and shows them in the console."""
    try:
        from otel_plumb.stats.permutation import permutation_test
    except ModuleNotFoundError as e:
        if e.name != "numpy":
            raise
        return None
    return permutation_test(successes_a, n_a, successes_b, n_b, seed=seed).p_value


def parity(trials: Sequence[TrialRow], arm_a: str, arm_b: str, seed: int,
           perturbations: Sequence[str]) -> dict[str, Any]:
    """Pairs the two arms' trials on the same case, variant and repetition; compares outcome,
    effect path (tool steps only) and arguments; tests the success rates with a permutation
    test (seeded, 20,000 resamples, add-one smoothing)."""
    case_states = modal_states(trials)
    by_key: dict[str, dict[tuple[str, str, int], TrialRow]] = {arm_a: {}, arm_b: {}}
    for t in trials:
        if t.status == "ok" and t.arm in by_key:
            by_key[t.arm][(t.perturbation, t.variant_id, t.rep)] = t
    out: dict[str, Any] = {}
    for name in perturbations:
        a = [t for k, t in by_key[arm_a].items() if k[0] == name]
        b = [t for k, t in by_key[arm_b].items() if k[0] == name]
        pairs = [(t, by_key[arm_b][k]) for k, t in by_key[arm_a].items() if k[0] == name and k in by_key[arm_b]]
        outcome_n = sum(1 for x, y in pairs if _state(x) is not None and _state(y) is not None)
        outcome_same = sum(1 for x, y in pairs if _state(x) is not None and _state(x) == _state(y))
        path_same = [(x, y) for x, y in pairs if _path(x) == _path(y)]
        args_same = sum(1 for x, y in path_same if _akeys(x) == _akeys(y))
        sa = sum(trial_success(t, case_states) for t in a)
        sb = sum(trial_success(t, case_states) for t in b)
        entry: dict[str, Any] = {
            "pairs": len(pairs),
            "outcome": rate(outcome_same, outcome_n).as_dict() if outcome_n else None,
            "path": rate(len(path_same), len(pairs)).as_dict(),
            "argument": rate(args_same, len(path_same)).as_dict(),
            "success": {arm_a: rate(sa, len(a)).as_dict(), arm_b: rate(sb, len(b)).as_dict()},
            "difference": None,
            "p_value": None,
        }
        if a and b:
            entry["difference"] = sa / len(a) - sb / len(b)
            entry["p_value"] = _p_value(sa, len(a), sb, len(b), _seed(seed, "parity", arm_a, arm_b, name))
        out[name] = entry
    return {"arms": [arm_a, arm_b], "by_perturbation": out}


def analyse(trials: Sequence[TrialRow], discards: Sequence[Discard], arms: Sequence[str], seed: int,
            target: float | None) -> dict[str, Any]:
    """The campaign report's analyses (``arms`` and ``parity``)."""
    base = baselines(trials)
    grouped: dict[str, dict[str, list[TrialRow]]] = {arm: {} for arm in arms}
    for t in trials:
        grouped.setdefault(t.arm, {}).setdefault(t.perturbation, []).append(t)
    order = {name: i for i, name in enumerate(("baseline", "paraphrase", "distractor", "decoy_tools", "tool_fault",
                                               "sampling"))}
    report_arms: dict[str, Any] = {}
    for arm, by_pert in grouped.items():
        perts = {name: perturbation_summary(group, base, discards, name)
                 for name, group in sorted(by_pert.items(), key=lambda kv: order.get(kv[0], 99))}
        report_arms[arm] = {"perturbations": perts,
                            "certificate": certificate(perts, target if target is not None else DEFAULT_TARGET_BOUND)}
    names = sorted({t.perturbation for t in trials}, key=lambda n: order.get(n, 99))
    arm_list = list(grouped)
    pairs = [parity(trials, a, b, seed, names) for i, a in enumerate(arm_list) for b in arm_list[i + 1:]]
    return {"arms": report_arms, "parity": pairs}
