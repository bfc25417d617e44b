"""Client-certificate identity as a credential on mTLS listeners: real handshakes on loopback with
certificates made here (``cryptography``), the OTel SDK's exporters presenting them, Watch and
/metrics, tenants from the matching entry, refusals counted, and bearer tokens alongside."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from cryptography import x509
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_live_support import metric, wait_until
from test_tls import CA, Issued, client_ssl, grpc_credentials

from otel_plumb.model import Decided
from otel_plumb.processor import Processor, load_config
from otel_plumb.processor.config import ConfigError
from otel_plumb.proto_gen import watch_pb2, watch_pb2_grpc
from otel_plumb.receive.auth import ClientCertificate, PeerIdentity

DEADLINE = 20.0
TOKEN = "tok-cert-listener-0123456789"


@dataclass
class Certs:
    ca: CA
    server: Issued
    by_cn: Issued  # common name agent-a: allowed, tenant team-a
    by_uri: Issued  # SPIFFE ID under team-b: allowed, tenant team-b
    by_dns: Issued  # DNS name scraper.ops.svc: allowed, no tenant
    stranger: Issued  # signed by the same CA, matching no entry


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    root = tmp_path / "pki"
    ca = CA("plumb-ca", root)
    return Certs(
        ca=ca,
        server=ca.issue("server", root / "server", server=True),
        by_cn=ca.issue("agent-a", root / "by-cn", server=False),
        by_uri=ca.issue(
            "worker-17", root / "by-uri", server=False,
            alt_names=[x509.UniformResourceIdentifier("spiffe://example.org/team-b/worker")],
        ),
        by_dns=ca.issue(
            "scraper", root / "by-dns", server=False, alt_names=[x509.DNSName("Scraper.Ops.svc")]
        ),
        stranger=ca.issue(
            "agent-b", root / "stranger", server=False,
            alt_names=[x509.UniformResourceIdentifier("spiffe://example.org/team-c/worker")],
        ),
    )  # fmt: skip


AUTH: dict[str, Any] = {
    "bearer_tokens": [{"token": TOKEN, "tenant": "by-token"}],
    "client_certificates": [
        {"common_name": "agent-a", "tenant": "team-a"},
        {"uri": "spiffe://example.org/team-b/*", "tenant": "team-b"},
        {"dns_name": "scraper.ops.*"},
    ],
}


def _data(certs: Certs, auth: dict[str, Any] = AUTH) -> dict[str, Any]:
    tls = {"cert_file": str(certs.server.cert), "key_file": str(certs.server.key), "client_ca_file": str(certs.ca.file)}
    listener = {"endpoint": "127.0.0.1:0", "tls": tls, "auth": auth}
    return {
        "receivers": {"grpc": listener, "http": listener},
        "metrics": listener,
        "assembly": {"idle_timeout": 0.2, "tick": 0.05},
        "shutdown": {"grace_period": 2},
    }


@pytest.fixture
async def processor(certs: Certs) -> AsyncIterator[tuple[Processor, list[Decided]]]:
    started = Processor(load_config(None, _data(certs)))
    decided: list[Decided] = []
    started.on_decided(lambda d: decided.append(d) if d.decision == "final" else None)
    await started.start()
    try:
        yield started, decided
    finally:
        await started.stop(1)


def _spans(service: str) -> Sequence[ReadableSpan]:
    provider = TracerProvider(resource=Resource.create({"service.name": service, "plumb.tenant": "forged"}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("cert-test")
    with tracer.start_as_current_span("invoke_agent cert-test"), tracer.start_as_current_span("execute_tool lookup"):
        pass
    provider.shutdown()
    return memory.get_finished_spans()


async def _send(protocol: str, port: int, certs: Certs, client: Issued, service: str, token: str | None = None) -> Any:
    """Export one trace through the SDK's exporter over mTLS with ``client``'s certificate."""
    exporter: GrpcSpanExporter | HttpSpanExporter
    if protocol == "grpc":
        headers = {"authorization": f"Bearer {token}"} if token else None
        credentials = grpc_credentials(certs.ca.file, client)
        exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{port}", credentials=credentials, headers=headers, timeout=5)
    else:
        exporter = HttpSpanExporter(
            endpoint=f"https://127.0.0.1:{port}/v1/traces",
            certificate_file=str(certs.ca.file),
            client_certificate_file=str(client.cert),
            client_key_file=str(client.key),
            headers={"Authorization": f"Bearer {token}"} if token else None,
            timeout=5,
        )
    try:
        return await asyncio.to_thread(exporter.export, _spans(service))
    finally:
        exporter.shutdown()


async def _get_metrics(port: int, ctx: ssl.SSLContext, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"https://127.0.0.1:{port}/metrics", ssl=ctx, headers=headers) as resp,
    ):
        return resp.status, await resp.text()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
async def test_allowed_certificates_authenticate_with_their_tenant(
    protocol: str,
    certs: Certs,
    processor: tuple[Processor, list[Decided]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # they would override certificate_file
        monkeypatch.delenv(name, raising=False)
    proc, decided = processor
    port = (proc.grpc_port if protocol == "grpc" else proc.http_port) or 0

    assert await _send(protocol, port, certs, certs.by_cn, "svc-cn") == SpanExportResult.SUCCESS
    assert await _send(protocol, port, certs, certs.by_uri, "svc-uri") == SpanExportResult.SUCCESS
    assert await _send(protocol, port, certs, certs.by_dns, "svc-dns") == SpanExportResult.SUCCESS
    # Same CA, so the handshake succeeds; no entry matches and there is no token: refused.
    assert await _send(protocol, port, certs, certs.stranger, "svc-stranger") == SpanExportResult.FAILURE
    # A token works alongside, on a connection whose certificate matches nothing.
    assert await _send(protocol, port, certs, certs.stranger, "svc-token", TOKEN) == SpanExportResult.SUCCESS
    # A wrong token is refused even with a certificate that would be accepted.
    assert await _send(protocol, port, certs, certs.by_cn, "svc-wrong", "tok-wrong") == SpanExportResult.FAILURE

    await wait_until(lambda: len(decided) == 4, DEADLINE, "the four accepted trajectories decided")
    tenants = {d.trajectory.service: d.trajectory.attributes.get("plumb.tenant") for d in decided}
    # The entry's tenant replaces the one the client claimed; the DNS entry has none.
    assert tenants == {"svc-cn": "team-a", "svc-uri": "team-b", "svc-dns": None, "svc-token": "by-token"}

    status, text = await _get_metrics(proc.metrics_port or 0, client_ssl(certs.ca.file, certs.by_dns))
    assert status == 200
    assert metric(text, "plumb_auth_failures_total", listener=protocol, reason="certificate") == 1
    assert metric(text, "plumb_auth_failures_total", listener=protocol, reason="invalid") == 1
    assert metric(text, "plumb_tenant_spans_received_total", tenant="team-a") == 2
    assert metric(text, "plumb_tenant_spans_received_total", tenant="team-b") == 2
    assert "no bearer token, and a client certificate matching no allowed identity" in caplog.text


async def test_watch_and_metrics_take_the_certificate(certs: Certs, processor: tuple[Processor, list[Decided]]) -> None:
    proc, _ = processor
    assert proc.grpc_port and proc.metrics_port

    async def watch(client: Issued) -> grpc.StatusCode | None:
        """The status a Watch subscription ends with (None: it was subscribed and stays open)."""
        async with grpc.aio.secure_channel(
            f"127.0.0.1:{proc.grpc_port}", grpc_credentials(certs.ca.file, client)
        ) as channel:
            stub: Any = watch_pb2_grpc.VerdictServiceStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Watch(watch_pb2.WatchRequest(), timeout=DEADLINE)
            try:
                await call.initial_metadata()
                if not call.done():
                    return None
                return await call.code()  # type: ignore[no-any-return]
            finally:
                call.cancel()

    assert await watch(certs.by_uri) is None
    assert await watch(certs.stranger) == grpc.StatusCode.UNAUTHENTICATED
    assert (await _get_metrics(proc.metrics_port, client_ssl(certs.ca.file, certs.by_dns)))[0] == 200
    assert (await _get_metrics(proc.metrics_port, client_ssl(certs.ca.file, certs.stranger)))[0] == 401
    assert proc.metrics.auth_failures.labels("grpc", "certificate")._value.get() == 1
    assert proc.metrics.auth_failures.labels("metrics", "certificate")._value.get() == 1


async def test_a_listener_with_certificates_only_ignores_authorization_headers(certs: Certs) -> None:
    """An Authorization header meant for another hop does not make a certificate-only listener
    refuse a client whose certificate it accepts."""
    proc = Processor(load_config(None, _data(certs, {"client_certificates": [{"common_name": "agent-a"}]})))
    await proc.start()
    try:
        port = proc.metrics_port or 0
        elsewhere = {"Authorization": "Bearer elsewhere"}
        assert (await _get_metrics(port, client_ssl(certs.ca.file, certs.by_cn), elsewhere))[0] == 200
        assert (await _get_metrics(port, client_ssl(certs.ca.file, certs.stranger)))[0] == 401
        assert proc.metrics.auth_failures.labels("metrics", "certificate")._value.get() == 1
    finally:
        await proc.stop(0)


@pytest.mark.parametrize("listener", ["receivers.grpc", "receivers.http", "metrics"])
def test_certificates_need_the_listeners_client_ca(tmp_path: Path, listener: str) -> None:
    path = tmp_path / "c.yaml"
    indent = "  " * listener.count(".")
    nested = "".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(listener.split(".")))
    path.write_text(
        nested
        + f"{indent}  tls: {{cert_file: s.pem, key_file: s.key}}\n"
        + f"{indent}  auth:\n{indent}    client_certificates: [{{common_name: agent-a}}]\n"
    )
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    line = listener.count(".") + 3  # the line of auth:
    assert f"c.yaml:{line}: {listener}.auth: " in str(refused.value)
    assert "client_certificates needs tls.client_ca_file" in str(refused.value)


@pytest.mark.parametrize(
    "auth, error",
    [
        ({}, "auth needs bearer_tokens, client_certificates or both"),
        ({"client_certificates": [{"tenant": "t"}]}, "needs common_name, dns_name or uri"),
        ({"client_certificates": [{"common_name": "a", "subject": "b"}]}, "unknown key"),
    ],
)
def test_bad_auth_blocks(auth: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        load_config(None, {"receivers": {"http": {"auth": auth}}})


A_URI = ("agent-a",), (), ("spiffe://e.org/a",)  # common names, DNS names, URIs of one peer


@pytest.mark.parametrize(
    "entry, peer, accepted",
    [
        ({"common_name": "agent-a"}, PeerIdentity(("agent-a",)), True),
        ({"common_name": "agent-a"}, PeerIdentity(("Agent-A",)), False),  # common names: case-sensitive
        ({"common_name": "agent-*"}, PeerIdentity(("agent-42",)), True),
        ({"dns_name": "*.team-a.svc"}, PeerIdentity((), ("x.y.TEAM-A.svc",)), True),  # DNS: any case
        ({"dns_name": "*.team-a.svc"}, PeerIdentity(("x.team-a.svc",)), False),  # a CN is not a DNS name
        ({"uri": "spiffe://e.org/a/*"}, PeerIdentity((), (), ("spiffe://e.org/b", "spiffe://e.org/a/x")), True),
        # Every pattern of an entry must match.
        ({"common_name": "agent-a", "uri": "spiffe://e.org/a"}, PeerIdentity(*A_URI), True),
        ({"common_name": "agent-b", "uri": "spiffe://e.org/a"}, PeerIdentity(*A_URI), False),
        ({"common_name": "agent-a", "uri": "spiffe://e.org/b"}, PeerIdentity(*A_URI), False),
        ({"uri": "spiffe://e.org/a"}, PeerIdentity(), False),
    ],
)
def test_entry_matching(entry: dict[str, str], peer: PeerIdentity, accepted: bool) -> None:
    assert ClientCertificate.model_validate(entry).matches(peer) is accepted
