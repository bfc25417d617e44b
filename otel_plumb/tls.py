"""TLS for the listeners and the exporter, configured as the Collector's ``configtls`` is.

Servers (``receivers.grpc.tls``, ``receivers.http.tls``, ``metrics.tls``): a certificate and key,
optionally a ``client_ca_file`` (then clients must present a certificate it signed: mTLS), a
minimum version, and a ``reload_interval`` at which the files are looked at again (by mtime) so a
renewed certificate is served to new connections without a restart.

aiohttp listeners get one ``ssl.SSLContext`` whose SNI callback hands each handshake the
context built from the newest files; the gRPC listener gets
``grpc.dynamic_ssl_server_credentials`` whose fetcher, asked at each handshake, returns the
new files when they changed (checked at most once per ``reload_interval``).

Files that cannot be read, or that are not a PEM certificate and its key, are refused with an
error naming the config key (``TLSError``, an ``OSError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import threading
import time
from typing import Literal

import grpc
from pydantic import Field

from otel_plumb.configtypes import ConfigModel, FilePath, Seconds

log = logging.getLogger("otel_plumb.tls")


class TLSServerConfig(ConfigModel):
    """A listener's TLS (the Collector's configtls server settings)."""

    cert_file: FilePath
    key_file: FilePath
    # Set: clients must present a certificate signed by one of these CAs (mTLS).
    client_ca_file: FilePath | None = None
    min_version: Literal["1.2", "1.3"] = "1.2"
    # The files are looked at this often and, when changed, served to new connections; 0: never.
    reload_interval: Seconds = 0.0
    # When neither cert_file nor key_file exists at start: make a CA (ca.crt beside cert_file)
    # and a certificate it signs for ``self_signed_names``, so TLS is on from the first start
    # (the Docker image); clients then trust that ca.crt. Files that exist are used as they are.
    self_signed_if_missing: bool = False
    self_signed_names: list[str] = Field(default_factory=lambda: ["localhost", "127.0.0.1"])


class TLSClientConfig(ConfigModel):
    """The exporter's TLS to the backend (grpcs:// or https://; configtls client settings)."""

    # CAs the backend's certificate must chain to; none: the system's.
    ca_file: FilePath | None = None
    # A client certificate and its key, for a backend that requires mTLS.
    cert_file: FilePath | None = None
    key_file: FilePath | None = None
    min_version: Literal["1.2", "1.3"] = "1.2"
    # Accept any certificate (https:// only): for tests, never for data that matters.
    insecure_skip_verify: bool = False
    # The name the backend's certificate is checked against, instead of the endpoint's host.
    server_name_override: str | None = None


_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class TLSError(OSError):
    """A TLS setting that cannot be used; the message names the config key."""


def _read(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TLSError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None


def _server_files(cfg: TLSServerConfig, key: str) -> tuple[bytes, bytes, bytes | None]:
    cert = _read(cfg.cert_file, f"{key}.cert_file")
    private = _read(cfg.key_file, f"{key}.key_file")
    ca = _read(cfg.client_ca_file, f"{key}.client_ca_file") if cfg.client_ca_file else None
    return cert, private, ca


def _mtimes(paths: list[str]) -> tuple[float | None, ...]:
    out: list[float | None] = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append(st.st_mtime_ns + st.st_size + st.st_ino)
        except OSError:
            out.append(None)
    return tuple(out)


def _paths(cfg: TLSServerConfig) -> list[str]:
    return [cfg.cert_file, cfg.key_file, *([cfg.client_ca_file] if cfg.client_ca_file else [])]


def self_signed(cfg: TLSServerConfig, key: str) -> bool:
    """Make the CA and certificate of ``self_signed_if_missing`` when neither file exists;
    True when they were made. The key is written readable by its owner only."""
    if not cfg.self_signed_if_missing or os.path.exists(cfg.cert_file) or os.path.exists(cfg.key_file):
        return False
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    lifetime = datetime.timedelta(days=3650)

    def build(subject: str, issuer: x509.Name | None, signer: ec.EllipticCurvePrivateKey | None,
              public: ec.EllipticCurvePrivateKey, ca: bool) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (
            x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
            .public_key(public.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + lifetime)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )  # fmt: skip
        if not ca:
            sans: list[x509.GeneralName] = []
            for n in cfg.self_signed_names:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(n)))
                except ValueError:
                    sans.append(x509.DNSName(n))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(signer or public, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = build("otel-plumb self-signed CA", None, None, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = build(cfg.self_signed_names[0] if cfg.self_signed_names else "otel-plumb",
                        ca_cert.subject, ca_key, server_key, ca=False)  # fmt: skip
    pem = serialization.Encoding.PEM
    ca_path = os.path.join(os.path.dirname(cfg.cert_file) or ".", "ca.crt")
    try:
        os.makedirs(os.path.dirname(cfg.cert_file) or ".", exist_ok=True)
        with open(cfg.key_file, "wb", opener=lambda p, f: os.open(p, f, 0o600)) as f:
            f.write(server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        with open(cfg.cert_file, "wb") as f:
            f.write(server_cert.public_bytes(pem))
        with open(ca_path, "wb") as f:
            f.write(ca_cert.public_bytes(pem))
    except OSError as exc:
        problem = exc.strerror or exc
        raise TLSError(f"{key}: cannot write a self-signed certificate to {cfg.cert_file}: {problem}") from None
    fingerprint = ca_cert.fingerprint(hashes.SHA256()).hex(":")
    log.warning(
        "%s: no certificate at %s; made a self-signed one for %s. Clients trust %s (SHA-256 %s); "
        "mount certificates of your own there to replace it", key, cfg.cert_file,
        ", ".join(cfg.self_signed_names), ca_path, fingerprint,
    )  # fmt: skip
    return True


def server_context(cfg: TLSServerConfig, key: str) -> ssl.SSLContext:
    """A server context from ``cfg``'s files; ``TLSError`` naming ``key`` if they are unusable."""
    _server_files(cfg, key)  # readable, with the key that failed named
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[cfg.min_version]
    try:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except (ssl.SSLError, ValueError) as exc:
        raise TLSError(
            f"{key}.cert_file/key_file: {cfg.cert_file} and {cfg.key_file} are not a PEM certificate and its key: {exc}"
        ) from None
    if cfg.client_ca_file:
        try:
            ctx.load_verify_locations(cafile=cfg.client_ca_file)
        except (ssl.SSLError, ValueError) as exc:
            raise TLSError(f"{key}.client_ca_file: {cfg.client_ca_file} holds no PEM certificate: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class ReloadingServerContext:
    """The context to give an aiohttp/asyncio server: each handshake is switched (SNI callback)
    to the context built from the newest files, rebuilt by ``run`` when their mtime changes."""

    def __init__(self, cfg: TLSServerConfig, key: str) -> None:
        self.cfg, self.key = cfg, key
        # At start-up only: files missing mid-rotation keep the old certificate, not a new CA.
        self_signed(cfg, key)
        self.current = server_context(cfg, key)
        self.context = server_context(cfg, key)
        self.context.sni_callback = self._pick
        self._stamp = _mtimes(_paths(cfg))

    def _pick(self, sslobj: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        sslobj.context = self.current

    def check(self) -> bool:
        """Rebuild from the files if they changed; True if a new context is in use. A file that is
        unreadable or invalid mid-rotation keeps the previous context (logged), and is tried again."""
        stamp = _mtimes(_paths(self.cfg))
        if stamp == self._stamp:
            return False
        try:
            fresh = server_context(self.cfg, self.key)
        except TLSError as exc:
            log.error("TLS reload failed, keeping the previous certificate: %s", exc)
            return False
        self.current, self._stamp = fresh, stamp
        log.info("%s: reloaded the TLS certificate from %s", self.key, self.cfg.cert_file)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.reload_interval)
            self.check()


def grpc_server_credentials(cfg: TLSServerConfig, key: str) -> grpc.ServerCredentials:
    """Server credentials for a grpc.aio server; with ``reload_interval``, dynamic ones whose
    fetcher serves renewed files to new handshakes."""
    if cfg.min_version != "1.2":
        raise TLSError(
            f"{key}.min_version: {cfg.min_version} cannot be enforced on the gRPC listener (grpcio accepts "
            "TLS 1.2 and 1.3 and offers no minimum); use 1.2"
        )
    self_signed(cfg, key)  # at start-up only, as for the HTTP listeners
    server_context(cfg, key)  # refuse bad PEM here, with a clear message, not in the first handshake
    cert, private, ca = _server_files(cfg, key)
    require = ca is not None
    if cfg.reload_interval <= 0:
        return grpc.ssl_server_credentials([(private, cert)], root_certificates=ca, require_client_auth=require)
    lock = threading.Lock()
    state = {"checked": time.monotonic(), "stamp": _mtimes(_paths(cfg))}

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        with lock:
            now = time.monotonic()
            if now - state["checked"] < cfg.reload_interval:  # type: ignore[operator]
                return None
            state["checked"] = now
            stamp = _mtimes(_paths(cfg))
            if stamp == state["stamp"]:
                return None
            try:
                server_context(cfg, key)
                new_cert, new_key, new_ca = _server_files(cfg, key)
            except TLSError as exc:
                log.error("TLS reload failed, keeping the previous certificate: %s", exc)
                return None
            state["stamp"] = stamp
            log.info("%s: reloaded the TLS certificate from %s", key, cfg.cert_file)
            return grpc.ssl_server_certificate_configuration([(new_key, new_cert)], root_certificates=new_ca)

    initial = grpc.ssl_server_certificate_configuration([(private, cert)], root_certificates=ca)
    # The fetcher returns None for "unchanged", which grpcio accepts (its stubs say otherwise).
    return grpc.dynamic_ssl_server_credentials(
        initial,
        fetch,  # type: ignore[arg-type]
        require_client_authentication=require,
    )


# ---- clients (the exporter) ----------------------------------------------------------------------


def client_context(cfg: TLSClientConfig | None, key: str) -> ssl.SSLContext:
    """A client context: the system CAs or ``ca_file``, a client certificate for mTLS, and
    verification off only with ``insecure_skip_verify``."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if cfg is None:
        return ctx
    ctx.minimum_version = _VERSIONS[cfg.min_version]
    if cfg.ca_file:
        _read(cfg.ca_file, f"{key}.ca_file")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = _VERSIONS[cfg.min_version]
        try:
            ctx.load_verify_locations(cafile=cfg.ca_file)
        except (ssl.SSLError, ValueError) as exc:
            raise TLSError(f"{key}.ca_file: {cfg.ca_file} holds no PEM certificate: {exc}") from None
    if cfg.cert_file or cfg.key_file:
        if not (cfg.cert_file and cfg.key_file):
            raise TLSError(f"{key}: cert_file and key_file go together (the client certificate and its key)")
        _read(cfg.cert_file, f"{key}.cert_file")
        _read(cfg.key_file, f"{key}.key_file")
        try:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        except (ssl.SSLError, ValueError) as exc:
            raise TLSError(
                f"{key}.cert_file/key_file: {cfg.cert_file} and {cfg.key_file} are not a PEM certificate "
                f"and its key: {exc}"
            ) from None
    if cfg.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def grpc_channel_credentials(
    cfg: TLSClientConfig | None, key: str
) -> tuple[grpc.ChannelCredentials, list[tuple[str, str]]]:
    """Channel credentials and channel options (``server_name_override``) for a grpcs:// target."""
    if cfg is None:
        return grpc.ssl_channel_credentials(), []
    if cfg.insecure_skip_verify:
        raise TLSError(
            f"{key}.insecure_skip_verify: grpcio cannot skip certificate verification on a grpcs:// endpoint; "
            "give the backend's CA in ca_file instead"
        )
    client_context(cfg, key)  # refuse unreadable or bad PEM with the key named
    ca = _read(cfg.ca_file, f"{key}.ca_file") if cfg.ca_file else None
    cert = _read(cfg.cert_file, f"{key}.cert_file") if cfg.cert_file else None
    private = _read(cfg.key_file, f"{key}.key_file") if cfg.key_file else None
    options = [("grpc.ssl_target_name_override", cfg.server_name_override)] if cfg.server_name_override else []
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=private, certificate_chain=cert), options


async def stop_task(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
