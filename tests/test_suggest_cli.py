"""``otel-plumb suggest`` end to end: traces written by the real OpenTelemetry SDK (the demo's
instrumented agent, through InMemorySpanExporter and the OTLP encoder), mined as a subprocess,
the policy validated by ``check-policy`` and run by ``replay --policy``; and the guide's commands."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_plumb.demo.agent import INVOICES, Invoice, run_invoice
from otel_plumb.receive.otlp_json import request_to_json

ROOT = Path(__file__).resolve().parent.parent
VENDORS = ("Acme Supplies", "Globex", "Initech", "Umbrella Ltd", "Hooli", "Stark Industries")


def write_traces(path: Path, invoices: list[Invoice]) -> None:
    """One OTLP/JSON line per trace, as the Collector's file exporter writes them."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "ap-service"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    with path.open("w") as f:
        for invoice in invoices:
            run_invoice(tracer, invoice)
            f.write(json.dumps(request_to_json(encode_spans(memory.get_finished_spans()))) + "\n")
            memory.clear()
    provider.shutdown()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_plumb", *args], capture_output=True, text=True, timeout=300)


def clean_invoices(n: int, seed: int = 5) -> list[Invoice]:
    rng = random.Random(seed)
    return [Invoice(f"INV-{2000 + i}", rng.choice(VENDORS), round(rng.uniform(100, 5000), 2), f"PO-{10 + i}")
            for i in range(n)]  # fmt: skip


def test_mined_policy_passes_the_good_traces_and_flags_the_planted_bad_ones(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write_traces(good, clean_invoices(40))
    write_traces(bad, [Invoice("INV-3001", "Globex", 980.5, "PO-91", fault="skip_duplicate_check"),
                       Invoice("INV-3002", "Initech", 615.2, "PO-92", fault="wrong_amount")])  # fmt: skip
    policy, out = tmp_path / "mined.yaml", tmp_path / "suggest.json"
    run = cli("suggest", str(good), str(bad), "--min-support", "0.95", "--policy-out", str(policy), "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert "invariants to review" in run.stdout
    assert cli("check-policy", str(policy)).returncode == 0

    report = json.loads(out.read_text())
    assert report["trajectories"] == 42
    ids = {c["id"] for g in report["groups"] for c in g["candidates"]}
    assert {"must-call-check_duplicate", "count-schedule_payment",
            "schedule_payment-amount_gbp-from-fetch_invoice-result-total",
            "schedule_payment-invoice_id-from-fetch_invoice-arg-invoice_id"} <= ids  # fmt: skip

    clean = cli("replay", str(good), "--policy", str(policy), "--json", str(tmp_path / "good.json"))
    assert clean.returncode == 0, clean.stdout
    assert json.loads((tmp_path / "good.json").read_text())["summary"]["violating"] == 0

    flagged = cli("replay", str(bad), "--policy", str(policy), "--json", str(tmp_path / "bad.json"))
    assert flagged.returncode == 1
    fails = {_invoice(t): {v["invariant"] for v in t["verdicts"] if v["verdict"] == "fail"}
             for t in json.loads((tmp_path / "bad.json").read_text())["trajectories"]}  # fmt: skip
    assert "must-call-check_duplicate" in fails["INV-3001"]
    assert "schedule_payment-amount_gbp-from-fetch_invoice-result-total" in fails["INV-3002"]


def _invoice(record: dict[str, Any]) -> str:
    """The invoice a reported trajectory processed (the mined policy names no task attribute)."""
    return next(str(s["args"]["invoice_id"]) for s in record["steps"] if s["name"] == "fetch_invoice")


def _kept_or_implied(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for g in report["groups"]:
        for c in g["candidates"] + g["implied"]:
            out[c["text"]] = c
    return out


def test_the_demo_policys_invariants_are_recovered_from_the_demos_traces(tmp_path: Path) -> None:
    """The demo agent is faulty in half its invoices on purpose (a skipped duplicate check, a
    double payment, a wrong amount), and one in six is a sanctioned vendor that is flagged, not
    paid: mined at 0.75, every invariant of the demo's policy is proposed, written or implied;
    what the sanctioned branch breaks is proposed guarded by the vendor check's answer, and the
    mined policy flags exactly the faulty runs."""
    traces = tmp_path / "demo.jsonl"
    write_traces(traces, list(INVOICES) * 5)
    out, policy = tmp_path / "s.json", tmp_path / "mined.yaml"
    run = cli("suggest", str(traces), "--min-support", "0.75", "--json", str(out), "--policy-out", str(policy))
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    found = _kept_or_implied(report)
    written = {c["text"] for g in report["groups"] for c in g["candidates"]}
    assert "must_call check_duplicate" in written  # dup-check
    for first in ("fetch_invoice", "match_purchase_order", "check_duplicate", "check_vendor_status"):
        assert f"precedes {first} -> schedule_payment" in found  # fetch/match/dup/vendor-before-pay
    assert "call_count schedule_payment at most 1" in written  # pay-once
    assert "arg_equals schedule_payment.amount_gbp = fetch_invoice result total" in written  # pay-as-invoiced
    assert "responds flag_exception -> post_audit_log" in found  # audit-after-flag
    budgets = {c["text"] for c in found.values() if c["kind"] == "budget"}
    assert "budget max_tool_errors 0" in budgets  # no-runaway (tighter than the policy's 3)
    steps = next(int(t.split()[-1]) for t in budgets if "max_steps" in t)
    assert steps <= 40

    replayed = cli("replay", str(traces), "--policy", str(policy), "--json", str(tmp_path / "r.json"))
    assert replayed.returncode == 1, replayed.stderr
    runs = json.loads((tmp_path / "r.json").read_text())["trajectories"]
    invoice_of = {t["trace_id"]: t["case_id"] for t in runs}
    faulty = {inv.invoice_id for inv in INVOICES if inv.fault}
    # Exactly the faulty runs are flagged; the sanctioned vendor's conform.
    assert {t["trace_id"] for t in runs if t["status"] == "violating"} == {
        tid for tid, inv in invoice_of.items() if inv in faulty}  # fmt: skip
    assert {t["trace_id"] for t in runs if t["status"] == "conformant"} == {
        tid for tid, inv in invoice_of.items() if inv not in faulty}  # fmt: skip

    # The sanctioned runs are no candidate's counter-examples; the payment rules are proposed
    # for either answer of the vendor check, and not without it.
    sanctioned = {tid for tid, inv in invoice_of.items() if inv == "INV-1005"}
    assert len(sanctioned) == 5
    for c in found.values():
        assert not set(c["counter_examples"]) & sanctioned, c["text"]
    said = 'check_vendor_status returned status "sanctioned"'
    assert f"must_call schedule_payment unless {said}" in written
    assert f"never_call schedule_payment if {said}" in written
    for text in ("must_call schedule_payment", "precedes schedule_payment -> post_audit_log",
                 "never_call flag_exception after fetch_invoice"):  # fmt: skip
        assert text not in found


def test_the_guide_runs_as_written(tmp_path: Path) -> None:
    """Every fenced ``sh`` block of docs/suggest.md, in order, in one shell with -e."""
    text = (ROOT / "docs" / "suggest.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    assert blocks
    script = "set -euo pipefail\n" + "\n".join(blocks)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # The guide says otel-plumb; run this checkout's.
    (bin_dir / "otel-plumb").write_text(f"#!/bin/sh\nexec {sys.executable} -m otel_plumb \"$@\"\n")
    (bin_dir / "otel-plumb").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    run = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (tmp_path / "suggested.yaml").exists() and (tmp_path / "report.json").exists()


def test_nothing_proposed_is_a_run_that_could_not_be_done_and_bad_flags_are_refused(tmp_path: Path) -> None:
    one = ROOT / "tests" / "fixtures" / "ap" / "clean.jsonl"
    run = cli("suggest", str(one), "--policy-out", str(tmp_path / "p.yaml"))
    assert run.returncode == 2 and "nothing written" in run.stderr
    assert not (tmp_path / "p.yaml").exists()
    assert cli("suggest", str(one), "--group-by", "colour").returncode == 2
    assert cli("suggest", str(tmp_path / "missing.jsonl")).returncode == 2


def test_traces_with_no_agent_span_are_left_out_of_mining(tmp_path: Path) -> None:
    """A plain HTTP service's trace (captured from the httpx instrumentation) is no agent's run:
    no policy would apply to it, so it neither supports nor breaks a candidate."""
    good = tmp_path / "good.jsonl"
    write_traces(good, clean_invoices(10))
    http = Path(__file__).parent / "fixtures" / "conventions" / "httpx_service.jsonl"
    out = tmp_path / "suggest.json"
    run = cli("suggest", str(good), str(http), "--min-support", "0.95", "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert "1 with no agent span" in run.stdout
    report = json.loads(out.read_text())
    assert (report["trajectories"], report["not_agent"]) == (11, 1)
    (must_call,) = [c for g in report["groups"] for c in g["candidates"] if c["id"] == "must-call-check_duplicate"]
    assert (must_call["held"], must_call["applied"]) == (10, 10)
