"""The Docker image's config: TLS and a bearer token on every listener from the first start. With
no certificate mounted the processor makes a CA and a certificate, keeps them, and clients that
trust the CA connect; the image's HEALTHCHECK works on TLS and on plaintext listeners."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from test_live_support import config, wait_until

from otel_plumb.processor import Processor, load_config

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "docker-token-0123456789abcdef"


def docker_config(tmp_path: Path) -> Path:
    """configs/docker.yaml with the state volume under tmp_path and loopback ports."""
    text = (ROOT / "configs" / "docker.yaml").read_text().replace("/var/lib/otel-plumb", str(tmp_path / "state"))
    for port in ("4317", "4318", "9464"):
        text = text.replace(f"0.0.0.0:{port}", "127.0.0.1:0")
    path = tmp_path / "docker.yaml"
    path.write_text(text)
    return path


def get(url: str, context: ssl.SSLContext | None, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5, context=context) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def healthcheck(port: int) -> int:
    """The Dockerfile's HEALTHCHECK command, on ``port``."""
    line = next(x for x in (ROOT / "Dockerfile").read_text().splitlines() if x.strip().startswith('CMD ["python"'))
    argv = json.loads(line.strip()[len("CMD "):])
    code = argv[2].replace("9464", str(port))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=20, check=False).returncode


async def test_docker_config_serves_tls_from_a_certificate_it_makes_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_PLUMB_TOKEN", TOKEN)
    path = docker_config(tmp_path)
    tls_dir = tmp_path / "state" / "tls"
    processor = Processor(load_config(path))
    await processor.start()
    try:
        assert {p.name for p in tls_dir.iterdir()} == {"tls.crt", "tls.key", "ca.crt"}
        assert (tls_dir / "tls.key").stat().st_mode & 0o077 == 0
        trusted = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
        url = f"https://localhost:{processor.metrics_port}/metrics"
        assert await asyncio.to_thread(get, url, trusted, TOKEN) == 200
        assert await asyncio.to_thread(get, url, trusted) == 401
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            await asyncio.to_thread(get, url, ssl.create_default_context(), TOKEN)
        assert await asyncio.to_thread(healthcheck, processor.metrics_port or 0) == 0

        def send() -> None:
            exporter = OTLPSpanExporter(
                endpoint=f"localhost:{processor.grpc_port}",
                credentials=grpc.ssl_channel_credentials(root_certificates=(tls_dir / "ca.crt").read_bytes()),
                headers={"authorization": f"Bearer {TOKEN}"},
            )
            provider = TracerProvider(resource=Resource.create({"service.name": "docker"}))
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            with provider.get_tracer("t").start_as_current_span("hello"):
                pass
            provider.shutdown()

        await asyncio.to_thread(send)
        await wait_until(lambda: processor.metrics.spans_received.labels("grpc")._value.get() >= 1, 10, "the span")
        certificate = (tls_dir / "tls.crt").read_bytes()
    finally:
        await processor.stop()
    # The next start serves the same certificate: clients keep trusting it.
    again = Processor(load_config(path))
    await again.start()
    try:
        assert (tls_dir / "tls.crt").read_bytes() == certificate
        trusted = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
        assert await asyncio.to_thread(get, f"https://127.0.0.1:{again.metrics_port}/metrics", trusted, TOKEN) == 200
    finally:
        await again.stop()


async def test_the_healthcheck_also_answers_for_a_plaintext_listener(tmp_path: Path) -> None:
    processor = Processor(config(tmp_path))
    await processor.start()
    try:
        assert await asyncio.to_thread(healthcheck, processor.metrics_port or 0) == 0
    finally:
        await processor.stop()
    assert await asyncio.to_thread(healthcheck, processor.metrics_port or 0) != 0  # nothing listens


def test_certificates_that_exist_are_used_as_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_plumb import tls

    cfg = load_config(None, {"metrics": {"endpoint": "127.0.0.1:0", "tls": {
        "cert_file": str(tmp_path / "tls.crt"), "key_file": str(tmp_path / "tls.key"),
        "self_signed_if_missing": True}}}).metrics.tls  # fmt: skip
    assert cfg is not None
    (tmp_path / "tls.key").write_text("mounted key, certificate still being written")
    assert tls.self_signed(cfg, "metrics.tls") is False  # one of the two exists: never overwritten
    with pytest.raises(tls.TLSError, match=r"metrics\.tls\.cert_file: cannot read"):
        tls.server_context(cfg, "metrics.tls")


def test_files_gone_mid_rotation_keep_the_old_certificate_and_make_no_new_one(tmp_path: Path) -> None:
    from otel_plumb.tls import ReloadingServerContext, TLSServerConfig

    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cfg = TLSServerConfig(cert_file=str(cert), key_file=str(key), self_signed_if_missing=True)
    reloading = ReloadingServerContext(cfg, "receivers.http.tls")
    assert cert.exists() and key.exists(), "made at start-up"
    first = reloading.current
    cert.unlink()
    key.unlink()
    assert reloading.check() is False
    assert reloading.current is first
    assert not cert.exists() and not key.exists(), "a reload never makes a certificate of its own"
