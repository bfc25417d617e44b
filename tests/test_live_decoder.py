"""The live path reads each request's spans through the compiled decoder: every captured
fixture, sent as protobuf requests with and without it (and under a bearer token's tenant),
gives the same decided trajectories."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_live_support import config, strip_annotations, wait_until

from otel_plumb.check import load_policies
from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.demo.run import policy_path
from otel_plumb.model import Decided
from otel_plumb.processor import Processor
from otel_plumb.receive import auth, otlp
from otel_plumb.receive.otlp import ReceivedRequest, native_decode_spans
from otel_plumb.receive.otlp_json import parse_request
from otel_plumb.report.records import decided_record

FIXTURES = Path(__file__).parent / "fixtures"
REQUESTS = [
    *sorted((FIXTURES / "conventions").glob("*.jsonl")),
    *sorted((FIXTURES / "ap").glob("*.jsonl")),
]

pytestmark = pytest.mark.skipif(native_decode_spans is None, reason="the compiled decoder is not built")


def _requests(path: Path) -> list[bytes]:
    return [parse_request(json.loads(line)).SerializeToString() for line in path.read_text().splitlines() if line]


async def _decide(
    tmp_path: Path, bodies: list[bytes], tenant: str | None, policy: Path | None = None
) -> list[dict[str, Any]]:
    tmp_path.mkdir()
    processor = Processor(config(tmp_path), load_policies([policy or policy_path()]))
    decided: list[Decided] = []
    processor.on_decided(decided.append)
    await processor.start()
    token = auth.TENANT.set(tenant)
    try:
        for body in bodies:
            await processor.ingest(ReceivedRequest.parse(body), "grpc")
    finally:
        auth.TENANT.reset(token)
    deadline = asyncio.get_running_loop().time() + 20
    while processor.intake.traces_in_flight and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    await processor.stop()
    records = [{**decided_record(d), "tenant": d.trajectory.attributes.get(auth.TENANT_ATTRIBUTE)} for d in decided]
    return sorted(records, key=lambda r: r["trace_id"])


@pytest.mark.parametrize("path", REQUESTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_the_compiled_decoder_and_the_protobuf_runtime_decide_alike(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = _requests(path)
    for tenant in (None, "acme"):
        native = await _decide(tmp_path / f"native-{tenant}", bodies, tenant)
        with monkeypatch.context() as m:
            m.setattr(otlp, "native_decode_spans", None)
            pure = await _decide(tmp_path / f"pure-{tenant}", bodies, tenant)
        assert native == pure
        assert [r["tenant"] for r in native] == [tenant] * len(native)


async def test_a_span_the_runtime_parses_but_cannot_read_is_forwarded_and_its_trajectory_indeterminate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the compiled decoder, a span whose values cannot be read into a record (the
    runtime parsed it) leaves its trajectory incomplete: indeterminate, never conformant or
    violating on the spans that were read."""
    bodies = _requests(FIXTURES / "ap" / "double_payment.jsonl")
    read = otlp.span_record

    def failing(span: Any, resource: Any, scope_name: str) -> Any:
        if span.name == "execute_tool schedule_payment":
            raise ValueError("a value this reader cannot take")
        return read(span, resource, scope_name)

    policy = tmp_path / "policy.yaml"
    policy.write_text("policy: pay-once\ninvariants:\n  - {id: once, call_count: {tool: schedule_payment, max: 1}}\n")
    monkeypatch.setattr(otlp, "native_decode_spans", None)
    monkeypatch.setattr(otlp, "span_record", failing)
    records = await _decide(tmp_path / "unread", bodies, None, policy)
    assert records
    for r in records:
        assert not r["complete"] and r["incomplete_reason"] == "unreadable_input", r
        assert r["status"] == "indeterminate"
        assert [v["verdict"] for v in r["verdicts"]] == ["indeterminate"]
        assert any("could not be decoded: a value this reader cannot take" in p for p in r["problems"])


def _mixed_request() -> bytes:
    """Requests of several fixtures in one, each resource and scope given a schema URL: spans of
    different resources and scopes side by side, as a Collector's batch carries them."""
    request = ExportTraceServiceRequest()
    for n, path in enumerate(REQUESTS[:6]):
        for body in _requests(path):
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
                rs.schema_url = f"https://opentelemetry.io/schemas/1.{n}.0"
                for m, ss in enumerate(rs.scope_spans):
                    ss.schema_url = f"https://example.com/scope/{n}/{m}"
                request.resource_spans.append(rs)
    return request.SerializeToString()


async def _forwarded(tmp_path: Path, body: bytes) -> dict[str, tuple[bytes, str, bytes, str, bytes]]:
    """Each span as the backend received it: its resource and scope (with their schema URLs)
    and the span without annotations, by span id."""
    tmp_path.mkdir()
    backend = OtlpBackend()
    await backend.start(0)
    processor = Processor(config(tmp_path, backend.endpoint, policies=[str(policy_path())]))
    await processor.start()
    try:
        await processor.ingest(ReceivedRequest.parse(body), "grpc")
        await wait_until(lambda: backend.span_count >= _span_total(body), 20, "every span at the backend")
    finally:
        await processor.stop()
        await backend.stop()
    return {
        span.span_id.hex(): (
            rs.resource.SerializeToString(deterministic=True), rs.schema_url,
            ss.scope.SerializeToString(deterministic=True), ss.schema_url,
            strip_annotations(span).SerializeToString(deterministic=True),
        )
        for request in backend.requests for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
    }  # fmt: skip


def _span_total(body: bytes) -> int:
    request = ExportTraceServiceRequest.FromString(body)
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


async def test_spans_are_forwarded_under_their_own_resource_and_scope_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = _mixed_request()
    request = ExportTraceServiceRequest.FromString(body)
    sent = {
        span.span_id.hex(): (
            rs.resource.SerializeToString(deterministic=True), rs.schema_url,
            ss.scope.SerializeToString(deterministic=True), ss.schema_url, span.SerializeToString(deterministic=True),
        )
        for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
    }  # fmt: skip
    assert len({(v[1], v[3]) for v in sent.values()}) >= 6  # several resources and scopes in one request
    assert await _forwarded(tmp_path / "native", body) == sent
    monkeypatch.setattr(otlp, "native_decode_spans", None)
    assert await _forwarded(tmp_path / "pure", body) == sent
