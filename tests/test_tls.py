"""TLS and mTLS on every listener (OTLP/gRPC with Watch, OTLP/HTTP, metrics) and on the exporter,
with real handshakes on loopback and certificates generated here (``cryptography``)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_live_support import attribute, config, metric, run_agent, scrape, sent_spans, wait_until

from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.demo.run import policy_path
from otel_plumb.processor import Processor
from otel_plumb.processor.config import ConfigError, load_config
from otel_plumb.proto_gen import watch_pb2, watch_pb2_grpc

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
LOOPBACK = "127.0.0.1:0"


# ---- certificates --------------------------------------------------------------------------------


@dataclass
class Issued:
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> Issued:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return Issued(path / "cert.pem", path / "key.pem")


class CA:
    def __init__(self, name: str, where: Path) -> None:
        self.key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.file = where / f"{name}.pem"
        where.mkdir(parents=True, exist_ok=True)
        self.file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, where: Path, server: bool, alt_names: Sequence[x509.GeneralName] = ()) -> Issued:
        """A certificate with common name ``name``; a server's has 127.0.0.1 and localhost as
        subjectAltName, a client's ``alt_names`` if any."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
        elif alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(alt_names)), critical=False)
        return _write(where, key, builder.sign(self.key, hashes.SHA256()))


@dataclass
class PKI:
    ca: CA
    other: CA  # unrelated: trusting it must not be enough
    server: Issued
    client: Issued
    other_client: Issued  # a client certificate the listeners' CA did not sign
    root: Path


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    root = tmp_path / "pki"
    ca, other = CA("plumb-ca", root), CA("other-ca", root)
    return PKI(
        ca=ca,
        other=other,
        server=ca.issue("server", root / "server", server=True),
        client=ca.issue("client", root / "client", server=False),
        other_client=other.issue("intruder", root / "intruder", server=False),
        root=root,
    )


def server_tls(pki: PKI, mtls: bool = False, **extra: Any) -> dict[str, Any]:
    block: dict[str, Any] = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key), **extra}
    if mtls:
        block["client_ca_file"] = str(pki.ca.file)
    return block


def tls_processor(
    tmp_path: Path, pki: PKI, mtls: bool = False, backend: str | None = None, exporter_tls: dict[str, Any] | None = None
) -> Processor:
    block = server_tls(pki, mtls)
    data: dict[str, Any] = {
        "receivers": {"grpc": {"endpoint": LOOPBACK, "tls": block}, "http": {"endpoint": LOOPBACK, "tls": block}},
        "metrics": {"endpoint": LOOPBACK, "tls": block},
        "assembly": {"idle_timeout": 0.3, "tick": 0.05},
        "policies": [str(policy_path())],
    }
    if backend is not None:
        data["exporters"] = {"otlp": {
            "endpoint": backend, "state_dir": str(tmp_path / "state"),
            "retry": {"initial_interval": 0.05, "max_interval": 0.2},
            **({"tls": exporter_tls} if exporter_tls is not None else {}),
        }}  # fmt: skip
    return Processor(load_config(None, data))


# ---- clients -------------------------------------------------------------------------------------


def grpc_credentials(ca: Path, client: Issued | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=client.key.read_bytes() if client else None,
        certificate_chain=client.cert.read_bytes() if client else None,
    )


async def grpc_works(port: int, credentials: grpc.ChannelCredentials | None) -> bool:
    """Both services on the gRPC listener: an empty Export, and a Watch subscription."""
    target = f"127.0.0.1:{port}"
    async with (
        grpc.aio.secure_channel(target, credentials) if credentials else grpc.aio.insecure_channel(target)
    ) as channel:
        export = channel.unary_unary(
            EXPORT, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
        )
        try:
            await export(ExportTraceServiceRequest().SerializeToString(), timeout=5)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), exc
            export_ok = False
        else:
            export_ok = True
        stub: Any = watch_pb2_grpc.VerdictServiceStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Watch(watch_pb2.WatchRequest(), timeout=5)
        try:
            await call.initial_metadata()
            watch_ok = (await call.code()) is None if call.done() else True
        except grpc.aio.AioRpcError:
            watch_ok = False
        finally:
            call.cancel()
        if watch_ok and call.done():
            watch_ok = (await call.code()) in (grpc.StatusCode.CANCELLED, grpc.StatusCode.OK)
    assert export_ok == watch_ok, (export_ok, watch_ok)
    return export_ok


def client_ssl(ca: Path, client: Issued | None = None, **kw: Any) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    for name, value in kw.items():
        setattr(ctx, name, value)
    if client is not None:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    return ctx


async def http_works(url: str, ctx: ssl.SSLContext | None, post: bool) -> bool:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        try:
            if post:
                body = ExportTraceServiceRequest().SerializeToString()
                headers = {"Content-Type": "application/x-protobuf"}
                async with session.post(url, data=body, headers=headers, ssl=ctx if ctx else False) as resp:
                    return resp.status == 200
            async with session.get(url, ssl=ctx if ctx else False) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, ssl.SSLError, ConnectionError, TimeoutError):
            return False


async def all_listeners(processor: Processor, pki: PKI, ca: Path | None, client: Issued | None) -> dict[str, bool]:
    """Whether each listener answers a client trusting ``ca`` (none: plaintext) with ``client``'s
    certificate."""
    assert processor.grpc_port and processor.http_port and processor.metrics_port
    ctx = client_ssl(ca, client) if ca else None
    scheme = "https" if ca else "http"
    return {
        "grpc": await grpc_works(processor.grpc_port, grpc_credentials(ca, client) if ca else None),
        "http": await http_works(f"{scheme}://127.0.0.1:{processor.http_port}/v1/traces", ctx, post=True),
        "metrics": await http_works(f"{scheme}://127.0.0.1:{processor.metrics_port}/metrics", ctx, post=False),
    }


async def eventually(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """``wait_until`` for a check that does blocking I/O (run on a thread, off the server's loop)."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


NONE = {"grpc": False, "http": False, "metrics": False}
ALL = {"grpc": True, "http": True, "metrics": True}


# ---- listeners -----------------------------------------------------------------------------------


async def test_tls_listeners_refuse_plaintext_and_the_wrong_ca(tmp_path: Path, pki: PKI) -> None:
    processor = tls_processor(tmp_path, pki)
    await processor.start()
    try:
        assert await all_listeners(processor, pki, None, None) == NONE
        assert await all_listeners(processor, pki, pki.other.file, None) == NONE
        assert await all_listeners(processor, pki, pki.ca.file, None) == ALL
    finally:
        await processor.stop(0)


async def test_mtls_listeners_want_a_client_certificate_from_their_ca(tmp_path: Path, pki: PKI) -> None:
    processor = tls_processor(tmp_path, pki, mtls=True)
    await processor.start()
    try:
        assert await all_listeners(processor, pki, None, None) == NONE
        assert await all_listeners(processor, pki, pki.ca.file, None) == NONE
        assert await all_listeners(processor, pki, pki.ca.file, pki.other_client) == NONE
        assert await all_listeners(processor, pki, pki.other.file, pki.client) == NONE
        assert await all_listeners(processor, pki, pki.ca.file, pki.client) == ALL
    finally:
        await processor.stop(0)


async def test_min_version_13_refuses_a_tls12_client(tmp_path: Path, pki: PKI) -> None:
    block = server_tls(pki, min_version="1.3")
    receivers = {"grpc": {"enabled": False}, "http": {"endpoint": LOOPBACK, "tls": block}}
    processor = Processor(config(tmp_path, receivers=receivers, metrics={"endpoint": LOOPBACK, "tls": block}))
    await processor.start()
    try:
        url = f"https://127.0.0.1:{processor.metrics_port}/metrics"
        assert await http_works(url, client_ssl(pki.ca.file), post=False)
        assert not await http_works(url, client_ssl(pki.ca.file, maximum_version=ssl.TLSVersion.TLSv1_2), post=False)
    finally:
        await processor.stop(0)


def sdk_provider(
    exporter: GrpcSpanExporter | HttpSpanExporter, name: str
) -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=50))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def backend_credentials(pki: PKI, require_client_cert: bool) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(pki.server.key.read_bytes(), pki.server.cert.read_bytes())],
        root_certificates=pki.ca.file.read_bytes() if require_client_cert else None,
        require_client_auth=require_client_cert,
    )


async def test_sdk_exporters_over_mtls_reach_an_mtls_backend(
    tmp_path: Path, pki: PKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OTel SDK's gRPC and HTTP exporters, with client certificates, send to mTLS listeners;
    the processor exports the annotated spans to a backend that also wants a client certificate."""
    # requests lets these override the session's CA file, which is how the SDK passes certificate_file.
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    backend = OtlpBackend(credentials=backend_credentials(pki, require_client_cert=True))
    await backend.start(0)
    exporter_tls = {"ca_file": str(pki.ca.file), "cert_file": str(pki.client.cert), "key_file": str(pki.client.key)}
    processor = tls_processor(tmp_path, pki, mtls=True, backend=backend.endpoint, exporter_tls=exporter_tls)
    await processor.start()
    try:
        assert backend.endpoint.startswith("grpcs://")
        grpc_agent, grpc_sent = sdk_provider(
            GrpcSpanExporter(
                endpoint=f"127.0.0.1:{processor.grpc_port}", credentials=grpc_credentials(pki.ca.file, pki.client)
            ),
            "ap-service-grpc",
        )
        http_agent, http_sent = sdk_provider(
            HttpSpanExporter(
                endpoint=f"https://127.0.0.1:{processor.http_port}/v1/traces",
                certificate_file=str(pki.ca.file),
                client_certificate_file=str(pki.client.cert),
                client_key_file=str(pki.client.key),
            ),
            "ap-service-http",
        )
        for provider in (grpc_agent, http_agent):
            await asyncio.to_thread(run_agent, provider)
        sent = {**sent_spans(grpc_sent), **sent_spans(http_sent)}
        assert len(sent) > 10
        assert await backend.wait_for_spans(len(sent), 30), f"{backend.span_count} of {len(sent)} spans arrived"
        arrived = {s.span_id.hex(): s for s in backend.spans()}
        assert set(sent) <= set(arrived)
        roots = [s for s in arrived.values() if not s.parent_span_id]
        agent_roots = [s for s in roots if s.name != "plumb.verdict"]
        assert {attribute(s, "plumb.verdict") for s in agent_roots} == {"conformant", "violating"}
    finally:
        await processor.stop(5)
        await backend.stop()


def plain_processor(tmp_path: Path, backend: str, exporter_tls: dict[str, Any] | None) -> Processor:
    data: dict[str, Any] = {
        "receivers": {"grpc": {"endpoint": LOOPBACK}, "http": {"endpoint": LOOPBACK}},
        "metrics": {"endpoint": LOOPBACK},
        "assembly": {"idle_timeout": 0.3, "tick": 0.05},
        "policies": [str(policy_path())],
        "exporters": {"otlp": {
            "endpoint": backend, "state_dir": str(tmp_path / "state"), "timeout": 2,
            "retry": {"initial_interval": 0.05, "max_interval": 0.2},
            **({"tls": exporter_tls} if exporter_tls is not None else {}),
        }},
    }  # fmt: skip
    return Processor(load_config(None, data))


async def send_one_trace(port: int) -> None:
    provider, _ = sdk_provider(GrpcSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True), "tls-check")
    with provider.get_tracer("t").start_as_current_span("invoke_agent"):
        pass
    await asyncio.to_thread(provider.force_flush)
    await asyncio.to_thread(provider.shutdown)


@pytest.mark.parametrize("case", ["wrong_ca", "system_cas", "no_client_cert"])
async def test_exporter_tls_failures_are_retried_not_delivered(tmp_path: Path, pki: PKI, case: str) -> None:
    backend = OtlpBackend(credentials=backend_credentials(pki, require_client_cert=case == "no_client_cert"))
    await backend.start(0)
    exporter_tls = {
        "wrong_ca": {"ca_file": str(pki.other.file)},
        "system_cas": None,  # grpcs:// with no tls block: the system CAs, which do not know this CA
        "no_client_cert": {"ca_file": str(pki.ca.file)},
    }[case]
    processor = plain_processor(tmp_path, backend.endpoint, exporter_tls)
    await processor.start()
    try:
        assert processor.grpc_port and processor.metrics_port
        await send_one_trace(processor.grpc_port)
        port = processor.metrics_port

        async def errors() -> bool:
            return metric(await asyncio.to_thread(scrape, port), "plumb_export_errors_total") >= 2

        await eventually(errors, 20, "export errors to be counted and retried")
        assert backend.span_count == 0
        assert metric(await asyncio.to_thread(scrape, port), "plumb_export_queue_spans") >= 1
    finally:
        await processor.stop(0)
        await backend.stop()


async def test_https_exporter_with_ca_file_client_cert_and_name_override(tmp_path: Path, pki: PKI) -> None:
    """https:// to another processor's mTLS OTLP/HTTP receiver, at 127.0.0.1 with the certificate
    checked against ``localhost`` (server_name_override)."""
    downstream = tls_processor(tmp_path / "downstream", pki, mtls=True)
    received: list[object] = []
    downstream.on_decided(received.append)
    await downstream.start()
    exporter_tls = {
        "ca_file": str(pki.ca.file), "cert_file": str(pki.client.cert), "key_file": str(pki.client.key),
        "server_name_override": "localhost",
    }  # fmt: skip
    upstream = plain_processor(tmp_path / "upstream", f"https://127.0.0.1:{downstream.http_port}", exporter_tls)
    await upstream.start()
    try:
        assert upstream.grpc_port
        await send_one_trace(upstream.grpc_port)
        await wait_until(lambda: len(received) >= 1, 20, "the trace to reach the downstream processor over mTLS")
    finally:
        await upstream.stop(5)
        await downstream.stop(0)


async def test_https_exporter_insecure_skip_verify_only_when_asked(tmp_path: Path, pki: PKI) -> None:
    downstream = tls_processor(tmp_path / "downstream", pki)
    received: list[object] = []
    downstream.on_decided(received.append)
    await downstream.start()
    upstream = plain_processor(
        tmp_path / "upstream", f"https://127.0.0.1:{downstream.http_port}", {"insecure_skip_verify": True}
    )
    await upstream.start()
    try:
        assert upstream.grpc_port
        await send_one_trace(upstream.grpc_port)
        await wait_until(lambda: len(received) >= 1, 20, "the trace to arrive with verification skipped")
    finally:
        await upstream.stop(5)
        await downstream.stop(0)


# ---- reload --------------------------------------------------------------------------------------


def presented_cert(port: int, ca: Path) -> bytes:
    """The DER certificate a new handshake on ``port`` is given."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


async def test_renewed_certificate_is_served_within_the_reload_interval(tmp_path: Path, pki: PKI) -> None:
    live = pki.root / "live"
    live.mkdir()
    cert, key = live / "tls.crt", live / "tls.key"
    cert.write_bytes(pki.server.cert.read_bytes())
    key.write_bytes(pki.server.key.read_bytes())
    block = {"cert_file": str(cert), "key_file": str(key), "reload_interval": "200ms"}
    receivers = {"grpc": {"endpoint": LOOPBACK, "tls": block}, "http": {"endpoint": LOOPBACK, "tls": block}}
    processor = Processor(config(tmp_path, receivers=receivers, metrics={"endpoint": LOOPBACK, "tls": block}))
    await processor.start()
    try:
        ports = {"grpc": processor.grpc_port, "http": processor.http_port, "metrics": processor.metrics_port}
        old = pki.server.cert.read_bytes()
        old_der = x509.load_pem_x509_certificate(old).public_bytes(serialization.Encoding.DER)
        for port in ports.values():
            assert port and await asyncio.to_thread(presented_cert, port, pki.ca.file) == old_der
        renewed = pki.ca.issue("server-renewed", pki.root / "renewed", server=True)
        new_der = x509.load_pem_x509_certificate(renewed.cert.read_bytes()).public_bytes(serialization.Encoding.DER)
        # Rotated as Kubernetes and cert-manager do: new files moved into place.
        for src, dst in ((renewed.key, key), (renewed.cert, cert)):
            tmp = dst.with_suffix(".new")
            tmp.write_bytes(src.read_bytes())
            os.replace(tmp, dst)
        for name, port in ports.items():
            assert port

            async def current(port: int = port) -> bool:
                return await asyncio.to_thread(presented_cert, port, pki.ca.file) == new_der

            await eventually(current, 10, f"the {name} listener to serve the renewed certificate")
        # And the renewed certificate works for real requests.
        assert await all_listeners(processor, pki, pki.ca.file, None) == ALL
    finally:
        await processor.stop(0)


# ---- refused at start ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "change", "message"),
    [
        ("receivers.http", {"cert_file": "missing.pem"}, "receivers.http.tls.cert_file: cannot read"),
        ("receivers.grpc", {"key_file": "missing.pem"}, "receivers.grpc.tls.key_file: cannot read"),
        ("metrics", {"client_ca_file": "missing.pem"}, "metrics.tls.client_ca_file: cannot read"),
        ("receivers.grpc", {"cert_file": "garbage"}, "receivers.grpc.tls.cert_file/key_file"),
        ("metrics", {"key_file": "other_key"}, "metrics.tls.cert_file/key_file"),
        ("receivers.http", {"client_ca_file": "garbage"}, "receivers.http.tls.client_ca_file"),
        ("receivers.grpc", {"min_version": "1.3"}, "receivers.grpc.tls.min_version"),
    ],
)
async def test_unusable_tls_settings_are_refused_at_start_naming_the_key(
    tmp_path: Path, pki: PKI, section: str, change: dict[str, str], message: str
) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    files = {"missing.pem": str(tmp_path / "missing.pem"), "garbage": str(garbage), "other_key": str(pki.client.key)}
    block = server_tls(pki) | {k: files.get(v, v) for k, v in change.items()}
    sections: dict[str, Any] = {
        "receivers": {"grpc": {"endpoint": LOOPBACK}, "http": {"endpoint": LOOPBACK}},
        "metrics": {"endpoint": LOOPBACK},
    }
    if section == "metrics":
        sections["metrics"]["tls"] = block
    else:
        sections["receivers"][section.split(".")[1]]["tls"] = block
    processor = Processor(config(tmp_path, **sections))
    try:
        with pytest.raises(OSError, match=message.replace(".", r"\.")):
            await processor.start()
        assert processor.grpc_port is None and processor.http_port is None and processor.metrics_port is None
    finally:
        await processor.stop(0)


async def test_exporter_tls_settings_refused(tmp_path: Path, pki: PKI) -> None:
    with pytest.raises(ConfigError, match="tls is set but grpc://"):
        load_config(None, {"exporters": {"otlp": {"endpoint": "grpc://127.0.0.1:4317", "tls": {}}}})
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(None, {"receivers": {"http": {"tls": {**server_tls(pki), "ca": "x"}}}})
    for tls_block, message in (
        ({"insecure_skip_verify": True}, r"exporters\.otlp\.tls\.insecure_skip_verify"),
        ({"ca_file": str(tmp_path / "missing.pem")}, r"exporters\.otlp\.tls\.ca_file: cannot read"),
        ({"ca_file": str(pki.ca.file), "cert_file": str(pki.client.cert)}, "cert_file and key_file go together"),
    ):
        processor = plain_processor(tmp_path / "state", "grpcs://127.0.0.1:1", tls_block)
        try:
            with pytest.raises(OSError, match=message):
                await processor.start()
        finally:
            await processor.stop(0)


# ---- the campaign's Watch client -----------------------------------------------------------------


async def test_campaign_watch_source_over_mtls(tmp_path: Path, pki: PKI, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from otel_plumb.campaign.collect import WatchSource
    from otel_plumb.campaign.config import Traces
    from otel_plumb.campaign.engine import make_source

    processor = tls_processor(tmp_path, pki, mtls=True)
    await processor.start()
    try:
        target = f"grpcs://127.0.0.1:{processor.grpc_port}"
        refused = WatchSource(target, tls={"ca_file": pki.ca.file.read_bytes()})  # no client certificate
        try:
            await refused.start()
        except (grpc.aio.AioRpcError, TimeoutError):
            pass
        else:
            await wait_until(lambda: refused.error is not None, 10, "the Watch without a client certificate refused")
        finally:
            await refused.stop()

        relative = {"ca_file": "pki/plumb-ca.pem", "cert_file": "pki/client/cert.pem", "key_file": "pki/client/key.pem"}
        traces = Traces.model_validate({"watch": target, "tls": relative})
        spec = SimpleNamespace(traces=traces)
        campaign = SimpleNamespace(spec=spec, path=tmp_path / "c.yaml", resolve=lambda p: tmp_path / p)
        source = make_source(campaign)  # type: ignore[arg-type]
        assert isinstance(source, WatchSource)
        offered: list[Any] = []
        monkeypatch.setattr(source.matcher, "offer", offered.append)
        await source.start()
        try:
            provider, _ = sdk_provider(
                GrpcSpanExporter(
                    endpoint=f"127.0.0.1:{processor.grpc_port}", credentials=grpc_credentials(pki.ca.file, pki.client)
                ),
                "watched-over-tls",
            )
            with provider.get_tracer("t").start_as_current_span("invoke_agent"):
                pass
            await asyncio.to_thread(provider.shutdown)
            await wait_until(
                lambda: any(t.service == "watched-over-tls" for t in offered), 20, "the watched trajectory"
            )
        finally:
            await source.stop()
    finally:
        await processor.stop(0)
    with pytest.raises(ValueError, match=r"traces\.tls goes with"):
        Traces.model_validate({"watch": "grpc://127.0.0.1:1", "tls": {}})
