"""Campaign trace collection with agents as they are usually written: real agent processes
exporting with the OpenTelemetry SDK's own OTLP/gRPC and OTLP/HTTP exporters (no otel_plumb
helper), and one exporting nothing, which is told plainly where to export and stopped early."""

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from otel_plumb.campaign.config import load_campaign
from otel_plumb.campaign.engine import SILENT_TRIALS, CampaignRun
from otel_plumb.campaign.reports import build_report
from otel_plumb.campaign.store import Store

POLICY = """policy: fetch-first
invariants:
  - {id: fetched, severity: critical, must_call: fetch_invoice}
"""

# The spans an agent emits, parented on the trial's traceparent: the W3C propagator of the SDK.
SPANS = '''
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


def emit(exporter, traceparent):
    provider = TracerProvider(resource=Resource.create({"service.name": "plain-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("plain-agent")
    ctx = TraceContextTextMapPropagator().extract({"traceparent": traceparent} if traceparent else {})
    with tracer.start_as_current_span("invoke_agent plain", context=ctx) as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        with tracer.start_as_current_span("execute_tool fetch_invoice") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", "fetch_invoice")
            span.set_attribute("gen_ai.tool.call.arguments", '{"invoice_id": "INV-7001"}')
    provider.shutdown()
'''

# A command agent configured only by its environment, with the SDK's default exporter (gRPC).
COMMAND_AGENT = SPANS + '''
import json, os, sys
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

request = json.load(sys.stdin)
emit(OTLPSpanExporter(), os.environ["TRACEPARENT"])
print(json.dumps({"output": "done"}))
'''

# An HTTP agent: arm "grpc" exports with the gRPC exporter to the request's otlp_endpoint,
# arm "http" with the HTTP exporter to otlp_http_endpoint, arm "stray" there too but in a
# trace of its own, arm "quiet" not at all.
HTTP_AGENT = SPANS + '''
import asyncio
from aiohttp import web
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter


def handle(request, traceparent):
    if request["arm"] == "grpc":
        assert request["otlp_protocol"] == "grpc"
        emit(GrpcExporter(endpoint=request["otlp_endpoint"]), traceparent)
    elif request["arm"] == "http":
        emit(HttpExporter(endpoint=request["otlp_http_endpoint"] + "/v1/traces"), traceparent)
    elif request["arm"] == "stray":  # a trace of its own: the traceparent is not used
        emit(HttpExporter(endpoint=request["otlp_http_endpoint"] + "/v1/traces"), None)
    return {"output": "done"}


async def run(req):
    return web.json_response(await asyncio.to_thread(handle, await req.json(), req.headers["traceparent"]))


async def main():
    app = web.Application()
    app.router.add_post("/run", run)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
'''


def write_campaign(folder: Path, arms: str, repeats: int, deadline_s: float, concurrency: int = 2) -> Path:
    (folder / "policy.yaml").write_text(POLICY)
    (folder / "cases.jsonl").write_text(json.dumps({"id": "INV-7001", "input": "Pay INV-7001."}) + "\n")
    path = folder / "campaign.yaml"
    path.write_text(f"campaign: collect\nseed: 1\ndataset: cases.jsonl\npolicies: [policy.yaml]\narms:\n{arms}"
                    f"traces: {{receiver: embedded, deadline_s: {deadline_s}}}\n"
                    f"perturbations:\n  baseline: {{repeats: {repeats}}}\nlimits: {{concurrency: {concurrency}}}\n")
    return path


@contextmanager
def http_agent(folder: Path) -> Iterator[int]:
    """The HTTP agent as a process of its own on a free 127.0.0.1 port; stopped after."""
    (folder / "http_agent.py").write_text(HTTP_AGENT)
    proc = subprocess.Popen([sys.executable, str(folder / "http_agent.py")], stdout=subprocess.PIPE, text=True)
    try:
        port: list[int] = []
        reader = threading.Thread(target=lambda: port.append(int(proc.stdout.readline())), daemon=True)
        reader.start()
        reader.join(30)
        assert port, "the HTTP agent did not start"
        yield port[0]
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


async def test_agents_exporting_grpc_or_http_with_the_sdk_exporters_are_both_heard(tmp_path):
    (tmp_path / "command_agent.py").write_text(COMMAND_AGENT)
    with http_agent(tmp_path) as port:
        url = f"http://127.0.0.1:{port}/run"
        arms = (f"  command: {{command: {{argv: ['{sys.executable}', command_agent.py], timeout_s: 60}}}}\n"
                f"  grpc: {{http: {{url: '{url}'}}}}\n"
                f"  http: {{http: {{url: '{url}'}}, otlp_protocol: http/protobuf}}\n")
        path = write_campaign(tmp_path, arms, repeats=2, deadline_s=20)
        store = Store(tmp_path / "runs.db")
        runner = CampaignRun(load_campaign(path), store)
        run_id = runner.start()
        outcome = await runner.execute(run_id)
    report = build_report(store, store.run(run_id))
    assert outcome.stopped_arms == {}
    assert sorted((t["arm"], t["status"], t["error"]) for t in report["trials"]) == [
        (arm, "conformant", None) for arm in ("command", "grpc", "http") for _ in range(2)]
    record = store.trajectory(run_id, report["trials"][0]["trial_id"])
    assert [s["name"] for s in record["steps"] if s["kind"] == "tool"] == ["fetch_invoice"]


RECORDING_AGENT = """
import json, pathlib

def agent(request):
    with open(pathlib.Path(__file__).with_name("requests.jsonl"), "a") as f:
        f.write(json.dumps(request) + "\\n")
    return {"output": "nothing exported"}
"""


async def test_the_request_names_both_receivers_and_the_protocol(tmp_path):
    # A module name of its own: Python callables are imported once per process.
    module = "recording_" + re.sub(r"\W", "_", tmp_path.name)
    (tmp_path / f"{module}.py").write_text(RECORDING_AGENT)
    path = write_campaign(tmp_path, f"  a: {{python: {{callable: '{module}:agent'}}}}\n"
                          f"  b: {{python: {{callable: '{module}:agent'}}, otlp_protocol: http/protobuf}}\n",
                          repeats=1, deadline_s=0.2)
    runner = CampaignRun(load_campaign(path), Store(tmp_path / "runs.db"))
    await runner.execute(runner.start())
    seen = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    by_arm = {r["arm"]: r for r in seen}
    grpc, http = by_arm["a"]["otlp_grpc_endpoint"], by_arm["a"]["otlp_http_endpoint"]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", grpc) and re.fullmatch(r"http://127\.0\.0\.1:\d+", http)
    assert grpc != http
    assert (by_arm["a"]["otlp_protocol"], by_arm["a"]["otlp_endpoint"]) == ("grpc", grpc)
    assert (by_arm["b"]["otlp_protocol"], by_arm["b"]["otlp_endpoint"]) == ("http/protobuf", http)


def test_an_agent_that_exports_nothing_is_told_where_to_and_stopped(tmp_path):
    repeats = 10
    with http_agent(tmp_path) as port:
        path = write_campaign(tmp_path, f"  quiet: {{http: {{url: 'http://127.0.0.1:{port}/run'}}}}\n",
                              repeats=repeats, deadline_s=1, concurrency=2)
        db = tmp_path / "runs.db"
        res = subprocess.run([sys.executable, "-m", "otel_plumb", "campaign", "run", str(path), "--store", str(db),
                              "--json", str(tmp_path / "r.json"), "-q"], capture_output=True, text=True,
                             cwd=tmp_path, env=os.environ, timeout=120)
    assert res.returncode == 2, res.stderr
    message = re.search(r"no spans from arm quiet after (\d+) trials: the agent must export OTLP to "
                        r"127\.0\.0\.1:(\d+) \(gRPC\) or http://127\.0\.0\.1:(\d+) \(HTTP\)", res.stderr)
    assert message, res.stderr
    assert int(message.group(1)) == SILENT_TRIALS and message.group(2) != message.group(3)
    assert "Traceback" not in res.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["run_status"] == "partial"
    # Bounded: the trials already under way (at most concurrency - 1 more) finish, the rest of the arm is not run.
    ran = report["trials"]
    assert SILENT_TRIALS <= len(ran) <= SILENT_TRIALS + 1 < repeats
    assert all(t["status"] == "error" and "no spans arrived" in t["error"] and f"127.0.0.1:{message.group(2)}"
               in t["error"] for t in ran)


async def test_spans_outside_the_trial_trace_are_told_apart_from_no_spans(tmp_path):
    with http_agent(tmp_path) as port:
        path = write_campaign(tmp_path, f"  stray: {{http: {{url: 'http://127.0.0.1:{port}/run'}}}}\n",
                              repeats=6, deadline_s=1.5, concurrency=1)
        store = Store(tmp_path / "runs.db")
        runner = CampaignRun(load_campaign(path), store)
        outcome = await runner.execute(runner.start())
    assert outcome.ran == SILENT_TRIALS and outcome.status == "partial"
    assert outcome.stopped_arms["stray"].startswith(
        f"no spans from arm stray after {SILENT_TRIALS} trials: spans did arrive, but in traces of their own")
    assert "under the traceparent it is sent" in outcome.stopped_arms["stray"]
