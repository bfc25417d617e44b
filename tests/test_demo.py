"""``otel-plumb demo``: live verdicts for the bundled agent, a report, then a campaign of the
agent's faulty build against a fixed one in the same store, exit 0; on a base install (the
``campaign`` extra hidden from the process, as if not installed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from otel_plumb.campaign.reports import build_report
from otel_plumb.campaign.store import Store
from otel_plumb.cli.campaign import _EXTRA_MODULES
from otel_plumb.demo.agent import INVOICES
from otel_plumb.demo.run import NO_P_VALUE

BASE_INSTALL = "import sys\nfor m in {!r}: sys.modules[m] = None\nsys.argv[0] = 'otel-plumb'\n" \
               "from otel_plumb.cli.main import main\nmain()"  # fmt: skip


def test_demo_prints_live_verdicts_writes_a_report_and_runs_a_campaign(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    result = subprocess.run([sys.executable, "-c", BASE_INSTALL.format(_EXTRA_MODULES), "demo", "--out",
                             str(out_dir)], capture_output=True, text=True, timeout=180)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
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
    report = json.loads((out_dir / "report.json").read_text())
    assert report["report_version"] == "1"
    assert sorted(t["status"] for t in report["trajectories"]) == ["conformant"] * 3 + ["violating"] * 3
    assert report["by_invariant"]["pay-once"]["fail"] == 1
    assert "INV-1003" in (out_dir / "report.html").read_text()
    log = (out_dir / "verdicts.jsonl").read_text().splitlines()
    assert len(log) == 6
    assert sorted(json.loads(line)["key"] for line in log) == [f"INV-100{i}" for i in range(1, 7)]
    assert {t["key"] for t in report["trajectories"]} == {f"INV-100{i}" for i in range(1, 7)}

    store = Store(out_dir / "store.sqlite")
    try:
        run = store.run("latest")
        campaign = build_report(store, run)
    finally:
        store.close()
    assert f"campaign: http://127.0.0.1:8080/campaigns/{run.run_id}" in out
    assert campaign["campaign"] == "demo-ap" and campaign["run_status"] == "complete"
    # Each invoice once per arm as it comes and once with check_duplicate failing.
    trials = campaign["trials"]
    assert len(trials) == len(INVOICES) * 2 * 2 and all(t["trace_id"] and not t["error"] for t in trials)
    faulty, fixed = campaign["arms"]["faulty"]["perturbations"], campaign["arms"]["fixed"]["perturbations"]
    deliberate = sum(1 for i in INVOICES if i.fault)
    assert faulty["baseline"]["critical_conformance"]["successes"] == len(INVOICES) - deliberate
    # The faulty build carries on past the failed duplicate check and pays unchecked; the fixed one retries.
    assert faulty["tool_fault"]["critical_conformance"]["successes"] == 0
    assert {p["critical_conformance"]["successes"] for p in fixed.values()} == {len(INVOICES)}
    assert any(d["kind"] == "skipped" and d["tool"] == "check_duplicate" for d in faulty["tool_fault"]["divergences"])
    (parity,) = campaign["parity"]
    assert parity["by_perturbation"]["tool_fault"]["path"]["successes"] == 0
    # 0 of 6 against 6 of 6: the permutation test (here, with numpy) tells them apart; the demo,
    # without numpy, prints the rest of parity and says why there is no p-value.
    assert parity["by_perturbation"]["tool_fault"]["p_value"] < 0.05
    assert NO_P_VALUE in out
