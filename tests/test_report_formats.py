"""HTML and JUnit reports rendered from the report dict."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from test_check_support import policy, step, trajectory

from otel_plumb.check import decide
from otel_plumb.report import html, junit
from otel_plumb.report.json_report import build_report, report_body

POLICY = """
policy: ap
invariants:
  - {id: dup-check, severity: critical, must_call: check_duplicate}
  - {id: pay-amount, severity: critical, arg_equals: {tool: pay, arg: amount, value: 4820}}
  - {id: other-only, must_call: x, applies_to: {agent: "other-*"}}
"""


def _report(tmp_path):
    p = policy(tmp_path, POLICY)
    evil = "<script>alert('x')</script>"
    wrong = trajectory("fetch", step(evil, args={"note": evil}), "check_duplicate", step("pay", args={"amount": 48200}))
    missing = trajectory("fetch", step("pay", args={"amount": 4820}))
    unknown = trajectory("check_duplicate", step("pay", args_status="redacted"))
    clean = trajectory("check_duplicate", step("pay", args={"amount": "4,820.00"}))
    for i, t in enumerate((wrong, missing, unknown, clean)):
        t.trace_ids = [f"{i + 1:032x}"]
    decided = [decide([p], t) for t in (wrong, missing, unknown, clean)]
    return build_report(report_body([p], decided), {"notes": ["note <b>"]}, [])


def test_html_marks_the_offending_step_and_escapes_everything(tmp_path):
    page = html.render(_report(tmp_path))
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "note &lt;b&gt;" in page
    # the wrong payment is step 3 of the first trajectory: its row is marked with the invariant
    row = re.search(r'<tr class="offending[^"]*">\s*<td class="num mono">3</td>(.*?)</tr>', page, re.S)
    assert row is not None and "◀ pay-amount" in row.group(1) and "48200" in row.group(1)
    # a missing call is localised to the whole trajectory
    assert "✗ missing: a successful call of check_duplicate" in page
    assert "Wilson 95% interval" in page and "indeterminate, not counted" in page
    assert "http://" not in page and "https://" not in page and "<link" not in page  # self-contained


def test_junit_one_case_per_trajectory_and_invariant(tmp_path):
    root = ET.fromstring(junit.render(_report(tmp_path)))
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 4 * 3
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("12", "2", "1")
    assert suite.get("skipped") == "4"
    failures = [c for c in cases if c.find("failure") is not None]
    assert {c.get("classname") for c in failures} == {"ap.pay-amount", "ap.dup-check"}
    amount = next(c for c in failures if c.get("classname") == "ap.pay-amount").find("failure")
    assert "48200" in amount.text and "step 3" in amount.text and amount.get("type") == "critical"
