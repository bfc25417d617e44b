"""Bearer-token auth on every listener, over real sockets on loopback: the OTel SDK's OTLP
exporters with and without the token, Watch, /metrics, rotation, tenants, the logs, and the
refusal to listen beyond loopback with neither TLS nor auth."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_live_support import metric, wait_until

from otel_plumb.model import Decided
from otel_plumb.processor import Processor, load_config
from otel_plumb.processor.config import ConfigError, exposure_errors
from otel_plumb.proto_gen import watch_pb2, watch_pb2_grpc

DEADLINE = 20.0
TOKEN_A = "tok-A-0123456789-secret"
TOKEN_B = "tok-B-9876543210-secret"
WRONG = "tok-WRONG-secret-value"


def _config(tmp_path: Path, auth: dict[str, Any] | None = None, **listeners: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "receivers": {
            "grpc": {"endpoint": "127.0.0.1:0", **({"auth": auth} if auth else {})},
            "http": {"endpoint": "127.0.0.1:0", **({"auth": auth} if auth else {})},
        },
        "metrics": {"endpoint": "127.0.0.1:0"},
        "assembly": {"idle_timeout": 0.2, "tick": 0.05},
        "verdict_log": {"path": str(tmp_path / "verdicts.jsonl")},
        "shutdown": {"grace_period": 2},
    }
    for key, value in listeners.items():
        data[key] = value
    return data


@pytest.fixture
async def started() -> AsyncIterator[list[Processor]]:
    """Processors a test starts, each stopped at the end whatever happened."""
    processors: list[Processor] = []
    yield processors
    for p in processors:
        await p.stop(1)


async def _start(processors: list[Processor], data: dict[str, Any]) -> tuple[Processor, list[Decided]]:
    processor = Processor(load_config(None, data))
    decided: list[Decided] = []
    processor.on_decided(lambda d: decided.append(d) if d.decision == "final" else None)
    processors.append(processor)
    await processor.start()
    return processor, decided


def _spans(service: str) -> Sequence[ReadableSpan]:
    """One small trace, finished, ready to hand to an exporter."""
    provider = TracerProvider(resource=Resource.create({"service.name": service, "plumb.tenant": "forged"}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("auth-test")
    with tracer.start_as_current_span("invoke_agent auth-test"), tracer.start_as_current_span("execute_tool lookup"):
        pass
    provider.shutdown()
    return memory.get_finished_spans()


async def _send(protocol: str, port: int, token: str | None, service: str = "auth-svc") -> SpanExportResult:
    """Export one trace through the real SDK exporter (in a thread: it blocks)."""
    exporter: GrpcSpanExporter | HttpSpanExporter
    if protocol == "grpc":
        headers = {"authorization": f"Bearer {token}"} if token else None
        exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, headers=headers, timeout=5)
    else:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        exporter = HttpSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", headers=headers, timeout=5)
    try:
        return await asyncio.to_thread(exporter.export, _spans(service))
    finally:
        exporter.shutdown()


def _get(port: int, path: str, token: str | None = None) -> tuple[int, dict[str, str], str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def _tenants(decided: list[Decided]) -> list[Any]:
    return sorted(str(d.trajectory.attributes.get("plumb.tenant")) for d in decided)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
async def test_sdk_exporter_needs_the_token(
    protocol: str, tmp_path: Path, started: list[Processor], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    auth = {"bearer_tokens": [{"token": TOKEN_A, "tenant": "team-a"}, {"token": TOKEN_B}]}
    metrics = {"endpoint": "127.0.0.1:0", "auth": {"bearer_tokens": [{"token": TOKEN_B}]}}
    processor, decided = await _start(started, _config(tmp_path, auth, metrics=metrics))
    port = (processor.grpc_port if protocol == "grpc" else processor.http_port) or 0

    assert await _send(protocol, port, None) == SpanExportResult.FAILURE
    assert await _send(protocol, port, WRONG) == SpanExportResult.FAILURE
    # Both tokens are accepted at once (rotation): A carries a tenant, B none.
    assert await _send(protocol, port, TOKEN_A) == SpanExportResult.SUCCESS
    assert await _send(protocol, port, TOKEN_B) == SpanExportResult.SUCCESS
    await wait_until(lambda: len(decided) == 2, DEADLINE, "both accepted trajectories decided")
    # The tenant of the token, not the one the client put on its resource; none for B's.
    assert _tenants(decided) == ["None", "team-a"]

    metrics_port = processor.metrics_port or 0
    status, headers, _ = await asyncio.to_thread(_get, metrics_port, "/metrics")
    assert status == 401 and headers.get("WWW-Authenticate") == "Bearer"
    status, _, _ = await asyncio.to_thread(_get, metrics_port, "/metrics", TOKEN_A)
    assert status == 401  # the metrics listener has its own tokens
    status, _, text = await asyncio.to_thread(_get, metrics_port, "/metrics", TOKEN_B)
    assert status == 200
    assert metric(text, "plumb_auth_failures_total", listener=protocol, reason="missing") == 1
    assert metric(text, "plumb_auth_failures_total", listener=protocol, reason="invalid") == 1
    assert metric(text, "plumb_auth_failures_total", listener="metrics", reason="missing") == 1
    assert metric(text, "plumb_auth_failures_total", listener="metrics", reason="invalid") == 1
    assert metric(text, "plumb_tenant_spans_received_total", tenant="team-a") == 2
    assert metric(text, "plumb_spans_received_total", receiver=protocol) == 4
    # Probes stay open without protect_health.
    assert (await asyncio.to_thread(_get, metrics_port, "/healthz"))[0] == 200
    assert (await asyncio.to_thread(_get, metrics_port, "/readyz"))[0] == 200

    assert "refused an unauthenticated request on" in caplog.text
    for secret in (TOKEN_A, TOKEN_B, WRONG):
        assert secret not in caplog.text


async def test_watch_needs_the_token(
    tmp_path: Path, started: list[Processor], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    processor, _ = await _start(started, _config(tmp_path, {"bearer_tokens": [{"token": TOKEN_A}]}))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}")
    try:
        stub: Any = watch_pb2_grpc.VerdictServiceStub(channel)  # type: ignore[no-untyped-call]
        for metadata in ((), (("authorization", f"Bearer {WRONG}"),), (("authorization", TOKEN_A),)):
            call = stub.Watch(watch_pb2.WatchRequest(), metadata=metadata, timeout=DEADLINE)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in call:
                    pytest.fail("a Watch call without the right token received a record")
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert ("www-authenticate", "Bearer") in tuple(refused.value.trailing_metadata() or ())

        call = stub.Watch(
            watch_pb2.WatchRequest(), metadata=(("authorization", f"Bearer {TOKEN_A}"),), timeout=DEADLINE
        )
        await call.initial_metadata()  # subscribed
        assert await _send("grpc", processor.grpc_port or 0, TOKEN_A, "watched-svc") == SpanExportResult.SUCCESS
        async with asyncio.timeout(DEADLINE):
            async for message in call:
                if message.decision == "final":
                    break
        assert message.service == "watched-svc"
        call.cancel()
    finally:
        await channel.close()
    assert processor.metrics.auth_failures.labels("grpc", "missing")._value.get() == 1
    assert processor.metrics.auth_failures.labels("grpc", "invalid")._value.get() == 2
    for secret in (TOKEN_A, WRONG):
        assert secret not in caplog.text


async def test_token_file_rotation(tmp_path: Path, started: list[Processor]) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN_A + "\n")
    auth = {"bearer_tokens": [{"token_file": str(token_file), "tenant": "rotating"}]}
    processor, decided = await _start(started, _config(tmp_path, auth))
    http_port = processor.http_port or 0
    assert await _send("http", http_port, TOKEN_A) == SpanExportResult.SUCCESS

    # The Secret is updated in place (as a kubelet does, through a rename).
    rotated = tmp_path / "token.new"
    rotated.write_text(TOKEN_B + "-rotated\n")
    os.replace(rotated, token_file)
    assert await _send("http", http_port, TOKEN_A) == SpanExportResult.FAILURE
    assert await _send("http", http_port, TOKEN_B + "-rotated") == SpanExportResult.SUCCESS
    assert await _send("grpc", processor.grpc_port or 0, TOKEN_B + "-rotated") == SpanExportResult.SUCCESS
    await wait_until(lambda: len(decided) == 3, DEADLINE, "the accepted trajectories decided")
    assert _tenants(decided) == ["rotating"] * 3
    assert processor.metrics.tenant_spans_received.labels("rotating")._value.get() == 6


async def test_protect_health(tmp_path: Path, started: list[Processor]) -> None:
    metrics = {"endpoint": "127.0.0.1:0", "auth": {"bearer_tokens": [{"token": TOKEN_A}], "protect_health": True}}
    processor, _ = await _start(started, _config(tmp_path, metrics=metrics))
    port = processor.metrics_port or 0
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await asyncio.to_thread(_get, port, path))[0] == 401
        assert (await asyncio.to_thread(_get, port, path, TOKEN_A))[0] == 200
    # The receivers have no auth here: they take spans as before.
    assert await _send("http", processor.http_port or 0, None) == SpanExportResult.SUCCESS


def test_token_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUMB_TEST_TOKEN", TOKEN_A)
    path = tmp_path / "plumb.yaml"
    path.write_text("receivers:\n  http:\n    auth:\n      bearer_tokens:\n        - token: ${env:PLUMB_TEST_TOKEN}\n")
    config = load_config(path)
    assert config.receivers.http.auth is not None
    assert config.receivers.http.auth.bearer_tokens[0].token == TOKEN_A
    assert TOKEN_A not in repr(config)
    for bad in ({"bearer_tokens": []}, {"bearer_tokens": [{"tenant": "x"}]},
                {"bearer_tokens": [{"token": "a", "token_file": "b"}]}, {"bearer_tokens": [{"token": "a"}], "x": 1}):
        with pytest.raises(ConfigError):
            load_config(None, {"receivers": {"grpc": {"auth": bad}}})


async def test_refuses_to_listen_beyond_loopback_unprotected(tmp_path: Path) -> None:
    data = _config(tmp_path)
    data["receivers"]["grpc"]["endpoint"] = "0.0.0.0:0"
    data["metrics"]["endpoint"] = "[::]:0"
    processor = Processor(load_config(None, data))
    try:
        with pytest.raises(ConfigError) as refused:
            await processor.start()
        message = str(refused.value)
        assert "receivers.grpc" in message and "0.0.0.0:0" in message
        assert "metrics" in message and "[::]:0" in message
        assert "receivers.http" not in message  # on 127.0.0.1
        assert processor.grpc_port is None and processor.http_port is None  # nothing was bound
    finally:
        await processor.stop(0)

    # Auth, or an explicit insecure: true, makes it acceptable.
    data["receivers"]["grpc"]["auth"] = {"bearer_tokens": [{"token": TOKEN_A}]}
    data["metrics"]["insecure"] = True
    assert exposure_errors(load_config(None, data)) == []
    for host in ("127.0.0.2", "localhost", "[::1]"):
        assert exposure_errors(load_config(None, {"receivers": {"http": {"endpoint": f"{host}:4318"}}})) == []
    assert exposure_errors(load_config(None, {"receivers": {"http": {"endpoint": "plumb.example:4318"}}}))


def test_cli_exits_2_naming_the_listener(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "otel_plumb", "run", "--grpc", "127.0.0.1:0", "--http", "0.0.0.0:0",
         "--metrics", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "receivers.http" in result.stderr and "0.0.0.0:0" in result.stderr


async def test_campaign_watch_source_sends_the_token(
    tmp_path: Path, started: list[Processor], monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from otel_plumb.campaign.collect import WatchSource
    from otel_plumb.campaign.config import Traces
    from otel_plumb.campaign.engine import make_source

    processor, _ = await _start(started, _config(tmp_path, {"bearer_tokens": [{"token": TOKEN_A}]}))
    target = f"grpc://127.0.0.1:{processor.grpc_port}"

    refused = WatchSource(target)
    await refused.start()
    try:
        await wait_until(lambda: refused.error is not None, DEADLINE, "the tokenless Watch refused")
        assert "UNAUTHENTICATED" in str(refused.error)
    finally:
        await refused.stop()

    monkeypatch.setenv("PLUMB_CAMPAIGN_TOKEN", TOKEN_A)
    traces = Traces(watch=target, token="${env:PLUMB_CAMPAIGN_TOKEN}")
    source = make_source(SimpleNamespace(spec=SimpleNamespace(traces=traces), path=tmp_path / "c.yaml"))  # type: ignore[arg-type]
    assert isinstance(source, WatchSource)
    offered: list[Any] = []
    monkeypatch.setattr(source.matcher, "offer", offered.append)
    await source.start()
    try:
        assert await _send("grpc", processor.grpc_port or 0, TOKEN_A, "campaign-svc") == SpanExportResult.SUCCESS
        await wait_until(lambda: any(t.service == "campaign-svc" for t in offered), DEADLINE, "the trajectory watched")
        assert source.error is None
    finally:
        await source.stop()


def test_docker_config_requires_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(__file__).resolve().parent.parent
    dockerfile = (root / "Dockerfile").read_text()
    assert "COPY configs/docker.yaml /etc/otel-plumb/docker.yaml" in dockerfile
    assert '"--config", "/etc/otel-plumb/docker.yaml"' in dockerfile
    monkeypatch.delenv("OTEL_PLUMB_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="OTEL_PLUMB_TOKEN"):
        load_config(root / "configs" / "docker.yaml")
    monkeypatch.setenv("OTEL_PLUMB_TOKEN", TOKEN_A)
    config = load_config(root / "configs" / "docker.yaml")
    assert exposure_errors(config) == []
    for listener in (config.receivers.grpc, config.receivers.http, config.metrics):
        assert listener.auth is not None and listener.auth.bearer_tokens[0].token == TOKEN_A
