"""The export side's config: the OTLP exporter with its queue and retry (``exporters:``), the
metrics listener (``metrics:``) and the verdict log (``verdict_log:``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from otel_plumb.configtypes import Bytes, ConfigModel, FilePath, Seconds, check_hostport, parse_hostport
from otel_plumb.receive.config import ListenerConfig
from otel_plumb.tls import TLSClientConfig


class RetryConfig(ConfigModel):
    initial_interval: Seconds = 0.5
    max_interval: Seconds = 30.0
    multiplier: float = Field(default=2.0, ge=1)
    # +/- this fraction of randomness on each wait, so many processors do not retry in step.
    jitter: float = Field(default=0.2, ge=0, le=1)
    # A batch still failing this long after its first attempt is given up as a dead letter
    # (the Collector exporterhelper's default); 0: retry for ever.
    max_elapsed_time: Seconds = 300.0


class QueueConfig(ConfigModel):
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


class OtlpExporterConfig(ConfigModel):
    endpoint: str
    headers: dict[str, str] = Field(default_factory=dict)
    mode: Literal["annotate", "passthrough"] = "annotate"
    timeout: Seconds = 10.0
    compression: Literal["none", "gzip"] = "none"
    queue: QueueConfig = QueueConfig()
    retry: RetryConfig = RetryConfig()
    state_dir: FilePath = Field(default_factory=default_state_dir)
    # Spans given up (refused as too large even alone, or failing past retry.max_elapsed_time)
    # are appended here as length-prefixed OTLP protobuf records (the Collector file exporter's
    # framing, which `otel-plumb replay` reads); none: only counted.
    dead_letter_file: FilePath | None = None
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


class ExportersConfig(ConfigModel):
    otlp: OtlpExporterConfig | None = None


class MetricsConfig(ListenerConfig):
    # Empty string: no metrics endpoint.
    endpoint: str = "127.0.0.1:9464"
    # Distinct values kept per label before new ones are folded into "__overflow__".
    max_label_values: int = Field(default=200, ge=1)
    # Longest label value kept (agent and tool names come from the traffic); longer ones are cut.
    max_label_length: int = Field(default=128, ge=8)
    # Series kept per metric; past it, new label combinations go to one all-"__overflow__" series.
    max_series: int = Field(default=10_000, ge=1)
    # auth covers /metrics, and /healthz and /readyz too with auth.protect_health.

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        return check_hostport(v) if v else v


class VerdictLogConfig(ConfigModel):
    path: FilePath | None = None
