"""``replay`` and ``coverage`` in pipelines, as a user types them: standard input as ``-``, and
a reader that goes away early (``| head -1``), which is not a verdict. Real subprocesses."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AP = ROOT / "tests" / "fixtures" / "ap"
POLICY = ROOT / "configs" / "policies" / "ap.yaml"
CLI = [sys.executable, "-m", "otel_plumb"]


def with_closed_stdout(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run with standard output a pipe nobody reads any more: every write to it fails (EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(CLI + args, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)


def test_a_closed_stdout_is_not_a_verdict():
    clean = with_closed_stdout(["replay", str(AP / "clean.jsonl")])
    assert (clean.returncode, clean.stderr) == (0, "")
    whole_report = with_closed_stdout(["replay", *map(str, sorted(AP.glob("*.jsonl"))), "--json", "-"])
    assert (whole_report.returncode, whole_report.stderr) == (0, "")
    coverage = with_closed_stdout(["coverage", str(AP / "clean.jsonl")])
    assert (coverage.returncode, coverage.stderr) == (0, "")
    # The exit code is still the check's: a violation is 1 whether or not anyone read the summary.
    violating = with_closed_stdout(["replay", str(AP / "double_payment.jsonl"), "--policy", str(POLICY)])
    assert violating.returncode == 1 and "Traceback" not in violating.stderr


def test_head_of_a_pipeline_exits_zero():
    shell = (f"set -o pipefail; {' '.join(CLI)} replay {AP}/*.jsonl --json - | head -1")
    res = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout == "{\n" and "Traceback" not in res.stderr


def report_of(args: list[str], tmp_path: Path, name: str, stdin: bytes | None = None) -> tuple[int, dict]:
    out = tmp_path / name
    res = subprocess.run([*CLI, *args, "--json", str(out)], input=stdin, capture_output=True, timeout=120)
    return res.returncode, json.loads(out.read_text())


def test_replay_and_coverage_read_standard_input_as_they_read_files(tmp_path):
    trace = AP / "double_payment.jsonl"
    code, from_file = report_of(["replay", str(trace), "--policy", str(POLICY)], tmp_path, "file.json")
    for data in (trace.read_bytes(), gzip.compress(trace.read_bytes())):  # detected by content, as from files
        stdin_code, from_stdin = report_of(["replay", "-", "--policy", str(POLICY)], tmp_path, "stdin.json", data)
        assert stdin_code == code == 1
        assert from_stdin["summary"] == from_file["summary"] and from_stdin["summary"]["violating"] == 1
        assert from_stdin["trajectories"] == from_file["trajectories"]
    code, cov_file = report_of(["coverage", str(trace)], tmp_path, "cov_file.json")
    stdin_code, cov_stdin = report_of(["coverage", "-"], tmp_path, "cov_stdin.json", trace.read_bytes())
    assert stdin_code == code == 0 and cov_stdin["coverage"] == cov_file["coverage"]
    # Standard input with other files, in order.
    code, mixed = report_of(["replay", str(AP / "clean.jsonl"), "-"], tmp_path, "mixed.json", trace.read_bytes())
    assert code == 0 and len(mixed["trajectories"]) == 2 and [i["spans"] > 0 for i in mixed["inputs"]] == [True, True]


def test_standard_input_mistakes_are_run_errors(tmp_path):
    twice = subprocess.run([*CLI, "replay", "-", "-"], input=b"", capture_output=True, timeout=60)
    assert twice.returncode == 2 and b"read once" in twice.stderr
    empty = subprocess.run([*CLI, "coverage", "-"], input=b"", capture_output=True, timeout=60)
    assert empty.returncode == 2 and b"no spans" in empty.stderr
    # A terminal on standard input is a forgotten pipe: said at once instead of waiting for input.
    primary, secondary = os.openpty()
    try:
        tty = subprocess.run([*CLI, "replay", "-"], stdin=secondary, capture_output=True, timeout=60)
    finally:
        os.close(primary)
        os.close(secondary)
    assert tty.returncode == 2 and b"terminal" in tty.stderr
