"""Redaction on a running processor: an agent sends secrets over the real OTLP exporter, and no
secret appears in anything the processor emits (annotations and violation events, the verdict
log, the Watch stream, log lines, /metrics), while the verdicts are those of the real values.
The forwarded spans keep their own attributes unless ``redact_forwarded`` is set."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf.json_format import MessageToJson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode
from test_export_faults import FakeBackend
from test_live_support import (
    agent_provider,
    config,
    free_port,
    http_service,
    orders_server,
    scrape,
    start_cli,
    wait_until,
)

from otel_plumb.model import Decided
from otel_plumb.processor import Processor
from otel_plumb.proto_gen import watch_pb2, watch_pb2_grpc

DEADLINE = 20.0
CARD = "4111111111111111"
SECRETS = {
    "email": "jane.roe@example.com",
    "card": CARD,
    "key": "sk-live-SECRET-42",
    "bearer": "Bearer abcdefghijklmnop",
    "path": "CARDREF-0042-7781",  # matches no pattern: only the path rule finds it
}

POLICY = """\
policy: refunds
invariants:
  - id: refund-to-known-card
    severity: critical
    arg_equals: {tool: refund, arg: card.number, step: {tool: lookup, result: card.number}}
  - id: small-refunds
    severity: medium
    arg_satisfies: {tool: refund, expr: "args.amount < 100"}
  - id: note-plain
    severity: low
    arg_matches: {tool: refund, arg: note, regex: "^[a-z ]*$"}
"""

REDACTION = {
    "hash_key": "0123456789abcdef0123456789abcdef",
    "patterns": ["email", "card_number", "api_key", {"name": "bearer_token", "action": "hash"}],
    "paths": [{"path": "card.number", "action": "hash"}],
}


def send_agent_traffic(port: int) -> None:
    provider, _ = agent_provider(port)
    _agent_run(provider)
    provider.force_flush()
    provider.shutdown()


def _agent_run(provider: TracerProvider) -> None:
    """One run: a lookup returns the customer's card reference; the refund goes to another card
    with a note quoting an email and an API key; a notification fails with a bearer token in
    its error."""
    tracer = provider.get_tracer("refund-agent")
    with tracer.start_as_current_span("invoke_agent refunds") as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        root.set_attribute("gen_ai.agent.name", "refunds")
        with tracer.start_as_current_span("execute_tool lookup") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", "lookup")
            span.set_attribute("gen_ai.tool.call.arguments", json.dumps({"email": SECRETS["email"]}))
            span.set_attribute("gen_ai.tool.call.result", json.dumps({"card": {"number": SECRETS["path"]}}))
        with tracer.start_as_current_span("execute_tool refund") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", "refund")
            args = {"card": {"number": CARD}, "amount": 500, "note": f"mail {SECRETS['email']} key {SECRETS['key']}"}
            span.set_attribute("gen_ai.tool.call.arguments", json.dumps(args))
        with tracer.start_as_current_span("execute_tool notify") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", "notify")
            span.set_status(Status(StatusCode.ERROR, f"gateway said: {SECRETS['bearer']} expired"))


def found_secrets(data: bytes | str) -> list[str]:
    raw = data.encode() if isinstance(data, str) else data
    return [name for name, secret in SECRETS.items() if secret.encode() in raw]


@pytest.mark.parametrize("redact_forwarded", [False, True])
async def test_no_secret_leaves_a_running_processor(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, redact_forwarded: bool
) -> None:
    policy = tmp_path / "refunds.yaml"
    policy.write_text(POLICY)
    backend = FakeBackend()
    endpoint = await backend.start()
    redaction = {**REDACTION, "redact_forwarded": redact_forwarded}
    processor = Processor(config(tmp_path, endpoint, policies=[str(policy)], redaction=redaction))
    decided: list[Decided] = []
    processor.on_decided(decided.append)
    caplog.set_level(logging.DEBUG, logger="otel_plumb")
    await processor.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}")
    watched: list[bytes] = []
    try:
        watch = watch_pb2_grpc.VerdictServiceStub(channel).Watch(watch_pb2.WatchRequest(), timeout=DEADLINE)
        await watch.initial_metadata()

        async def read_watch() -> None:
            async for message in watch:
                watched.append(message.SerializeToString())

        reader = asyncio.create_task(read_watch())
        await asyncio.to_thread(send_agent_traffic, processor.grpc_port or 0)
        # And a service that is no agent, whose request URL holds an email address.
        with orders_server() as base:
            service, _ = agent_provider(processor.grpc_port or 0)
            await asyncio.to_thread(http_service, service, base, [[f"/customers/{SECRETS['email']}/orders"]])
        await wait_until(lambda: len(decided) == 1, DEADLINE, "the trajectory decided")
        await wait_until(lambda: len(backend.spans) == 6, DEADLINE, "the spans forwarded")
        await wait_until(lambda: bool(watched), DEADLINE, "the Watch stream")
        metrics_text = await asyncio.to_thread(scrape, processor.metrics_port or 0)
        reader.cancel()
    finally:
        await channel.close()
        await processor.stop()
        await backend.stop()

    # The checks ran on the real values: both cards differ, the amount is too big, the note
    # has more than letters; the decision handed on inside the process still holds them.
    real = decided[0]
    assert {v.invariant for v in real.failures} == {"refund-to-known-card", "small-refunds", "note-plain"}
    assert real.trajectory.steps[2].args["card"]["number"] == CARD

    verdict_log = (tmp_path / "verdicts.jsonl").read_text()
    record = json.loads(verdict_log.splitlines()[-1])
    assert [(v["invariant"], v["verdict"]) for v in record["verdicts"]] == [
        (v.invariant, v.verdict) for v in real.verdicts
    ]
    log_text = "\n".join(r.getMessage() for r in caplog.records)
    assert "refund-to-known-card" in log_text  # the violation is logged, its values redacted

    annotations = b""
    forwarded = b""
    for span in backend.spans.values():
        annotations += b"".join(a.SerializeToString() for a in span.attributes if a.key.startswith("plumb."))
        annotations += b"".join(e.SerializeToString() for e in span.events if e.name == "plumb.violation")
        forwarded += span.SerializeToString()
    assert b"plumb.violation" in annotations
    for where, data in {
        "annotations": annotations, "verdict log": verdict_log, "watch": b"".join(watched),
        "log lines": log_text, "metrics": metrics_text,
    }.items():  # fmt: skip
        assert found_secrets(data) == [], f"secrets in the {where}"
    # The hashed card is the same token everywhere it is emitted.
    token = record["steps"][2]["args"]["card"]["number"]
    assert token.startswith("[hmac:") and token.encode() in annotations

    service_spans = [span for span in backend.spans.values() if span.name != "sync_orders" and not any(
        a.key.startswith("gen_ai.") for a in span.attributes)]  # fmt: skip
    assert len(service_spans) == 1  # the httpx client span
    if redact_forwarded:
        assert found_secrets(forwarded) == []
    else:  # forwarded untouched apart from the annotations
        assert set(found_secrets(forwarded)) == set(SECRETS)
        assert found_secrets(service_spans[0].SerializeToString()) == ["email"]



def test_replay_reports_apply_the_policy_redaction(tmp_path: Path) -> None:
    """``otel-plumb replay`` with a policy carrying a ``redaction`` section: neither the terminal
    nor the JSON, HTML or JUnit report shows a secret, and the verdicts are the real ones."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _agent_run(provider)
    trace_file = tmp_path / "traces.json"
    trace_file.write_text(MessageToJson(encode_spans(memory.get_finished_spans()), indent=None))
    policy = tmp_path / "refunds.yaml"
    section = (
        "redaction:\n  patterns: [email, card_number, api_key, bearer_token]\n"
        "  paths:\n    - {path: card.number, action: hash}\n"
    )
    policy.write_text(POLICY.replace("invariants:\n", section + "invariants:\n", 1))
    out = {kind: tmp_path / f"report.{kind}" for kind in ("json", "html", "xml")}
    done = subprocess.run(
        [sys.executable, "-m", "otel_plumb", "replay", str(trace_file), "--policy", str(policy),
         "--json", str(out["json"]), "--html", str(out["html"]), "--junit", str(out["xml"])],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # invariants fail
    report = json.loads(out["json"].read_text())
    (record,) = report["trajectories"]
    failed = {v["invariant"] for v in record["verdicts"] if v["verdict"] == "fail"}
    assert failed == {"refund-to-known-card", "small-refunds", "note-plain"}
    assert "FAIL" in done.stdout
    outputs = {"terminal": done.stdout + done.stderr, **{k: p.read_text() for k, p in out.items()}}
    for where, text in outputs.items():
        assert found_secrets(text) == [], f"secrets in the {where} output"


def test_what_the_processor_writes_is_readable_by_its_user_only(tmp_path: Path) -> None:
    """The queue, the journal and the verdict log hold span content: owner-only files."""
    state, verdicts = tmp_path / "state", tmp_path / "verdicts.jsonl"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "receivers: {grpc: {endpoint: 127.0.0.1:0}, http: {endpoint: 127.0.0.1:0}}\n"
        "metrics: {endpoint: 127.0.0.1:0}\n"
        f"verdict_log: {{path: {verdicts}}}\n"
        f"exporters: {{otlp: {{endpoint: grpc://127.0.0.1:{free_port()}, state_dir: {state}}}}}\n"
    )
    proc, _, lines = start_cli(["--config", str(cfg)])
    try:
        written = [verdicts, state, *state.rglob("*")]
        assert len(written) > 2, "".join(lines)
        for path in written:
            mode = path.stat().st_mode & 0o777
            assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
