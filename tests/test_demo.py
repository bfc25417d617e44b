"""``otel-plumb demo``: live verdicts for the bundled agent, a report, exit 0."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from otel_plumb.cli.main import cli


def test_demo_prints_live_verdicts_and_writes_a_report(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "metrics   http://127.0.0.1:" in out
    # Every line names the invoice (the policy's task key) and the trace beside it.
    assert re.search(r"EARLY INV-1003 \(trace [0-9a-f]{8}\)  pay-once \(critical\)", out), out
    for case in ("INV-1002", "INV-1003", "INV-1004"):
        assert re.search(rf"FAIL  {case} \(trace [0-9a-f]{{8}}\)  violating", out), out
    for case in ("INV-1001", "INV-1005", "INV-1006"):
        assert re.search(rf"PASS  {case} \(trace [0-9a-f]{{8}}\)  conformant", out), out
    (delivered,) = [line for line in out.splitlines() if line.startswith("decided ")]
    assert "3 root spans marked plumb.verdict=violating" in delivered, delivered
    assert 'plumb_violations_total{invariant="pay-once",policy="ap-controls",severity="critical"} 1.0' in out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["report_version"] == "1"
    assert sorted(t["status"] for t in report["trajectories"]) == ["conformant"] * 3 + ["violating"] * 3
    assert report["by_invariant"]["pay-once"]["fail"] == 1
    assert "INV-1003" in (tmp_path / "out" / "report.html").read_text()
    log = (tmp_path / "out" / "verdicts.jsonl").read_text().splitlines()
    assert len(log) == 6
    assert sorted(json.loads(line)["key"] for line in log) == [f"INV-100{i}" for i in range(1, 7)]
    assert {t["key"] for t in report["trajectories"]} == {f"INV-100{i}" for i in range(1, 7)}
