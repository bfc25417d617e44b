"""The receivers' config (``receivers:``): the OTLP/gRPC listener (which also serves Watch) and
the OTLP/HTTP listener, each with its limits, auth and TLS, and the limits they share."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator

from otel_plumb.configtypes import ConfigModel, Endpoint, Seconds
from otel_plumb.receive.auth import AuthConfig
from otel_plumb.tls import TLSServerConfig


class ListenerConfig(ConfigModel):
    """What every listener has (the receivers and the metrics listener): TLS, auth, and the
    permission to be exposed without either."""

    # TLS (mTLS with client_ca_file); none: plaintext.
    tls: TLSServerConfig | None = None
    # Credentials required on every request (receive.auth): bearer tokens, client certificates.
    auth: AuthConfig | None = None
    # Allow a non-loopback endpoint without TLS and without auth.
    insecure: bool = False

    @field_validator("auth")
    @classmethod
    def _certificates_need_mtls(cls, auth: AuthConfig | None, info: ValidationInfo) -> AuthConfig | None:
        if auth is None or not auth.client_certificates or "tls" not in info.data:
            return auth  # a tls block that failed is reported on its own
        tls = info.data["tls"]
        if tls is None or not tls.client_ca_file:
            raise ValueError(
                "client_certificates needs tls.client_ca_file on this listener: only certificates "
                "verified against it identify a client"
            )
        return auth


class GrpcReceiverConfig(ListenerConfig):
    endpoint: Endpoint = "127.0.0.1:4317"
    enabled: bool = True
    # Connections without a call for this long get a GOAWAY (grpc.max_connection_idle_ms); 0: never.
    idle_timeout: Seconds = 60.0
    # Connections open at once (grpc.max_allowed_incoming_connections); lowered at start when
    # the open-file limit cannot hold them all.
    max_connections: int = Field(default=1024, ge=1)
    # Calls in flight per connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
    max_concurrent_streams: int = Field(default=100, ge=1)


class HttpReceiverConfig(ListenerConfig):
    endpoint: Endpoint = "127.0.0.1:4318"
    enabled: bool = True
    # Connections idle this long (before a request, between requests, or waiting for the next
    # chunk of a body) are closed.
    idle_timeout: Seconds = Field(default=60.0, gt=0)
    # Connections open at once; at the cap a new one closes the longest idle, or is answered
    # 503 when all are busy. Lowered at start when the open-file limit cannot hold them all.
    max_connections: int = Field(default=1024, ge=1)


class ReceiversConfig(ConfigModel):
    grpc: GrpcReceiverConfig = GrpcReceiverConfig()
    http: HttpReceiverConfig = HttpReceiverConfig()
    # LLM payloads exceed gRPC's 4 MiB default.
    max_message_mib: float = Field(default=16.0, gt=0)
    # Back-pressure: above this many spans held for assembly, requests are refused as retryable.
    max_buffered_spans: int = Field(default=200_000, ge=1)
    # What clients are told to wait before retrying a throttled request.
    retry_after: Seconds = 1.0
