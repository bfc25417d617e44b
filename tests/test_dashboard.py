"""The Grafana dashboard against a real Prometheus scraping a running otel-plumb processor fed by
the bundled agent over the real OTLP exporter: every panel query parses and returns data."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_live_support import agent_provider, config, free_port, run_agent, wait_until

from otel_plumb.demo.agent import INVOICES
from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.demo.run import policy_path
from otel_plumb.processor import Processor
from otel_plumb.report.records import decided_record

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "configs" / "grafana" / "otel-plumb-dashboard.json"
RULES = ROOT / "configs" / "prometheus" / "rules.yaml"
DEADLINE = 45.0
# What Grafana puts in place of its variables: every value of the query variables.
SUBSTITUTIONS = {"$__rate_interval": "1m", "$__range": "5m", "$__interval": "15s"}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def substitute(expr: str, variables: list[str]) -> str:
    for name, value in SUBSTITUTIONS.items():
        expr = expr.replace(name, value)
    for name in variables:
        expr = expr.replace(f"${name}", ".*")
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def test_dashboard_is_provisioning_ready() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        # Every panel and query follows the data-source variable: nothing names a local data source.
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
    titles = " ".join(p["title"] for p in panels()).lower()
    for topic in ("wilson", "violations by invariant", "tool-call outcomes", "coverage", "export queue", "in flight"):
        assert topic in titles
    provisioning = yaml.safe_load(
        (ROOT / "configs" / "grafana" / "provisioning" / "dashboards" / "otel-plumb.yaml").read_text()
    )
    assert provisioning["apiVersion"] == 1 and provisioning["providers"][0]["type"] == "file"


@contextlib.contextmanager
def prometheus(tmp_path: Path, target: str) -> Iterator[str]:
    """A real Prometheus on a free loopback port scraping ``target`` every second, with the
    rules loaded and evaluated every second. Stopped on exit."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus not installed: run .ci/install.d/10-prometheus.sh"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "otel-plumb", "static_configs": [{"targets": [target]}]}],
    }
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            # The exemplars the dashboard links to traces.
            "--enable-feature=exemplar-storage",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + DEADLINE
        while True:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
                if resp.status == 200:
                    break
            assert time.monotonic() < deadline, "Prometheus did not become ready"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def query(url: str, expr: str, instant: bool) -> dict[str, Any]:
    now = time.time()
    if instant:
        params = {"query": expr, "time": f"{now:.3f}"}
        path = "query"
    else:
        params = {"query": expr, "start": f"{now - 60:.3f}", "end": f"{now:.3f}", "step": "1"}
        path = "query_range"
    request = urllib.request.Request(
        f"{url}/api/v1/{path}", data=urllib.parse.urlencode(params).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            body: dict[str, Any] = json.load(resp)
    except urllib.error.HTTPError as exc:  # 400 on a parse error: report Prometheus's message
        body = json.load(exc)
    return body


def query_exemplars(url: str, expr: str) -> list[dict[str, Any]]:
    now = time.time()
    params = urllib.parse.urlencode({"query": expr, "start": f"{now - 300:.3f}", "end": f"{now:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query_exemplars?{params}", timeout=10) as resp:
        series: list[dict[str, Any]] = json.load(resp)["data"]
    return series


def label_values(url: str, label: str, match: str) -> list[str]:
    params = urllib.parse.urlencode({"match[]": match})
    with urllib.request.urlopen(f"{url}/api/v1/label/{label}/values?{params}", timeout=10) as resp:
        values: list[str] = json.load(resp)["data"]
    return values


@pytest.fixture
async def processor(tmp_path: Path) -> AsyncIterator[Processor]:
    """The processor with the bundled policy, exporting annotated spans to a real OTLP backend."""
    backend = OtlpBackend(keep=False)
    await backend.start(0)
    processor = Processor(config(tmp_path, backend.endpoint, policies=[str(policy_path())],
                                 consistency={"window": 20, "min_trajectories": 5}))  # fmt: skip
    await processor.start()
    try:
        yield processor
    finally:
        await processor.stop()
        await backend.stop()


async def feed(processor: Processor) -> list[dict[str, Any]]:
    """The bundled agent (some runs deliberately faulty) sends its traces over the real OTLP
    exporter; returns the trajectory records once every trajectory is decided."""
    decided: list[dict[str, Any]] = []
    processor.on_decided(lambda d: decided.append(decided_record(d)))
    provider, _ = agent_provider(processor.grpc_port or 0)

    await asyncio.to_thread(run_agent, provider)
    await wait_until(lambda: len(decided) == len(INVOICES), DEADLINE, "every trajectory decided")
    assert {"conformant", "violating"} <= {r["status"] for r in decided}
    return decided


async def test_every_panel_query_returns_data(processor: Processor, tmp_path: Path) -> None:
    variables = [v["name"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    targets = [
        (panel["title"], substitute(t["expr"], variables), bool(t.get("instant")))
        for panel in panels()
        for t in panel["targets"]
    ]
    with prometheus(tmp_path, f"127.0.0.1:{processor.metrics_port}") as url:
        # Traffic after the first scrape, so the windows of the rules see the counters grow.
        async with asyncio.timeout(DEADLINE):
            while not (await asyncio.to_thread(query, url, 'up{job="otel-plumb"} == 1', True))["data"]["result"]:
                await asyncio.sleep(0.2)
        decided = await feed(processor)
        pending = dict.fromkeys(targets, "not queried yet")
        deadline = time.monotonic() + DEADLINE
        # Recording rules need a scrape and an evaluation or two: poll until every query has data.
        while pending and time.monotonic() < deadline:
            for target in list(pending):
                title, expr, instant = target
                body = await asyncio.to_thread(query, url, expr, instant)
                assert body["status"] == "success", f"{title}: {expr}: {body.get('error')}"
                if body["data"]["result"]:
                    del pending[target]
                else:
                    pending[target] = "no data"
            await asyncio.sleep(0.5)
        assert not pending, "\n".join(f"{title}: {expr} ({why})" for (title, expr, _), why in pending.items())

        # The template variables' queries list what the processor reported.
        for variable in dashboard()["templating"]["list"]:
            if variable["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
            assert m, variable["query"]
            values = await asyncio.to_thread(label_values, url, m.group(2), substitute(m.group(1), variables))
            assert values, variable["name"]
        assert await asyncio.to_thread(label_values, url, "policy", "plumb_trajectories_total") == ["ap-controls"]

        # Violation exemplars carry the trace_id of a violating trajectory.
        violating = {r["trace_id"] for r in decided if r["status"] == "violating"}
        exemplars = await asyncio.to_thread(query_exemplars, url, "plumb_violations_total")
        assert {e["labels"]["trace_id"] for series in exemplars for e in series["exemplars"]} <= violating
        assert exemplars
