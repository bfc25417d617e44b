"""Campaigns against real local agents: Python callables, HTTP, a command; trace collection
through the embedded processor, the Watch stream and trace files; resume, cache, CLI."""

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner

from otel_plumb.campaign.config import load_campaign
from otel_plumb.campaign.engine import CampaignRun, plan
from otel_plumb.campaign.reports import build_report, divergence_views, render_html, write_junit
from otel_plumb.campaign.runners import AgentError, HttpRunner, TraceContext
from otel_plumb.campaign.store import Store
from otel_plumb.cli.main import cli

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "accounts_payable"
CASES = [json.loads(line) for line in (EXAMPLE / "cases.jsonl").read_text().splitlines()]

COUNTING_AGENT = '''
import json, pathlib
import AGENT_MODULE as agent

def _count(request):
    with open(pathlib.Path(__file__).with_name("calls.log"), "a") as f:
        f.write(request["trial_id"] + "\\n")

def run_naive(request):
    _count(request)
    return agent.run_naive(request)

def run_retry(request):
    _count(request)
    return agent.run_retry(request)

def silent(request):
    _count(request)
    return {"output": "done, but no spans", "state": None}
'''


def setup_campaign(tmp_path: Path, arms: str, perturbations: str, cases: int = 2, extra: str = "",
                   traces: str = "{receiver: embedded, deadline_s: 20}") -> Path:
    shutil.copy(EXAMPLE / "agent.py", tmp_path / "agent.py")
    shutil.copy(EXAMPLE / "ap.yaml", tmp_path / "ap.yaml")
    # Module names of their own per test: Python callables are imported once per process.
    counting = counting_module(tmp_path)
    shutil.copy(EXAMPLE / "agent.py", tmp_path / f"ap_{counting}.py")
    (tmp_path / f"{counting}.py").write_text(COUNTING_AGENT.replace("AGENT_MODULE", f"ap_{counting}"))
    arms = arms.replace("counting:", f"{counting}:")
    (tmp_path / "cases.jsonl").write_text("\n".join(json.dumps(c) for c in CASES[:cases]) + "\n")
    path = tmp_path / "campaign.yaml"
    path.write_text(f"campaign: ap-test\nseed: 42\ndataset: cases.jsonl\npolicies: [ap.yaml]\narms:\n{arms}"
                    f"traces: {traces}\nperturbations:\n{perturbations}limits: {{concurrency: 4}}\n{extra}")
    return path


PY_ARMS = ("  naive: {python: {callable: 'counting:run_naive'}}\n"
           "  retry: {python: {callable: 'counting:run_retry'}}\n")
FAULTS = ("  baseline: {repeats: 2}\n"
          "  tool_fault: {targets: [match_purchase_order], errors: ['503 upstream temporarily unavailable'],"
          " samples: 2}\n")


def counting_module(tmp_path: Path) -> str:
    return "counting_" + "".join(c if c.isalnum() else "_" for c in tmp_path.name)


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().split() if log.exists() else []


@contextlib.asynccontextmanager
async def agent_server(handler) -> AsyncIterator[int]:
    """An HTTP agent on a free 127.0.0.1 port serving POST /run; yields the port, stops it after."""
    app = web.Application()
    app.router.add_post("/run", handler)
    server = web.AppRunner(app, access_log=None)
    await server.setup()
    site = web.TCPSite(server, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]
    finally:
        await server.cleanup()


async def run_once(path: Path, store: Store, **kw) -> dict:
    runner = CampaignRun(load_campaign(path), store, **kw)
    run_id = runner.start()
    await runner.execute(run_id)
    return build_report(store, store.run(run_id))


async def test_python_arms_with_tool_faults_end_to_end(tmp_path):
    path = setup_campaign(tmp_path, PY_ARMS, FAULTS, cases=3)
    store = Store(tmp_path / "runs.db")
    report = await run_once(path, store)
    assert report["campaign_report_version"] == "1"
    naive = report["arms"]["naive"]["perturbations"]
    retry = report["arms"]["retry"]["perturbations"]
    assert set(naive) == {"baseline", "tool_fault"}
    assert naive["baseline"]["critical_conformance"]["rate"] == 1.0
    # Without retries a transient 503 holds a clean invoice; with them it is paid.
    assert naive["tool_fault"]["critical_conformance"]["rate"] == 0.0
    assert retry["tool_fault"]["critical_conformance"]["rate"] == 1.0
    assert retry["tool_fault"]["consistency"]["structural"]["rate"] == 1.0
    assert naive["tool_fault"]["outcome_agreement"]["rate"] == 0.0
    kinds = {(d["kind"], d["tool"]) for d in naive["tool_fault"]["divergences"]}
    assert ("skipped", "schedule_payment") in kinds or ("substitute", "flag_exception") in kinds
    assert report["arms"]["naive"]["certificate"]["perturbation"] == "tool_fault"
    assert report["arms"]["naive"]["certificate"]["bound"] == 0.0
    (pair,) = report["parity"]
    assert pair["by_perturbation"]["tool_fault"]["p_value"] < 0.05
    assert pair["by_perturbation"]["baseline"]["p_value"] == 1.0
    assert len(report["trials"]) == 2 * 3 * 4 and all(t["trace_id"] and not t["error"] for t in report["trials"])
    assert set(report["trials"][0]) >= {"trial_id", "arm", "case_id", "variant_id", "perturbation", "trace_id",
                                        "status", "error"}
    # Stored trajectories carry the trial's identity (copied from baggage onto the spans).
    some = report["trials"][0]
    record = store.trajectory(report["run_id"], some["trial_id"])
    assert record["trial_id"] == some["trial_id"] and record["case_id"] == some["case_id"]
    assert next(s["name"] for s in record["steps"] if s["kind"] == "tool") == "fetch_invoice"
    views = divergence_views(store, report)
    assert [v[0].split(",")[0] for v in views] == ["Arm naive"]  # the retry arm never diverged
    html = render_html(report, views)
    assert "<svg" in html and "tool_fault" in html and "Parity naive vs retry" in html
    assert "naive modal baseline" in html and ">failed<" in html  # the match that failed, side by side
    write_junit(report, tmp_path / "junit.xml")
    assert 'name="tool_fault"' in (tmp_path / "junit.xml").read_text()


async def test_http_runner_sends_trace_context_and_gets_the_answer(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("ap_agent_for_http", EXAMPLE / "agent.py")
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    seen = []

    async def run(req: web.Request) -> web.Response:
        seen.append((req.headers["traceparent"], req.headers["baggage"]))
        answer = await asyncio.to_thread(agent.handle, await req.json(), 0, dict(req.headers))
        return web.json_response(answer)

    async with agent_server(run) as port:
        path = setup_campaign(tmp_path, f"  http: {{http: {{url: 'http://127.0.0.1:{port}/run', timeout_s: 10}}}}\n",
                              "  baseline: {repeats: 2}\n", cases=1)
        report = await run_once(path, Store(tmp_path / "runs.db"))
    assert [t["status"] for t in report["trials"]] == ["conformant", "conformant"]
    traceparents = {t["trace_id"] for t in report["trials"]}
    assert {tp.split("-")[1] for tp, _ in seen} == traceparents  # a fresh trace per trial
    assert all("plumb.case.id=INV-7001" in bg and "plumb.trial.id=" in bg for _, bg in seen)


async def test_http_retries_only_connection_errors():
    from otel_plumb.campaign.config import HttpArm

    hits = []

    async def fail(req: web.Request) -> web.Response:
        hits.append(1)
        return web.Response(status=500, text="agent crashed")

    ctx = TraceContext("0" * 31 + "1", "0" * 15 + "1", {"plumb.arm": "a"})
    async with agent_server(fail) as port:
        runner = HttpRunner(HttpArm(url=f"http://127.0.0.1:{port}/run", retries=3))
        with pytest.raises(AgentError, match="HTTP 500: agent crashed"):
            await runner(({"input": "x"}), ctx)
        assert hits == [1]  # the agent ran: not retried
    closed = HttpRunner(HttpArm(url=f"http://127.0.0.1:{port}/run", retries=2))
    slow_hits = []

    async def slow(req: web.Request) -> web.Response:
        slow_hits.append(1)
        await asyncio.sleep(1)
        return web.json_response({"output": "late"})

    async with agent_server(slow) as port2:
        slow_runner = HttpRunner(HttpArm(url=f"http://127.0.0.1:{port2}/run", timeout_s=0.3, retries=3))
        with pytest.raises(AgentError, match=r"no answer within 0\.3s"):
            await slow_runner({"input": "x"}, ctx)
        assert slow_hits == [1]  # a timeout is not retried either
        await slow_runner.close()
    with pytest.raises(AgentError, match="cannot connect"):
        await closed({"input": "x"}, ctx)
    await runner.close()
    await closed.close()


async def test_command_arm_reads_stdin_and_trace_context_from_the_environment(tmp_path):
    arms = "  cmd: {command: {argv: [python, agent.py, --retries, '0'], timeout_s: 60}}\n"
    path = setup_campaign(tmp_path, arms, "  baseline: {repeats: 1}\n", cases=1)
    report = await run_once(path, Store(tmp_path / "runs.db"))
    (trial,) = report["trials"]
    assert trial["status"] == "conformant" and trial["error"] is None
    broken = setup_campaign(tmp_path, "  cmd: {command: {argv: [python, -c, 'import sys; sys.exit(3)']}}\n",
                            "  baseline: {repeats: 1}\n", cases=1)
    (trial,) = (await run_once(broken, Store(tmp_path / "runs2.db")))["trials"]
    assert trial["status"] == "error" and "exited 3" in trial["error"]
    hung = setup_campaign(tmp_path, "  cmd: {command: {argv: [python, -c, 'import time; time.sleep(30)'], "
                          "timeout_s: 0.5}}\n", "  baseline: {repeats: 1}\n", cases=1)
    (trial,) = (await run_once(hung, Store(tmp_path / "runs3.db")))["trials"]
    assert trial["status"] == "error" and "no answer within 0.5s" in trial["error"]


async def test_a_trial_whose_trace_never_arrives_is_an_error_not_dropped(tmp_path):
    arms = "  quiet: {python: {callable: 'counting:silent'}}\n"
    path = setup_campaign(tmp_path, arms, "  baseline: {repeats: 2}\n", cases=1,
                          traces="{receiver: embedded, deadline_s: 0.3}")
    report = await run_once(path, Store(tmp_path / "runs.db"))
    base = report["arms"]["quiet"]["perturbations"]["baseline"]
    assert base["trials"] == 2 and base["errors"] == 2 and base["conformance"]["n"] == 0
    assert all(t["status"] == "error" and t["error"].startswith("trace missing") for t in report["trials"])
    assert report["arms"]["quiet"]["certificate"]["bound"] is None


async def test_resume_after_an_interrupted_run_and_the_answer_cache(tmp_path, monkeypatch):
    # Trials cut off by the interruption still export to the stopped receiver: give up quickly.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    path = setup_campaign(tmp_path, PY_ARMS, "  baseline: {repeats: 4}\n", cases=2)
    store = Store(tmp_path / "runs.db")
    done = []
    runner = CampaignRun(load_campaign(path), store, progress=lambda row: done.append(row.trial_id))
    run_id = runner.start()
    task = asyncio.create_task(runner.execute(run_id))
    while len(done) < 5:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.run(run_id).status == "interrupted"
    first = len(store.finished_trial_ids(run_id))
    assert 5 <= first < 16
    resumed = CampaignRun(load_campaign(path), store)
    assert resumed.start(resume=run_id) == run_id
    outcome = await resumed.execute(run_id)
    assert outcome.status == "complete" and outcome.ran == 16 - first
    assert len(store.finished_trial_ids(run_id)) == 16
    ran = calls(tmp_path)
    assert len(set(ran)) == 16 and len(ran) <= 16 + 4  # finished trials were not run again
    # A new run of the same campaign reuses answers by trial identity; --fresh asks again.
    before = len(calls(tmp_path))
    report = await run_once(path, store)
    assert len(calls(tmp_path)) == before and all(t["status"] == "conformant" for t in report["trials"])
    await run_once(path, store, use_cache=False)
    assert len(calls(tmp_path)) == before + 16


async def test_trial_limit_stops_the_run_as_partial(tmp_path):
    path = setup_campaign(tmp_path, "  naive: {python: {callable: 'counting:run_naive'}}\n",
                          "  baseline: {repeats: 4}\n", cases=1)
    path.write_text(path.read_text().replace("limits: {concurrency: 4}", "limits: {concurrency: 2, max_trials: 3}"))
    store = Store(tmp_path / "runs.db")
    runner = CampaignRun(load_campaign(path), store)
    run_id = runner.start()
    outcome = await runner.execute(run_id)
    assert (outcome.status, outcome.ran, len(calls(tmp_path))) == ("partial", 3, 3)
    assert store.run(run_id).status == "partial"


async def test_trajectories_from_a_running_processor_watch_stream(tmp_path, monkeypatch):
    from otel_plumb.processor import Processor, load_config

    processor = Processor(load_config(None, {"receivers.grpc.endpoint": "127.0.0.1:0",
                                             "receivers.http.endpoint": "127.0.0.1:0", "metrics.endpoint": "",
                                             "assembly.idle_timeout": 0.05, "assembly.tick": 0.02}), policies=[])
    await processor.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{processor.http_port}")
        path = setup_campaign(tmp_path, "  naive: {python: {callable: 'counting:run_naive'}}\n",
                              "  baseline: {repeats: 2}\n", cases=1,
                              traces=f"{{watch: 'grpc://127.0.0.1:{processor.grpc_port}', deadline_s: 20}}")
        report = await run_once(path, Store(tmp_path / "runs.db"))
    finally:
        await processor.stop(grace=1)
    assert [t["status"] for t in report["trials"]] == ["conformant", "conformant"]


async def test_trajectories_from_trace_files_recorded_earlier(tmp_path):
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_plumb.agent import setup_tracing, trial_context
    from otel_plumb.receive.otlp_json import request_to_json

    path = setup_campaign(tmp_path, "  naive: {python: {callable: 'counting:run_naive'}}\n",
                          "  baseline: {repeats: 2}\n", cases=1, traces="{files: [recorded.jsonl]}")
    campaign = load_campaign(path)
    runner = CampaignRun(campaign, Store(tmp_path / "runs.db"))
    variants, _ = runner.generate()
    exporter = InMemorySpanExporter()
    provider = setup_tracing("ap-agent", exporter=exporter, batch=False)
    tracer = provider.get_tracer("t")
    for trial in plan(campaign, variants, runner.cases, ["naive"], 1):
        ctx = trial_context({"baggage": f"plumb.trial.id={trial.row.trial_id}"})
        with tracer.start_as_current_span("invoke_agent", context=ctx) as root:
            root.set_attribute("gen_ai.operation.name", "invoke_agent")
            for tool in ("fetch_invoice", "match_purchase_order", "check_duplicate", "schedule_payment"):
                with tracer.start_as_current_span(f"execute_tool {tool}") as span:
                    span.set_attribute("gen_ai.operation.name", "execute_tool")
                    span.set_attribute("gen_ai.tool.name", tool)
                    args = {"invoice_id": "INV-7001", "amount_gbp": 4500.0} if tool == "schedule_payment" else {}
                    span.set_attribute("gen_ai.tool.call.arguments", json.dumps(args))
    line = json.dumps(request_to_json(encode_spans(exporter.get_finished_spans())))
    (tmp_path / "recorded.jsonl").write_text(line + "\n")
    run_id = runner.start()
    await runner.execute(run_id)
    report = build_report(runner.store, runner.store.run(run_id))
    assert calls(tmp_path) == []  # the agent ran when the traces were recorded, not now
    assert [t["status"] for t in report["trials"]] == ["conformant", "conformant"]


def test_cli_run_report_parity_show_replay_minimise(tmp_path):
    path = setup_campaign(tmp_path, PY_ARMS, FAULTS, cases=1, extra="gates: {min_certified_bound: 0.5}\n")
    db = str(tmp_path / "runs.db")
    cli_runner = CliRunner()
    res = cli_runner.invoke(cli, ["campaign", "run", str(path), "--store", db, "--json", str(tmp_path / "r.json"),
                                  "--html", str(tmp_path / "r.html"), "--junit", str(tmp_path / "j.xml"), "-q"])
    assert res.exit_code == 1, res.output  # the naive arm's certificate is below the gate
    assert "certified bound 0.0000 below 0.5" in res.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["campaign_report_version"] == "1" and set(report["arms"]) == {"naive", "retry"}
    run_id = report["run_id"]
    res = cli_runner.invoke(cli, ["gate", str(tmp_path / "r.json"), "--min-bound", "0.01"])
    assert res.exit_code == 1 and "arm naive" in res.output
    res = cli_runner.invoke(cli, ["gate", str(tmp_path / "r.json"), "--min-bound", "0.0"])
    assert res.exit_code == 0, res.output
    res = cli_runner.invoke(cli, ["campaign", "report", run_id[:10], "--store", db])
    assert res.exit_code == 0 and "certificate" in res.output
    res = cli_runner.invoke(cli, ["campaign", "parity", run_id, "naive", "retry", "--store", db])
    assert res.exit_code == 0 and "permutation p" in res.output
    (fault_row,) = [line.split() for line in res.output.splitlines() if line.startswith("  tool_fault ")]
    assert 0 < float(fault_row[-2]) <= 1  # the p column (two trials per arm: nothing can be significant)
    res = cli_runner.invoke(cli, ["campaign", "parity", run_id, "naive", "nope", "--store", db])
    assert res.exit_code == 2
    res = cli_runner.invoke(cli, ["campaign", "show", run_id, "--case", "INV-7001", "--variant", "tool_fault-0",
                                  "--store", db, "--html", str(tmp_path / "show.html")])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert any("match_purchase_order" in line and "✗" in line for line in lines)
    # naive holds the invoice where retry pays it: marked as a substitution at the step
    assert any("flag_exception" in line and "schedule_payment" in line and "<- substitute" in line for line in lines)
    res = cli_runner.invoke(cli, ["campaign", "show", run_id, "--case", "INV-7001", "--variant", "tool_fault-0",
                                  "--arm", "naive", "--store", db])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("naive modal baseline") and "<- substitute" in res.output
    res = cli_runner.invoke(cli, ["campaign", "replay", run_id, "--failing", "--store", db, "-q"])
    assert res.exit_code == 0, res.output
    assert "reproduced" in res.output and "tool_fault-0" in res.output
    res = cli_runner.invoke(cli, ["campaign", "minimise", run_id, "--variant", "INV-7001/tool_fault-0",
                                  "--trials", "1", "--store", db])
    assert res.exit_code == 0, res.output
    assert '"op": "fault"' in res.output and "(1 -> 1" in res.output
    res = cli_runner.invoke(cli, ["campaign", "report", "nope", "--store", db])
    assert res.exit_code == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("seed: 42", "seed: 42\nsed: 1"))
    res = cli_runner.invoke(cli, ["campaign", "run", str(bad), "--store", db])
    assert res.exit_code == 2 and "unknown key 'sed'" in res.output


def test_minimise_drops_the_harmless_steps_of_a_failing_variant(tmp_path):
    perturbations = ("  distractor: {fragments: ['Lunch is at noon.', "
                     "'Another supplier billed £12,000.00 last month.'], insertions: 2, samples: 4}\n")
    path = setup_campaign(tmp_path, "  naive: {python: {callable: 'counting:run_naive'}}\n", perturbations, cases=3)
    db = str(tmp_path / "runs.db")
    cli_runner = CliRunner()
    res = cli_runner.invoke(cli, ["campaign", "run", str(path), "--store", db, "--json", str(tmp_path / "r.json"),
                                  "-q"])
    report = json.loads((tmp_path / "r.json").read_text())
    store = Store(db)
    two_steps = {v.variant_id for v in store.variants(report["run_id"]) if len(v.steps) == 2}
    failing = [t["variant_id"] for t in report["trials"] if t["status"] == "violating" and t["variant_id"] in two_steps]
    assert failing, res.output  # a distractor amount read before the invoice's own breaks the payment
    res = cli_runner.invoke(cli, ["campaign", "minimise", report["run_id"], "--variant", failing[0], "--trials", "1",
                                  "--store", db])
    assert res.exit_code == 0, res.output
    assert "(2 -> 1" in res.output and "12,000.00" in res.output


def test_the_report_says_which_paraphrase_guard_ran(tmp_path):
    import subprocess
    import sys

    (tmp_path / "para.jsonl").write_text(json.dumps({"id": "INV-7001", "paraphrases": [
        "Kindly handle Acme Supplies' invoice INV-7001, amount £4,500.00, raised against PO-501."]}) + "\n")
    source = "{source: {provider: file, path: para.jsonl}, samples: 1"
    for guard, expected in (
        ("", "paraphrase guard: none (the default for paraphrases from a file: reviewed, used as written)"),
        (", guard: {provider: embedding, min_similarity: 0.7}",
         "paraphrase guard: embedding (all-MiniLM-L6-v2), similarity at least 0.7 (as configured)"),
    ):
        path = setup_campaign(tmp_path, "  naive: {python: {callable: 'agent:run_naive'}}\n",
                              f"  paraphrase: {source}{guard}}}\n", cases=1)
        res = subprocess.run([sys.executable, "-m", "otel_plumb", "campaign", "run", str(path), "--store",
                              str(tmp_path / "runs.db"), "--json", str(tmp_path / "r.json"), "--html",
                              str(tmp_path / "r.html"), "-q"], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        assert expected in res.stdout.splitlines()
        assert expected in (tmp_path / "r.html").read_text()
        recorded = json.loads((tmp_path / "r.json").read_text())["paraphrase_guard"]
        assert recorded["configured"] == bool(guard) and recorded["source"] == "file"
        assert recorded["min_similarity"] == (0.7 if guard else None)


def test_summary_and_show_fit_100_columns_explain_the_numbers_and_name_the_failed_invariant(tmp_path):
    import subprocess
    import sys

    path = setup_campaign(tmp_path, PY_ARMS, FAULTS, cases=1)
    db = str(tmp_path / "runs.db")

    def cli_run(*args: str) -> list[str]:
        res = subprocess.run([sys.executable, "-m", "otel_plumb", "campaign", *args, "--store", db],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        assert all(len(line) <= 100 for line in lines), max(lines, key=len)
        return lines

    summary = cli_run("run", str(path), "-q")
    for measure in ("critical conformance: ", "structural: ", "parity success: ", "[lo, hi]: Wilson 95% interval"):
        assert sum(line.startswith(measure) for line in summary) == 1, measure
    html_out = tmp_path / "r.html"
    cli_run("report", "latest", "--html", str(html_out))
    assert "<b>parity success</b>: trials ending in the modal baseline" in html_out.read_text()
    show = cli_run("show", "latest", "--case", "INV-7001", "--variant", "tool_fault-0")
    # Without retries the transient fault holds a clean invoice: the policy's pay-when-clean fails.
    at = show.index("naive (" + show[0].split("naive (")[1].split(")")[0] + "): failed 1 invariant")
    assert show[at + 1].startswith("  pay-when-clean (critical): ")
    assert any(line.startswith("retry (") and line.endswith(": no invariant failed") for line in show)
    assert any("flag_exception" in line and "schedule_payment" in line and "<- substitute" in line for line in show)
