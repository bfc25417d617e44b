"""The Prometheus rules: promtool validates them and runs their unit tests; the Wilson bounds
computed in PromQL agree with otel_plumb.stats.wilson_interval."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from otel_plumb.stats import wilson_interval

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "configs" / "prometheus" / "rules.yaml"
ALERT_TESTS = ROOT / "configs" / "prometheus" / "tests" / "alerts_test.yaml"
PROMTOOL = shutil.which("promtool") or "promtool"  # installed by .ci/install.d/10-prometheus.sh

# (successes, n): the edges, small samples where the interval is wide, and large ones.
CASES = [(0, 1), (1, 1), (2, 3), (0, 10), (9, 10), (10, 10), (57, 60), (90, 100), (999, 1000)]
CASES += [(s, n) for n in random.Random(7).sample(range(2, 5000), 6) for s in (random.Random(n).randrange(n + 1),)]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


def test_rules_are_valid() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alert_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def _wilson_test_file(
    tmp_path: Path, cases: list[tuple[int, int]], expected: dict[tuple[int, int], tuple[float, float]]
) -> Path:
    """A promtool unit test: each case's counts arrive in one jump, so both windows hold
    exactly ``successes`` conformant and ``n - successes`` violating trajectories."""
    series = []
    checks = []
    for i, (successes, n) in enumerate(cases):
        labels = f'policy="case{i}",agent="a"'
        series += [
            {"series": f'plumb_trajectories_total{{{labels},status="conformant"}}', "values": f"0 {successes}x70"},
            {"series": f'plumb_trajectories_total{{{labels},status="violating"}}', "values": f"0 {n - successes}x70"},
            # Indeterminate trajectories must not move the interval.
            {"series": f'plumb_trajectories_total{{{labels},status="indeterminate"}}', "values": f"0 {n}x70"},
        ]
        lo, hi = expected[(successes, n)]
        for window, eval_time in (("5m", "5m"), ("1h", "60m")):
            for bound, value in (("lower", lo), ("upper", hi)):
                metric = f"policy_agent:plumb_conformance:wilson_{bound}{window}"
                checks.append(
                    {
                        "expr": f'abs({metric}{{policy="case{i}"}} - {value!r}) < bool 1e-12',
                        "eval_time": eval_time,
                        "exp_samples": [{"labels": f"{{{labels}}}", "value": 1}],
                    }
                )
    # Only indeterminate trajectories: nothing is known, so no bound at all.
    series.append(
        {"series": 'plumb_trajectories_total{policy="none",agent="a",status="indeterminate"}', "values": "0 5x70"}
    )
    checks.append(
        {"expr": 'policy_agent:plumb_conformance:wilson_lower1h{policy="none"}', "eval_time": "60m", "exp_samples": []}
    )
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}],
    }
    path = tmp_path / "wilson_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return path


def test_wilson_bounds_match_python(tmp_path: Path) -> None:
    expected = {case: wilson_interval(*case) for case in CASES}
    result = promtool("test", "rules", str(_wilson_test_file(tmp_path, CASES, expected)))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("nudge", [1e-9, -1e-9])
def test_wilson_check_catches_a_wrong_bound(tmp_path: Path, nudge: float) -> None:
    case = (9, 10)
    lo, hi = wilson_interval(*case)
    result = promtool("test", "rules", str(_wilson_test_file(tmp_path, [case], {case: (lo + nudge, hi)})))
    assert result.returncode != 0
    assert "wilson_lower" in result.stdout + result.stderr
