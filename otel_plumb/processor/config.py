"""The processor's configuration: one YAML file, validated by pydantic, overridable by flags.

Read by the one YAML loader (``otel_plumb.yamlfile``: at most 10 MiB, duplicate keys refused,
aliases bounded). Secrets come from the environment with the Collector's ``${env:NAME}`` syntax
(``${env:NAME:-default}`` for a default, ``$${`` for a literal ``${``), in values only. Every error
names the file, the line and the key.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from otel_plumb import yamlfile
from otel_plumb.receive.auth import AuthConfig

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ConfigError(ValueError):
    """A config that cannot be used; the message names file, line and key."""


def _duration(value: Any) -> Any:
    """Seconds as a number, or a string such as ``500ms``, ``2s``, ``5m`` (as in Collector configs)."""
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m is None:
            raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 2s, 5m)")
        return float(m.group(1)) * _UNITS[m.group(2)]
    return value


Seconds = Annotated[float, BeforeValidator(_duration), Field(ge=0)]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
_SIZE_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def _size(value: Any) -> Any:
    """Bytes as a number, or a string such as ``512KiB``, ``256MiB``, ``1GiB``."""
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m is None:
            raise ValueError(f"not a size: {value!r} (use e.g. 512KiB, 256MiB, 1GiB)")
        return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    return value


Bytes = Annotated[int, BeforeValidator(_size), Field(ge=1)]


def parse_hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _check_hostport(value: str) -> str:
    parse_hostport(value)
    return value


Endpoint = Annotated[str, BeforeValidator(lambda v: _check_hostport(str(v)))]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TLSServerConfig(_Model):
    """A listener's TLS (the Collector's configtls server settings); see ``otel_plumb.tls``."""

    cert_file: str
    key_file: str
    # Set: clients must present a certificate signed by one of these CAs (mTLS).
    client_ca_file: str | None = None
    min_version: Literal["1.2", "1.3"] = "1.2"
    # The files are looked at this often and, when changed, served to new connections; 0: never.
    reload_interval: Seconds = 0.0


class TLSClientConfig(_Model):
    """The exporter's TLS to the backend (grpcs:// or https://; configtls client settings)."""

    # CAs the backend's certificate must chain to; none: the system's.
    ca_file: str | None = None
    # A client certificate and its key, for a backend that requires mTLS.
    cert_file: str | None = None
    key_file: str | None = None
    min_version: Literal["1.2", "1.3"] = "1.2"
    # Accept any certificate (https:// only): for tests, never for data that matters.
    insecure_skip_verify: bool = False
    # The name the backend's certificate is checked against, instead of the endpoint's host.
    server_name_override: str | None = None


class GrpcReceiverConfig(_Model):
    endpoint: Endpoint = "127.0.0.1:4317"
    enabled: bool = True
    # Connections without a call for this long get a GOAWAY (grpc.max_connection_idle_ms); 0: never.
    idle_timeout: Seconds = 60.0
    # Connections open at once (grpc.max_allowed_incoming_connections); lowered at start when
    # the open-file limit cannot hold them all.
    max_connections: int = Field(default=1024, ge=1)
    # Calls in flight per connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
    max_concurrent_streams: int = Field(default=100, ge=1)
    # Bearer tokens required on every call, OTLP Export and Watch alike (receive.auth).
    auth: AuthConfig | None = None
    # Allow a non-loopback endpoint without TLS and without auth.
    insecure: bool = False
    # TLS (mTLS with client_ca_file); none: plaintext.
    tls: TLSServerConfig | None = None


class HttpReceiverConfig(_Model):
    endpoint: Endpoint = "127.0.0.1:4318"
    enabled: bool = True
    # Connections idle this long (before a request, between requests, or waiting for the next
    # chunk of a body) are closed.
    idle_timeout: Seconds = Field(default=60.0, gt=0)
    # Connections open at once; at the cap a new one closes the longest idle, or is answered
    # 503 when all are busy. Lowered at start when the open-file limit cannot hold them all.
    max_connections: int = Field(default=1024, ge=1)
    # Bearer tokens required on every request (receive.auth).
    auth: AuthConfig | None = None
    # Allow a non-loopback endpoint without TLS and without auth.
    insecure: bool = False
    # TLS (mTLS with client_ca_file); none: plaintext.
    tls: TLSServerConfig | None = None


class ReceiversConfig(_Model):
    grpc: GrpcReceiverConfig = GrpcReceiverConfig()
    http: HttpReceiverConfig = HttpReceiverConfig()
    # LLM payloads exceed gRPC's 4 MiB default.
    max_message_mib: float = Field(default=16.0, gt=0)
    # Back-pressure: above this many spans held for assembly, requests are refused as retryable.
    max_buffered_spans: int = Field(default=200_000, ge=1)
    # What clients are told to wait before retrying a throttled request.
    retry_after: Seconds = 1.0


class AssemblyConfig(_Model):
    idle_timeout: Seconds = 2.0
    max_wait: Seconds = 300.0
    max_traces: int = Field(default=10_000, ge=1)
    max_spans_per_trace: int = Field(default=5_000, ge=1)
    group_by: Literal["trace", "session"] = "trace"
    session_idle_timeout: Seconds = 30.0
    # How often buffered traces are looked at; bounds the decision delay beyond idle_timeout.
    tick: Seconds = Field(default=0.1, gt=0)
    # Decided traces are remembered this long (and up to these counts) so that a resent span
    # of theirs is dropped as a duplicate instead of becoming a new trajectory. The default
    # covers the Collector exporter's retry window (max_elapsed_time 5m).
    decided_ttl: Seconds = 300.0
    decided_max_traces: int = Field(default=100_000, ge=1)
    decided_max_spans: int = Field(default=1_000_000, ge=1)
    # Memory limiter: past this estimate of the bytes held by buffered spans, new requests are
    # refused as retryable (RESOURCE_EXHAUSTED with RetryInfo, HTTP 429 with Retry-After).
    max_buffered_bytes: Bytes = 256 << 20


class RetryConfig(_Model):
    initial_interval: Seconds = 0.5
    max_interval: Seconds = 30.0
    multiplier: float = Field(default=2.0, ge=1)
    # +/- this fraction of randomness on each wait, so many processors do not retry in step.
    jitter: float = Field(default=0.2, ge=0, le=1)
    # A batch still failing this long after its first attempt is given up as a dead letter
    # (the Collector exporterhelper's default); 0: retry for ever.
    max_elapsed_time: Seconds = 300.0


class QueueConfig(_Model):
    # Spans kept in memory ready to send; the rest wait on disk only.
    memory_spans: int = Field(default=50_000, ge=1)
    # Spans accepted for export (memory + disk) before receivers start throttling.
    max_spans: int = Field(default=1_000_000, ge=1)
    # Bytes of queued requests on disk before receivers start throttling.
    max_bytes: Bytes = 1 << 30
    # Spans per outgoing request.
    batch_spans: int = Field(default=2_048, ge=1)
    # Bytes per outgoing request (a lone bigger span goes alone): below the 4 MiB a Collector
    # receives by default.
    max_batch_bytes: int = Field(default=3 * 1024 * 1024, ge=1024)
    # Requests in flight to the backend at once.
    concurrency: int = Field(default=2, ge=1)


def default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "otel-plumb")


class OtlpExporterConfig(_Model):
    endpoint: str
    headers: dict[str, str] = Field(default_factory=dict)
    mode: Literal["annotate", "passthrough"] = "annotate"
    timeout: Seconds = 10.0
    compression: Literal["none", "gzip"] = "none"
    queue: QueueConfig = QueueConfig()
    retry: RetryConfig = RetryConfig()
    state_dir: str = Field(default_factory=default_state_dir)
    # Spans given up (refused as too large even alone, or failing past retry.max_elapsed_time)
    # are appended here as length-prefixed OTLP protobuf records (the Collector file exporter's
    # framing, which `otel-plumb replay` reads); none: only counted.
    dead_letter_file: str | None = None
    # Annotation values copied from a verdict (message, expected, got) are cut to this many
    # characters, with a marker saying how many were left out.
    max_annotation_chars: int = Field(default=1024, ge=16)
    # TLS to a grpcs:// or https:// endpoint (system CAs when absent).
    tls: TLSClientConfig | None = None

    @field_validator("endpoint")
    @classmethod
    def _scheme(cls, v: str) -> str:
        scheme, sep, rest = v.partition("://")
        if not sep or scheme not in ("grpc", "grpcs", "http", "https") or not rest:
            raise ValueError(f"expected grpc://HOST:PORT, grpcs://HOST:PORT or http(s)://HOST:PORT[/path], got {v!r}")
        if scheme.startswith("grpc"):
            parse_hostport(rest.rstrip("/"))
        return v

    @model_validator(mode="after")
    def _tls_needs_tls_scheme(self) -> OtlpExporterConfig:
        if self.tls is not None and not self.endpoint.startswith(("grpcs://", "https://")):
            raise ValueError(f"tls is set but {self.endpoint} is plaintext: use grpcs:// or https://")
        return self


class ExportersConfig(_Model):
    otlp: OtlpExporterConfig | None = None


class MetricsConfig(_Model):
    # Empty string: no metrics endpoint.
    endpoint: str = "127.0.0.1:9464"
    # Distinct values kept per label before new ones are folded into "__overflow__".
    max_label_values: int = Field(default=200, ge=1)
    # Longest label value kept (agent and tool names come from the traffic); longer ones are cut.
    max_label_length: int = Field(default=128, ge=8)
    # Series kept per metric; past it, new label combinations go to one all-"__overflow__" series.
    max_series: int = Field(default=10_000, ge=1)
    # Bearer tokens required for /metrics (and /healthz, /readyz with auth.protect_health).
    auth: AuthConfig | None = None
    # Allow a non-loopback endpoint without TLS and without auth.
    insecure: bool = False
    # TLS (mTLS with client_ca_file); none: plaintext.
    tls: TLSServerConfig | None = None

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        return _check_hostport(v) if v else v


class VerdictLogConfig(_Model):
    path: str | None = None


class LoggingConfig(_Model):
    level: Literal["debug", "info", "warning", "error"] = "info"
    json_format: bool = Field(default=False, alias="json")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ShutdownConfig(_Model):
    grace_period: Seconds = 30.0


class ProcessorConfig(_Model):
    receivers: ReceiversConfig = ReceiversConfig()
    assembly: AssemblyConfig = AssemblyConfig()
    policies: list[str] = Field(default_factory=list)
    exporters: ExportersConfig = ExportersConfig()
    metrics: MetricsConfig = MetricsConfig()
    verdict_log: VerdictLogConfig = VerdictLogConfig()
    logging: LoggingConfig = LoggingConfig()
    shutdown: ShutdownConfig = ShutdownConfig()


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def exposure_errors(config: ProcessorConfig) -> list[str]:
    """Listeners that would accept anyone on the network: a non-loopback endpoint with neither
    TLS nor auth, and no ``insecure: true``. The processor refuses to start with any."""
    receivers = config.receivers
    listeners: list[tuple[str, str, bool, Any]] = [
        ("receivers.grpc", "OTLP/gRPC and Watch", receivers.grpc.enabled, receivers.grpc),
        ("receivers.http", "OTLP/HTTP", receivers.http.enabled, receivers.http),
        ("metrics", "metrics", bool(config.metrics.endpoint), config.metrics),
    ]
    errors = []
    for key, what, enabled, listener in listeners:
        if not enabled or listener.insecure or listener.auth is not None or listener.tls is not None:
            continue
        host, _port = parse_hostport(listener.endpoint)
        if not is_loopback(host):
            errors.append(
                f"{key} ({what}) would listen on {listener.endpoint}, beyond this host, with neither "
                f"TLS nor auth: set {key}.tls or {key}.auth, bind a loopback address, or set "
                f"{key}.insecure: true to allow it"
            )
    return errors


def substitute_env(value: str, where: str = "<config>") -> str:
    """Replace ``${env:NAME}`` (Collector syntax). An unset variable without a default is an error."""
    try:
        return yamlfile.expand_env(value, where, None)
    except yamlfile.YamlError as exc:
        raise ConfigError(str(exc)) from None


def load_config(path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None) -> ProcessorConfig:
    """The config from ``path`` (none: SPEC defaults), with ``overrides`` (dotted keys) applied on top."""
    source = str(path) if path is not None else "<defaults>"
    data: dict[str, Any] = {}
    doc: yamlfile.Document | None = None
    if path is not None:
        # The one YAML loader (size limit, duplicate keys, bounded aliases), with ${env:} in values.
        try:
            doc = yamlfile.load(path, env=True)
        except yamlfile.YamlError as exc:
            raise ConfigError(str(exc)) from None
        loaded = doc.data
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{source}:1: the config must be a mapping of sections")
        data = loaded or {}
    for dotted, value in (overrides or {}).items():
        target = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            child = target.get(p)
            if not isinstance(child, dict):
                child = target[p] = {}
            target = child
        target[leaf] = value
    try:
        return ProcessorConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            line = doc.line_of(err["loc"]) if doc is not None else None
            key = ".".join(str(p) for p in err["loc"])
            where = f"{source}:{line}" if line is not None else source
            what = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"{where}: {key}: {what}")
        raise ConfigError("\n".join(lines)) from exc
