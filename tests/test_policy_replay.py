"""``otel-plumb replay --policy`` end to end on the captured AP traces: verdicts, the three
reports, exit codes, and the gate reading what replay wrote."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from click.testing import CliRunner

from otel_plumb.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
AP = ROOT / "tests" / "fixtures" / "ap"
POLICY = str(ROOT / "configs" / "policies" / "ap.yaml")


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_replay_with_policy_writes_reports_and_fails_on_violations(tmp_path):
    out = {k: str(tmp_path / f"r.{k}") for k in ("json", "html", "xml")}
    files = sorted(str(p) for p in AP.glob("*.jsonl"))
    result = run("replay", *files, "--policy", POLICY, "--json", out["json"], "--html", out["html"],
                 "--junit", out["xml"])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "critical conformance" in result.output and "FAIL" in result.output
    report = json.loads(Path(out["json"]).read_text())
    assert report["summary"] == {"trajectories": 9, "conformant": 2, "violating": 6, "indeterminate": 1,
                                 "unchecked": 0, "violations": 8}  # fmt: skip
    assert report["conformance"]["overall"]["n"] == 8 and report["by_invariant"]["pay-once"]["fail"] == 1
    assert report["coverage"] and report["errors"] == []
    assert 'class="offending' in Path(out["html"]).read_text()
    assert ET.parse(out["xml"]).getroot().get("failures") == "8"
    # the gate reads what replay wrote
    assert run("gate", out["json"], "--max-violations", "8").exit_code == 0
    assert run("gate", out["json"], "--severity", "critical", "--min-bound", "0.5").exit_code == 1


def test_replay_clean_run_passes_and_bad_policy_stops_before_reading(tmp_path):
    assert run("replay", str(AP / "clean.jsonl"), "--policy", POLICY).exit_code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: b\ninvariants:\n  - {id: a, must_call: x, colour: red}\n")
    result = run("replay", str(AP / "clean.jsonl"), "--policy", str(bad))
    assert result.exit_code == 2 and f"{bad}:3: unknown key 'colour'" in result.output
