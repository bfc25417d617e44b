"""``otel-plumb gate`` and ``otel-plumb check-policy`` exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_check_support import policy, trajectory

from otel_plumb.check import decide
from otel_plumb.cli.main import cli
from otel_plumb.report.json_report import build_report, report_body

POLICY = """
policy: ap
invariants:
  - {id: dup, severity: critical, must_call: check_duplicate}
  - {id: audit, severity: low, must_call: post_audit_log}
"""


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def report_path(tmp_path):
    """73 clean trajectories, plus one missing only its (low severity) audit log."""
    p = policy(tmp_path, POLICY)
    trajectories = [trajectory("check_duplicate", "post_audit_log") for _ in range(73)]
    trajectories.append(trajectory("check_duplicate"))
    path = tmp_path / "report.json"
    path.write_text(json.dumps(build_report(report_body([p], [decide([p], t) for t in trajectories]))))
    return str(path)


def test_gate_on_bound_and_violations_by_severity(report_path):
    # critical: 74/74 conformant, lower bound ~0.951
    assert run("gate", report_path, "--min-bound", "0.95", "--severity", "critical").exit_code == 0
    result = run("gate", report_path, "--min-bound", "0.96", "--severity", "critical")
    assert result.exit_code == 1 and "lower bound" in result.output
    # all severities: 73/74 conformant, one low violation
    assert run("gate", report_path, "--min-bound", "0.95").exit_code == 1
    assert run("gate", report_path, "--max-violations", "1").exit_code == 0
    assert run("gate", report_path, "--max-violations", "0").exit_code == 1
    assert run("gate", report_path, "--max-violations", "0", "--severity", "high").exit_code == 0
    assert run("gate", report_path).exit_code == 1  # no criteria: any violation fails


def write_report(tmp_path, report, name="r.json"):
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return str(path)


def replay_report(records, policies=("ap",)):
    """A replay report as the gate reads it: the named policies and the trajectory records."""
    return {"report_version": "1", "policies": [{"name": n, "invariants": []} for n in policies],
            "trajectories": list(records)}  # fmt: skip


def record(status="conformant", policies=("ap",), fails=0):
    verdicts = [{"invariant": "dup", "policy": "ap", "verdict": "pass", "severity": "critical"}] if policies else []
    verdicts += [{"invariant": "audit", "policy": "ap", "verdict": "fail", "severity": "low"}] * fails
    return {"status": status, "complete": True, "policies": list(policies), "verdicts": verdicts}


def test_gate_fails_a_report_in_which_nothing_was_checked(tmp_path):
    # replayed without --policy: every trajectory unchecked, no policy named
    unchecked = write_report(tmp_path, replay_report([record("unchecked", ())] * 3, policies=()))
    result = run("gate", unchecked)
    assert result.exit_code == 1 and "gate passed" not in result.output
    assert "gate failed: the report names no policy: nothing was checked" in result.output
    assert run("gate", unchecked, "--max-violations", "5").exit_code == 1  # whatever the bounds
    allowed = run("gate", unchecked, "--allow-empty")
    assert allowed.exit_code == 0 and "note: the report names no policy" in allowed.output
    assert "gate passed" in allowed.output
    # a policy named, but no trajectory at all
    empty = write_report(tmp_path, replay_report([]), "empty.json")
    result = run("gate", empty)
    assert result.exit_code == 1 and "gate failed: the report has no trajectories: nothing was checked" \
        in result.output  # fmt: skip
    assert run("gate", empty, "--allow-empty").exit_code == 0
    # a policy named, but it applied to none of the trajectories
    none_applied = write_report(tmp_path, replay_report([record("unchecked", ())] * 2), "none.json")
    result = run("gate", none_applied)
    assert result.exit_code == 1 and "none of the 2 trajectories was checked against a policy" in result.output


def test_gate_treats_a_trajectory_marked_unchecked_as_not_checked(tmp_path):
    # a record may name its policies yet say it was not checked: it is not
    marked = write_report(tmp_path, replay_report([record("unchecked")] * 2))
    result = run("gate", marked)
    assert result.exit_code == 1 and "none of the 2 trajectories was checked against a policy" in result.output
    # one checked trajectory is enough, and the unchecked ones stay out of the conformance
    some = write_report(tmp_path, replay_report([record("unchecked"), record(), record("unchecked")]), "some.json")
    result = run("gate", some, "--min-bound", "0.01")
    assert result.exit_code == 0 and "1/1 = 100.0%" in result.output


def test_gate_with_allow_empty_still_applies_the_bounds(tmp_path):
    checked = write_report(tmp_path, replay_report([record(), record("violating", fails=1)]))
    assert run("gate", checked, "--allow-empty").exit_code == 1  # a violation, as without the flag
    assert run("gate", checked, "--allow-empty", "--max-violations", "1").exit_code == 0
    empty = write_report(tmp_path, replay_report([]), "empty.json")
    result = run("gate", empty, "--allow-empty", "--min-bound", "0.5")  # no decided trajectory: bound 0
    assert result.exit_code == 1 and "lower bound" in result.output


def test_gate_fails_a_campaign_report_without_checked_trials(tmp_path):
    base = {"campaign_report_version": "1", "gates": {"min_certified_bound": None, "max_violations": None}}
    no_trials = write_report(tmp_path, {**base, "arms": {"a": {"perturbations": {}, "certificate": {}}}, "trials": []})
    result = run("gate", no_trials)
    assert result.exit_code == 1 and "gate failed: the report has no trials: nothing was checked" in result.output
    assert run("gate", no_trials, "--allow-empty").exit_code == 0
    trials = [{"trial_id": "1", "arm": "a", "status": "error", "violations": []},
              {"trial_id": "2", "arm": "a", "status": "unchecked", "violations": []}]  # fmt: skip
    unchecked = write_report(tmp_path, {**base, "arms": {}, "trials": trials}, "unchecked.json")
    result = run("gate", unchecked)
    assert result.exit_code == 1 and "none of the 2 trials has a trajectory checked against a policy" in result.output
    checked = [*trials, {"trial_id": "3", "arm": "a", "status": "conformant", "violations": []}]
    assert run("gate", write_report(tmp_path, {**base, "arms": {}, "trials": checked}, "ok.json")).exit_code == 0


def test_gate_unreadable_or_invalid_report_exits_2(tmp_path):
    assert run("gate", str(tmp_path / "missing.json")).exit_code == 2
    bad = tmp_path / "bad.json"
    for text in ("{not json", "[1, 2]", '{"hello": 1}', '{"report_version": "9", "trajectories": []}',
                 '{"report_version": "1", "trajectories": [{"verdicts": [1]}]}'):  # fmt: skip
        bad.write_text(text)
        assert run("gate", str(bad)).exit_code == 2, text
    assert run("gate", str(bad), "--min-bound", "2").exit_code == 2


def test_check_policy(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(POLICY)
    result = run("check-policy", str(good))
    assert result.exit_code == 0 and "ok" in result.output and "2 invariants" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: b\ninvariants:\n  - {id: a, must_call: x}\n  - {id: b, must_call: x, nope: 1}\n")
    result = CliRunner().invoke(cli, ["check-policy", str(good), str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:4: unknown key 'nope'" in result.output
    twin = tmp_path / "twin.yaml"
    twin.write_text(POLICY)
    assert "also used by" in CliRunner().invoke(cli, ["check-policy", str(good), str(twin)]).output
