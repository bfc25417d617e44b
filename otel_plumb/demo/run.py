"""``otel-plumb demo``: the processor in-process on free loopback ports, the bundled AP agent
sending to it over the real OTLP exporter, live verdicts printed as they are decided, then a
report; then a small campaign (the agent's faulty build against a fixed one) through the
campaign engine, into the same store, so the console has a campaign and its diffs to show.
No network beyond 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import signal
import tempfile
import time
import urllib.request
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_plumb.check import CompiledPolicy, load_policies
from otel_plumb.demo.agent import INVOICES, SERVICE, run_all
from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.model import Decided
from otel_plumb.processor import Processor, load_config
from otel_plumb.receive.otlp_json import request_to_json
from otel_plumb.report import html
from otel_plumb.report.coverage import coverage_report
from otel_plumb.report.json_report import build_report, report_body

STORE = "store.sqlite"
CONSOLE_PORT = 8080
# Parity's permutation test needs numpy, which a base install does not have.
NO_P_VALUE = "n/a (numpy, of the campaign extra, is not installed)"


def policy_path() -> Path:
    return Path(str(resources.files("otel_plumb.demo") / "ap-policy.yaml"))


def campaign_path() -> Path:
    return Path(str(resources.files("otel_plumb.demo") / "campaign.yaml"))


def _case(record: dict[str, Any]) -> str:
    """The task key (the invoice id) with the trace it came from."""
    key, trace = str(record["key"]), str(record["trace_id"])
    return trace[:12] if key == trace else f"{key} (trace {trace[:8]})"


def _line(record: dict[str, Any]) -> str:
    fails = [v for v in record["verdicts"] if v["verdict"] == "fail"]
    if record.get("decision") == "early":
        v = fails[0]
        return f"  EARLY {_case(record)}  {v['invariant']} ({v['severity']}): {v['message']}"
    label = {"conformant": "PASS ", "violating": "FAIL ", "indeterminate": "UNSURE", "unchecked": "-    "}[
        record["status"]
    ]
    detail = ", ".join(f"{v['invariant']} ({v['severity']})" for v in fails) or f"{len(record['steps'])} steps"
    return f"  {label} {_case(record)}  {record['status']:<13} {detail}"


async def run_demo(out_dir: Path, say: Callable[[str], None] = print, rounds: int = 1) -> dict[str, Any]:
    """Run the demo; returns the report (also written to ``out_dir/report.json``)."""
    policies: list[CompiledPolicy] = load_policies([policy_path()])
    backend = OtlpBackend()
    await backend.start(0)
    state = tempfile.TemporaryDirectory(prefix="otel-plumb-demo-")
    config = load_config(
        None,
        {
            "receivers": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}},
            "metrics": {"endpoint": "127.0.0.1:0"},
            # The agent runs here and its provider is flushed: no span of it can come late.
            "assembly": {"idle_timeout": 0.5, "confirm_wait": 0.3},
            "exporters": {"otlp": {"endpoint": backend.endpoint, "state_dir": state.name}},
            "verdict_log": {"path": str(out_dir / "verdicts.jsonl")},
            # What the console shows: every demo run adds its trajectories.
            "store": {"path": str(out_dir / STORE)},
            # Drain waits until the backend has every span (at most this long).
            "shutdown": {"grace_period": 30},
        },
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    processor = Processor(config, policies)
    decisions: list[Decided] = []
    processor.on_decided(decisions.append)
    watch = processor.hub.subscribe()
    await processor.start()
    metrics_url = f"http://127.0.0.1:{processor.metrics_port}/metrics"
    say("otel-plumb demo: the live processor checking an accounts-payable agent")
    say(f"  OTLP/gRPC 127.0.0.1:{processor.grpc_port}   OTLP/HTTP 127.0.0.1:{processor.http_port}")
    say(f"  metrics   {metrics_url}")
    say(f"  policy    {policies[0].name} ({len(policies[0].invariants)} invariants, {policy_path()})")
    say(f"  backend   {backend.endpoint} (annotated spans go here)")
    faulty = sum(1 for i in INVOICES if i.fault)
    runs = len(INVOICES) * rounds
    say(f"running the agent on {runs} invoices ({faulty * rounds} with deliberate faults)...")

    async def printer() -> None:
        async for record in watch:
            say(_line(record))

    printing = asyncio.create_task(printer())
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{processor.grpc_port}", insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))

    def agent() -> None:
        for _ in range(rounds):
            run_all(provider)
        provider.force_flush()
        provider.shutdown()

    started = time.monotonic()
    await asyncio.to_thread(agent)
    deadline = time.monotonic() + 20
    while len(decisions) < runs and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    scraped = await asyncio.to_thread(_scrape, metrics_url)
    await processor.stop()
    printing.cancel()
    await backend.stop()
    state.cleanup()

    marked = sum(
        1
        for span in backend.spans()
        for a in span.attributes
        if a.key == "plumb.verdict" and a.value.string_value == "violating"
    )
    say(
        f"decided {len(decisions)} trajectories in {time.monotonic() - started:.1f}s; the backend received "
        f"{backend.span_count} spans, {marked} root spans marked plumb.verdict=violating"
    )
    say("metrics (scraped before shutdown):")
    for line in scraped.splitlines():
        if line.startswith(("plumb_violations_total", "plumb_trajectories_total")):
            say(f"  {line}")
    report = build_report(report_body(policies, decisions), coverage_report([d.trajectory for d in decisions]))
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    (out_dir / "report.html").write_text(html.render(report, title="otel-plumb demo"), encoding="utf-8")
    # What the backend stored, as the Collector's file exporter writes it: input for replay and suggest.
    with (out_dir / "traces.jsonl").open("w", encoding="utf-8") as f:
        for request in backend.requests:
            f.write(json.dumps(request_to_json(request), separators=(",", ":")) + "\n")
    say(f"report: {out_dir / 'report.json'} and {out_dir / 'report.html'}")
    say(f"traces (as the backend received them): {out_dir / 'traces.jsonl'}")
    say(f"verdict log: {out_dir / 'verdicts.jsonl'}")
    return report


async def run_campaign(store_path: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """The demo's campaign through the campaign engine (its embedded receiver, the two builds of
    the agent as Python arms), its runs and trajectories into ``store_path``; returns its report."""
    from otel_plumb.campaign.config import load_campaign
    from otel_plumb.campaign.engine import CampaignRun
    from otel_plumb.campaign.reports import build_report
    from otel_plumb.campaign.store import Store

    loaded = load_campaign(campaign_path())
    fault = loaded.spec.perturbations.tool_fault
    assert fault is not None
    say(f"campaign {loaded.spec.campaign}: the agent's {' against '.join(loaded.spec.arms)} build, each invoice "
        f"as it comes and with {' and '.join(fault.targets)} failing once...")
    store = Store(store_path)
    try:
        # Fresh answers each time: a cached one would show the previous demo's trace again.
        runner = CampaignRun(loaded, store, use_cache=False)
        run_id = runner.start()
        await runner.execute(run_id)
        report = build_report(store, store.run(run_id))
    finally:
        store.close()
    for arm, data in report["arms"].items():
        cells = ", ".join(f"{name} {_share(p['critical_conformance'])}" for name, p in data["perturbations"].items())
        say(f"  arm {arm:<7} critical conformance: {cells}")
    for pair in report["parity"]:
        for name, p in pair["by_perturbation"].items():
            pv = f"{p['p_value']:.3g}" if p["p_value"] is not None else NO_P_VALUE
            say(f"  parity {' vs '.join(pair['arms'])} ({name}): same tool path in {_share(p['path'])} of "
                f"{p['pairs']} pairs, permutation p {pv}")
    return report


def _share(r: dict[str, Any] | None) -> str:
    return "n/a" if not r or r.get("rate") is None else f"{100 * r['rate']:.0f}%"


async def serve_console(store: Path, run_id: str, say: Callable[[str], None] = print, keep_running: bool = False,
                        port: int = CONSOLE_PORT) -> None:  # fmt: skip
    """The console over the demo's store: kept up until Ctrl-C with ``keep_running``, else only
    the command that opens it is printed. Either way the campaign run's page is named."""
    if not keep_running:
        say(f"console: otel-plumb console --store {store}   (or run the demo with --keep-running)")
        say(f"campaign: http://127.0.0.1:{port}/campaigns/{run_id}  (once the console runs)")
        return
    from aiohttp import web

    from otel_plumb.console import console_app

    runner = web.AppRunner(console_app(store), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
    except OSError:  # the usual port is taken: any free one
        await web.TCPSite(runner, "127.0.0.1", 0).start()
    bound = runner.addresses[0][1]
    say(f"console: http://127.0.0.1:{bound}/  (violations: http://127.0.0.1:{bound}/violations); Ctrl-C stops it")
    say(f"campaign: http://127.0.0.1:{bound}/campaigns/{run_id}  (its diffs: the arms side by side)")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        body: bytes = resp.read()
    return body.decode()


def main(out_dir: Path, rounds: int = 1, keep_running: bool = False) -> dict[str, Any]:
    async def both() -> dict[str, Any]:
        report = await run_demo(out_dir, rounds=rounds)
        campaign = await run_campaign(out_dir / STORE)
        await serve_console(out_dir / STORE, campaign["run_id"], keep_running=keep_running)
        return report

    return asyncio.run(both())
