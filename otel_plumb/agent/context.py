"""Trace context in, spans out: the agent side of a campaign's trace collection."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

PLUMB_PREFIX = "plumb."
_PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


def trial_context(source: Mapping[str, Any] | None = None) -> otel_context.Context:
    """The OpenTelemetry context of the trial: parent span and ``plumb.*`` baggage.

    ``source`` is HTTP headers, or the request dict of a Python callable (keys ``traceparent``
    and ``baggage``); without it the ``TRACEPARENT`` and ``BAGGAGE`` environment variables of a
    command agent are read.
    """
    carrier: dict[str, str] = {}
    if source is None:
        for key in ("TRACEPARENT", "BAGGAGE"):
            if os.environ.get(key):
                carrier[key.lower()] = os.environ[key]
    else:
        for key, value in source.items():
            if isinstance(key, str) and key.lower() in ("traceparent", "tracestate", "baggage") and value:
                carrier[key.lower()] = str(value)
    return _PROPAGATOR.extract(carrier)


@contextmanager
def in_trial(source: Mapping[str, Any] | None = None) -> Iterator[otel_context.Context]:
    """Make the trial's context current for the block, so every span started in it (not just
    the first) belongs to the trial's trace and sees its ``plumb.*`` baggage. (A tracer's
    ``start_as_current_span(context=...)`` takes the parent from ``context`` but not its
    baggage for the spans below.)"""
    ctx = trial_context(source)
    token = otel_context.attach(ctx)
    try:
        yield ctx
    finally:
        otel_context.detach(token)


def setup_tracing(service_name: str, endpoint: str | None = None, *, protocol: str | None = None,
                  exporter: SpanExporter | None = None, batch: bool = True) -> TracerProvider:
    """A tracer provider exporting OTLP to ``endpoint`` over ``protocol`` (``grpc`` or
    ``http/protobuf``), copying ``plumb.*`` baggage entries onto every span. Pass the request's
    ``otlp_endpoint`` and ``otlp_protocol``; without them the ``OTEL_EXPORTER_OTLP_ENDPOINT`` and
    ``OTEL_EXPORTER_OTLP_PROTOCOL`` environment variables (a command agent's) are used, and
    without those OTLP/HTTP to 127.0.0.1:4318. Call ``force_flush()`` before answering so the
    trace is complete."""
    from opentelemetry.processor.baggage import BaggageSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BaggageSpanProcessor(lambda key: key.startswith(PLUMB_PREFIX)))
    if exporter is None:
        protocol = protocol or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

            target = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
            # An http:// endpoint is plaintext gRPC, as the SDK reads OTEL_EXPORTER_OTLP_ENDPOINT.
            exporter = GrpcExporter(endpoint=target, insecure=target.startswith("http://"))
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            base = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
            exporter = OTLPSpanExporter(endpoint=base.rstrip("/") + "/v1/traces")
        else:
            raise ValueError(f"OTLP protocol {protocol!r}: grpc or http/protobuf")
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    return provider
