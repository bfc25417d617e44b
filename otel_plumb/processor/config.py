"""The processor's configuration: one YAML file, validated by pydantic, overridable by flags.

Each component's section is defined beside the component (``receive/config.py``,
``export/config.py``, ``tls.py``); this module composes them, adds the processor's own sections
(assembly, logging, shutdown), loads the file and checks the listeners' exposure.

Read by the one YAML loader (``otel_plumb.yamlfile``: at most 10 MiB, duplicate keys refused,
aliases bounded). Secrets come from the environment with the Collector's ``${env:NAME}`` syntax
(``${env:NAME:-default}`` for a default, ``$${`` for a literal ``${``), in values only. Every error
names the file, the line and the key.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from otel_plumb import yamlfile
from otel_plumb.configtypes import Bytes, ConfigModel, FilePath, Seconds, parse_hostport, resolve_paths
from otel_plumb.consistency import ConsistencyConfig
from otel_plumb.console.config import ConsoleConfig
from otel_plumb.export.config import ExportersConfig, MetricsConfig, VerdictLogConfig
from otel_plumb.receive.config import ReceiversConfig
from otel_plumb.redact.config import RedactionConfig
from otel_plumb.store.config import StoreConfig


class ConfigError(ValueError):
    """A config that cannot be used; the message names file, line and key."""


class AssemblyConfig(ConfigModel):
    idle_timeout: Seconds = 2.0
    # A trajectory whose verdict has a failure a span not yet seen could clear (must_call,
    # precedes...) waits this much longer for late spans before it is given; 0: not at all.
    confirm_wait: Seconds = 5.0
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


class LoggingConfig(ConfigModel):
    level: Literal["debug", "info", "warning", "error"] = "info"
    json_format: bool = Field(default=False, alias="json")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ShutdownConfig(ConfigModel):
    grace_period: Seconds = 30.0


class ProcessorConfig(ConfigModel):
    receivers: ReceiversConfig = ReceiversConfig()
    assembly: AssemblyConfig = AssemblyConfig()
    policies: list[FilePath] = Field(default_factory=list)
    exporters: ExportersConfig = ExportersConfig()
    metrics: MetricsConfig = MetricsConfig()
    verdict_log: VerdictLogConfig = VerdictLogConfig()
    logging: LoggingConfig = LoggingConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    # What leaves the processor (annotations, events, verdict log, Watch, forwarded spans when
    # asked), with secrets masked, hashed, cut or dropped; checks run on the real values.
    redaction: RedactionConfig | None = None
    # The console's trajectory store (off unless given).
    store: StoreConfig | None = None
    # Live consistency: the share of recent trajectories on the modal tool path (off unless given).
    consistency: ConsistencyConfig | None = None
    # The console on the metrics listener at /console/ (needs store).
    console: ConsoleConfig | None = None

    @model_validator(mode="after")
    def _console_needs_a_store(self) -> ProcessorConfig:
        if self.console is not None and self.store is None:
            raise ValueError("console shows the trajectory store: add a store section (store.path)")
        if self.console is not None and not self.metrics.endpoint:
            raise ValueError("console is served on the metrics listener: metrics.endpoint must not be empty")
        return self


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


def load_config(path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None) -> ProcessorConfig:
    """The config from ``path`` (none: SPEC defaults), with ``overrides`` (dotted keys) applied on
    top. Relative file paths in the file resolve against its directory."""
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
        # Relative paths in the file are relative to it; overrides (flags) are taken as given.
        data = resolve_paths(ProcessorConfig, loaded or {}, os.path.dirname(source))
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
