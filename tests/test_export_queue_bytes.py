"""The export queue is bounded in bytes on disk, not only in spans: past queue.max_bytes the
receivers refuse retryably, and what was taken is delivered once the backend is back."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_live_backpressure import trace_request
from test_live_support import config, free_port, wait_until

from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.processor import Processor
from otel_plumb.receive.otlp import ReceivedRequest
from otel_plumb.receive.sink import Throttled


async def test_past_the_byte_cap_requests_are_refused_retryably_and_nothing_taken_is_lost(tmp_path: Path) -> None:
    port = free_port()  # the backend is down at first: nothing listens here
    cfg = config(
        tmp_path, f"grpc://127.0.0.1:{port}",
        receivers={"grpc": {"enabled": False}, "http": {"enabled": False}},
        exporters={"otlp": {"endpoint": f"grpc://127.0.0.1:{port}", "mode": "passthrough",
                            "state_dir": str(tmp_path / "state"), "queue": {"max_bytes": "16KiB"},
                            "retry": {"initial_interval": 0.05, "max_interval": 0.2}}},
    )  # fmt: skip
    processor = Processor(cfg, [])
    await processor.start()
    backend = OtlpBackend()
    taken: set[bytes] = set()
    try:
        refused = None
        for _ in range(200):  # bounded: each request is about 2 KiB
            request = trace_request(tools=4)
            try:
                await processor.ingest(ReceivedRequest.of(request), "test")
            except Throttled as exc:
                refused = exc
                break
            taken |= {s.span_id for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans}
        assert refused is not None and refused.overloaded, "the byte cap turns into back-pressure"
        assert "export queue is full" in refused.reason
        assert processor.exporter is not None and processor.exporter.queued_bytes >= 16 * 1024
        assert len(taken) < 200 * 5
        await backend.start(port)
        await wait_until(lambda: {s.span_id for s in backend.spans()} >= taken, 15, "queued spans delivered")
        await wait_until(lambda: processor.exporter is not None and not processor.exporter.full, 5, "queue drained")
        await processor.ingest(ReceivedRequest.of(trace_request(tools=4)), "test")  # taken again once there is room
    finally:
        await processor.stop(grace=5)
        await backend.stop()
    # Passthrough forwards each span once plus one verdict span per trace: span ids stay unique.
    ids = [s.span_id for s in backend.spans()]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("value", ["0", "-1KiB"])
def test_a_byte_cap_must_be_positive(value: str, tmp_path: Path) -> None:
    from otel_plumb.processor.config import ConfigError, load_config

    with pytest.raises(ConfigError):
        load_config(None, {"exporters": {"otlp": {"endpoint": "grpc://127.0.0.1:1", "queue": {"max_bytes": value}}}})
