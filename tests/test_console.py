"""The console over a store filled by a real processor run (the bundled agent over the real OTLP
exporter), the demo's campaign run (as ``otel-plumb demo`` runs it) and a replay: the API over
real HTTP (every filter, pagination, the OpenAPI document), and the pages in a real headless
Chromium: from the overview to a violating step, from the demo's campaign to its diffs, a
``<script>`` in a tool argument shown as text."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToJson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_live_support import config, decide_demo_agent, free_port

from otel_plumb.demo.agent import INVOICES
from otel_plumb.demo.run import policy_path, run_campaign
from otel_plumb.model import SEVERITIES
from otel_plumb.processor import Processor

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("PLUMB_TEST_ARTIFACTS", ROOT / "test-artifacts"))
HOSTILE = "<script>window.__pwned = 1</script>"


async def _live(path: Path, tmp: Path) -> int:
    processor = Processor(config(tmp, policies=[str(policy_path())], store={"path": str(path)}))
    await processor.start()
    try:
        return len(await decide_demo_agent(processor))
    finally:
        await processor.stop()


def _hostile_replay(path: Path, tmp: Path) -> None:
    """A trajectory whose tool argument is a script, added with ``replay --store``."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("agent")
    with tracer.start_as_current_span("invoke_agent hostile") as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        with tracer.start_as_current_span("execute_tool schedule_payment") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", "schedule_payment")
            span.set_attribute("gen_ai.tool.call.arguments", json.dumps({"invoice_id": HOSTILE, "amount_gbp": 1}))
    traces = tmp / "hostile.json"
    traces.write_text(MessageToJson(encode_spans(memory.get_finished_spans()), indent=None))
    subprocess.run([sys.executable, "-m", "otel_plumb", "replay", str(traces), "--policy", str(policy_path()),
                    "--store", str(path)], capture_output=True, timeout=60, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("console")
    path = tmp / "store.sqlite"
    live = asyncio.run(_live(path, tmp))
    report = asyncio.run(run_campaign(path, say=lambda _line: None))
    _hostile_replay(path, tmp)
    return {"path": path, "live": live, "campaign": report}


@pytest.fixture(scope="module")
def console(filled: dict[str, Any]) -> Iterator[str]:
    """``otel-plumb console`` on the filled store, as a user runs it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_plumb", "console", "--store", str(filled["path"]), "--listen",
         f"127.0.0.1:{port}", "--trace-url", "http://jaeger.example:16686/trace/{trace_id}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(base + "/api/v1/openapi.json", timeout=2).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the console did not start"
            time.sleep(0.1)
    yield base
    proc.terminate()
    assert proc.wait(timeout=10) == 0


def get(base: str, path: str, **params: Any) -> tuple[int, Any]:
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def everything(base: str, **params: Any) -> list[dict[str, Any]]:
    items, cursor = [], None
    for _ in range(100):
        status, page = get(base, "/api/v1/trajectories", limit=7, **params, **({"cursor": cursor} if cursor else {}))
        assert status == 200, page
        items += page["items"]
        cursor = page["next"]
        if cursor is None:
            return items
    raise AssertionError("pagination did not end")


def test_the_api_lists_filters_and_pages(filled: dict[str, Any], console: str) -> None:
    every = everything(console)
    campaign_trials = [t for t in filled["campaign"]["trials"] if t["trace_id"]]
    assert len(every) == filled["live"] + len(campaign_trials) + 1
    assert len({i["id"] for i in every}) == len(every)  # no page repeats a row
    assert [i["decided_at"] for i in every] == sorted((i["decided_at"] for i in every), reverse=True)
    by_source = {s: [i for i in every if i["source"] == s] for s in ("live", "campaign", "replay")}
    assert len(by_source["live"]) == filled["live"] and len(by_source["replay"]) == 1
    for source, items in by_source.items():
        assert {i["id"] for i in everything(console, source=source)} == {i["id"] for i in items}
    for status in ("violating", "conformant", "indeterminate"):
        want = {i["id"] for i in every if i["status"] == status}
        assert {i["id"] for i in everything(console, status=status)} == want
    records = {i["id"]: get(console, f"/api/v1/trajectories/{i['id']}")[1] for i in every}
    failed = {(v["invariant"], i) for i, r in records.items() for v in r["verdicts"] if v["verdict"] == "fail"}
    invariant = next(iter(sorted(failed)))[0]
    assert {i["id"] for i in everything(console, invariant=invariant)} == {i for inv, i in failed if inv == invariant}
    for floor in SEVERITIES:
        allowed = SEVERITIES[: SEVERITIES.index(floor) + 1]
        want = {i for i, r in records.items()
                if any(v["verdict"] == "fail" and v["severity"] in allowed for v in r["verdicts"])}  # fmt: skip
        assert {i["id"] for i in everything(console, severity=floor)} == want
    agent = next(i["agent"] for i in every if i["agent"])
    assert {i["id"] for i in everything(console, agent=agent)} == {i["id"] for i in every if i["agent"] == agent}
    run_id = filled["campaign"]["run_id"]
    assert len(everything(console, run_id=run_id)) == len(campaign_trials)
    key = by_source["live"][0]["key"]
    assert key in {i["key"] for i in everything(console, key=key)}
    assert everything(console, since=time.time() + 3600) == []
    assert everything(console, until="2000-01-01T00:00:00Z") == []
    for bad in ({"severity": "urgent"}, {"limit": 0}, {"cursor": "x"}, {"since": "yesterday"}, {"colour": "red"}):
        status, body = get(console, "/api/v1/trajectories", **bad)
        assert status == 400 and body["error"]
    assert get(console, "/api/v1/trajectories/no-such-trace")[0] == 404


def test_conformance_campaigns_compare_and_the_openapi_document(filled: dict[str, Any], console: str) -> None:
    from openapi_spec_validator import validate

    status, document = get(console, "/api/v1/openapi.json")
    assert status == 200
    validate(document)
    status, series = get(console, "/api/v1/conformance", policy="ap-controls", bucket=3600)
    assert status == 200 and series["buckets"]
    total = sum(b["n"] for b in series["buckets"])
    checked = [i for i in everything(console) if i["status"] != "unchecked"]
    assert total == len(checked)
    for b in series["buckets"]:
        assert b["lo"] <= (b["rate"] or 0) <= b["hi"]
    status, runs = get(console, "/api/v1/campaigns")
    assert [r["run_id"] for r in runs["runs"]] == [filled["campaign"]["run_id"]]
    status, report = get(console, f"/api/v1/campaigns/{filled['campaign']['run_id']}")
    assert status == 200 and report["arms"] == filled["campaign"]["arms"]
    trials = filled["campaign"]["trials"]
    # The same invoice under the same fault in both arms (trials finish in any order).
    faulty = next(t for t in trials if t["arm"] == "faulty" and t["perturbation"] == "tool_fault")
    fixed = next(t for t in trials if t["arm"] == "fixed" and t["perturbation"] == "tool_fault"
                 and t["case_id"] == faulty["case_id"])  # fmt: skip
    status, compared = get(console, "/api/v1/compare", a=faulty["trace_id"], b=fixed["trace_id"])
    assert status == 200 and compared["left"]["arm"] == "faulty" and compared["right"]["arm"] == "fixed"
    # Under the fault the fixed build retries the failed duplicate check; the faulty one goes on without.
    assert [(row["mark"], row["right"]["name"], row["right"]["error"]) for row in compared["rows"] if row["mark"]] == [
        ("extra", "check_duplicate", None)]
    assert get(console, "/api/v1/compare", a=faulty["trace_id"])[0] == 400
    assert get(console, "/api/v1/campaigns/no-such-run")[0] == 404


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "the console tests need Debian's chromium (.ci/install.d installs it)"
    return found


def test_a_person_clicks_from_the_overview_to_the_offending_step_and_to_a_campaign_diff(
    filled: dict[str, Any], console: str
) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(console + "/")
            assert page.locator("#top-violations").is_visible()
            page.screenshot(path=str(ARTIFACTS / "console-overview.png"), full_page=True)
            page.locator("#top-violations a").first.click()
            page.wait_for_url("**/violations?**")
            page.screenshot(path=str(ARTIFACTS / "console-violations.png"), full_page=True)
            page.locator("a.violation").first.click()
            page.wait_for_selector("#steps")
            offending = page.locator("tr.offending")
            assert offending.count() >= 1 or page.locator("#trajectory-violations li").count() >= 1
            url = page.url
            if "#step-" in url:
                assert page.locator(f"tr#step-{url.split('#step-')[1]}.offending").count() == 1
            assert page.locator("#trace-link").get_attribute("href").startswith("http://jaeger.example:16686/trace/")
            page.screenshot(path=str(ARTIFACTS / "console-trajectory.png"), full_page=True)

            # From the overview to the demo's campaign, to a divergence against the baseline,
            # then to the two arms side by side.
            page.goto(console + "/")
            page.locator(f"a[href$='/campaigns/{filled['campaign']['run_id']}']").first.click()
            page.wait_for_selector("p.certificate")
            assert "Certificate" in page.locator("p.certificate").first.inner_text()
            assert page.locator("#parity").is_visible()
            page.screenshot(path=str(ARTIFACTS / "console-campaign.png"), full_page=True)
            page.locator("table.perturbations a.diff").first.click()
            page.wait_for_selector("#compare")
            assert page.locator("#compare tr.offending").count() >= 1
            page.go_back()
            page.locator("#trials a.diff", has_text="vs fixed").first.click()
            page.wait_for_selector("#compare")
            heads = page.locator("#compare th").all_inner_texts()
            assert "arm faulty" in heads[1] and "arm fixed" in heads[2], heads
            page.screenshot(path=str(ARTIFACTS / "console-compare.png"), full_page=True)

            (hostile,) = everything(console, source="replay")
            page.goto(console + f"/trajectories/{hostile['id']}")
            page.wait_for_selector("#steps")
            assert HOSTILE in page.locator("#steps").inner_text()  # shown as text
            assert page.evaluate("window.__pwned === undefined") and not dialogs
        finally:
            browser.close()


def test_the_demo_keeps_its_console_running_until_interrupted(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_plumb", "demo", "--out", str(tmp_path / "demo"), "--keep-running"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        urls: dict[str, str] = {}
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            if line.startswith(("console: http://", "campaign: http://")):
                urls[line.split(":")[0]] = line.split()[1]
            if len(urls) == 2:
                break
            assert time.monotonic() < deadline, "no console and campaign URLs"
        assert len(urls) == 2, f"the demo ended without a console and a campaign URL: {urls}"
        url = urls["console"]
        with urllib.request.urlopen(url + "violations", timeout=10) as r:
            page = r.read().decode()
        assert r.status == 200 and "critical" in page
        status, listed = get(url.rstrip("/"), "/api/v1/trajectories", status="violating")
        assert status == 200 and listed["items"]
        assert urls["campaign"].startswith(url + "campaigns/")
        with urllib.request.urlopen(urls["campaign"], timeout=10) as r:
            page = r.read().decode()
        assert r.status == 200 and "Arm faulty" in page and "Arm fixed" in page and "vs fixed" in page
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0


async def test_the_console_mounted_on_a_running_processors_metrics_listener(tmp_path: Path) -> None:
    from otel_plumb.processor import ConfigError, load_config

    with pytest.raises(ConfigError, match="console shows the trajectory store"):
        load_config(None, {"console": {}})
    token = "console-token-0123456789"
    cfg = config(tmp_path, policies=[str(policy_path())], store={"path": str(tmp_path / "s.sqlite")},
                 console={"trace_url": "http://jaeger.example/trace/{trace_id}"},
                 metrics={"auth": {"bearer_tokens": [{"token": token}]}})  # fmt: skip
    processor = Processor(cfg)
    await processor.start()
    try:
        await decide_demo_agent(processor)
        base = f"http://127.0.0.1:{processor.metrics_port}/console"

        def fetch(path: str, with_token: bool = True) -> tuple[int, str]:
            headers = {"Authorization": f"Bearer {token}"} if with_token else {}
            try:
                with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=10) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        async def listed() -> int:
            status, body = await asyncio.to_thread(fetch, "/api/v1/trajectories?limit=500")
            assert status == 200
            return len(json.loads(body)["items"])

        deadline = time.monotonic() + 10  # the store's writer runs on its own thread
        while await listed() < len(INVOICES):
            assert time.monotonic() < deadline, "the store never held every trajectory"
            await asyncio.sleep(0.1)
        status, page = await asyncio.to_thread(fetch, "/violations")
        assert status == 200 and 'href="/console/trajectories/' in page  # links stay under the mount
        assert (await asyncio.to_thread(fetch, "/", False))[0] == 401  # the metrics listener's auth
    finally:
        await processor.stop()


def test_a_campaign_page_of_a_store_without_campaigns_writes_nothing(tmp_path: Path) -> None:
    """The console opens the file read-only for campaign pages too: no campaign tables made,
    nothing in the file changed."""
    import hashlib
    import sqlite3

    from otel_plumb.console import queries
    from otel_plumb.store import TrajectoryStore

    path = tmp_path / "store.sqlite"
    TrajectoryStore(path).close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    assert queries.campaign_report(path, "latest") is None
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    db = sqlite3.connect(path)
    try:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        db.close()
    assert "runs" not in tables
