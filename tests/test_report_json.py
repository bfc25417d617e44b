"""The JSON report: fields, conformance with Wilson bounds, counts per invariant."""

from __future__ import annotations

import json

import pytest
from test_check_support import policy, step, trajectory

from otel_plumb.check import decide
from otel_plumb.report.json_report import build_report, conformance, report_body
from otel_plumb.stats import rate

POLICY = """
policy: ap
applies_to: {service: ap-*}
invariants:
  - {id: dup, severity: critical, must_call: check_duplicate}
  - {id: pay-once, severity: medium, call_count: {tool: pay, max: 1}}
  - {id: amount, arg_equals: {tool: pay, arg: amount, value: 10}}
"""


def test_wilson_known_values():
    r = rate(73, 73)
    assert 0.95 < r.lo < 0.951 and r.hi == 1.0 and r.rate == 1.0
    r = rate(0, 10)
    assert r.lo == 0.0 and r.hi == pytest.approx(0.2775, abs=1e-4)
    r = rate(81, 100)
    assert (round(r.lo, 4), round(r.hi, 4)) == (0.7222, 0.8749)
    assert rate(0, 0).rate is None and (rate(0, 0).lo, rate(0, 0).hi) == (0.0, 1.0)


def test_report_fields_and_conformance(tmp_path):
    p = policy(tmp_path, POLICY)
    clean = trajectory("check_duplicate", step("pay", args={"amount": 10}))
    twice = trajectory("check_duplicate", step("pay", args={"amount": 10}), step("pay", args={"amount": 10}))
    no_dup = trajectory(step("pay", args={"amount": 10}))
    unknown = trajectory("check_duplicate", step("pay", args_status="redacted"))
    cut = trajectory("check_duplicate", complete=False)
    elsewhere = trajectory("x", service="other")
    other = policy(tmp_path, "policy: other\napplies_to: {service: other}\ninvariants:\n  - {id: dup, must_call: x}\n",
                   "o.yaml")  # fmt: skip
    body = report_body([p, other], [decide([p, other], t) for t in (clean, twice, no_dup, unknown, cut, elsewhere)])
    report = json.loads(json.dumps(build_report(body, {"tool_calls": {}}, [{"file": "f", "line": 3}])))

    assert report["report_version"] == "1" and report["errors"] == [{"file": "f", "line": 3}]
    assert [t["status"] for t in report["trajectories"]] == [
        "conformant", "violating", "violating", "indeterminate", "indeterminate", "conformant",
    ]  # fmt: skip
    first = report["trajectories"][1]
    assert {"trace_id", "key", "agent", "status", "complete", "steps", "verdicts"} <= set(first)
    assert {"index", "kind", "name", "span_id", "args", "result", "error", "source"} <= set(first["steps"][0])
    fail = next(v for v in first["verdicts"] if v["verdict"] == "fail")
    assert fail == {**fail, "invariant": "pay-once", "policy": "ap", "severity": "medium", "step_index": 2,
                    "span_id": first["steps"][2]["span_id"], "expected": "at most 1", "got": 2}  # fmt: skip
    # overall: 2 conformant (clean, elsewhere) of 4 decided; 2 indeterminate are not trials
    overall = report["conformance"]["overall"]
    assert (overall["successes"], overall["n"], overall["indeterminate"]) == (2, 4, 2)
    lo, hi = rate(2, 4).lo, rate(2, 4).hi
    assert (overall["lo"], overall["hi"]) == (lo, hi)
    # critical: only no_dup violates a critical invariant; the medium double payment is conformant here
    critical = report["conformance"]["critical"]
    assert (critical["successes"], critical["n"], critical["indeterminate"]) == (4, 5, 1)
    assert report["by_invariant"]["ap/dup"] == {"policy": "ap", "severity": "critical", "pass": 3, "fail": 1,
                                                "not_applicable": 0, "indeterminate": 1}  # fmt: skip
    assert report["by_invariant"]["other/dup"]["pass"] == 1
    assert report["by_invariant"]["amount"]["indeterminate"] == 2  # redacted arguments; no call yet in the cut one
    assert report["summary"]["violations"] == 2 and report["summary"]["unchecked"] == 0


def test_unchecked_trajectories_are_left_out_of_conformance(tmp_path):
    p = policy(tmp_path, "policy: p\napplies_to: {agent: refund-*}\ninvariants:\n  - {id: a, must_call: x}\n")
    body = report_body([p], [decide([p], trajectory("y"))])
    assert body["summary"]["unchecked"] == 1
    assert conformance(body["trajectories"])["n"] == 0
