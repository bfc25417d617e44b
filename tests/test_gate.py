"""``otel-plumb gate`` and ``otel-plumb check-policy`` exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_check_support import policy, trajectory

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
    path.write_text(json.dumps(build_report(report_body([p], trajectories))))
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
