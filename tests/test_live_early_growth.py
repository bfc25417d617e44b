"""Early checks cost O(N) over a trace of N spans even where the counters cannot rule a failure
out: in a trace of parallel tool calls (the step order is not start order), a ``precedes``
whose ``then`` tool was called may fail on every request, and is checked again only once the
trace has grown by a quarter (or at once with an invariant not checked before). A failure
that does happen is still reported while the trace is in flight."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_live_support import config, wait_until, watch_records

from otel_plumb.check import load_policy
from otel_plumb.processor import Processor
from otel_plumb.processor import core as processor_core
from otel_plumb.receive.otlp import ReceivedRequest

POLICY = """
policy: growth
invariants:
  - {id: check-before-refund, precedes: {first: check_policy, then: issue_refund}}
  - {id: refund-never, never_call: delete_account}
"""


def trace_requests(n: int, *, delete_at: int | None = None) -> list[ExportTraceServiceRequest]:
    """One agent trace of ``n`` spans in requests of 10, without its root: turns of a model call
    asking for ``check_policy`` and ``issue_refund`` at once, then those calls; ``delete_at``: the
    span that calls ``delete_account`` instead."""
    tid, root = os.urandom(16), os.urandom(8)
    requests = []
    for first in range(1, n, 10):
        request = ExportTraceServiceRequest()
        scope = request.resource_spans.add().scope_spans.add()
        for i in range(first, min(n, first + 10)):
            span = scope.spans.add(trace_id=tid, span_id=os.urandom(8), parent_span_id=root)
            span.start_time_unix_nano, span.end_time_unix_nano = i * 1000, i * 1000 + 900
            attrs = span.attributes
            if i % 3 == 1:
                span.name = "chat m"
                calls = [{"type": "tool_call", "id": f"c{i + k}", "name": name, "arguments": {}}
                         for k, name in ((1, "check_policy"), (2, "issue_refund"))]  # fmt: skip
                for key, value in (("gen_ai.operation.name", "chat"),
                                   ("gen_ai.output.messages", json.dumps([{"role": "assistant", "parts": calls}]))):
                    attrs.add(key=key).value.string_value = value  # fmt: skip
                continue
            tool = "delete_account" if i == delete_at else "check_policy" if i % 3 == 2 else "issue_refund"
            span.name = f"execute_tool {tool}"
            for key, value in (("gen_ai.operation.name", "execute_tool"), ("gen_ai.tool.name", tool),
                               ("gen_ai.tool.call.id", f"c{i}"), ("gen_ai.tool.call.arguments", "{}")):
                attrs.add(key=key).value.string_value = value  # fmt: skip
        requests.append(request)
    return requests


@pytest.mark.parametrize("delete_at", [None, 902])
async def test_a_precedes_the_counters_cannot_rule_out_is_checked_as_the_trace_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delete_at: int | None
) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    builds = 0
    build = processor_core.build_trajectory

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal builds
        builds += 1
        return build(*args, **kwargs)

    monkeypatch.setattr(processor_core, "build_trajectory", counted)
    processor = Processor(
        config(tmp_path, receivers={"grpc": {"enabled": False}, "http": {"enabled": False}}, metrics={"endpoint": ""},
               assembly={"idle_timeout": 60, "confirm_wait": 0}),
        [load_policy(tmp_path / "policy.yaml")],
    )  # fmt: skip
    await processor.start()
    try:
        async with watch_records(processor) as records:
            await wait_until(lambda: processor.hub.has_subscribers, 5, "the watch stream")
            for request in trace_requests(1000, delete_at=delete_at):
                await processor.ingest(ReceivedRequest.of(request), "test")
            if delete_at is not None:
                await wait_until(lambda: bool(records), 10, "the early verdict")
    finally:
        await processor.stop()
    early = [v["invariant"] for r in records if r["decision"] == "early" for v in r["verdicts"]]
    # check_policy comes before each issue_refund: the precedes never fails, though with
    # parallel calls the counters say it may on each of the 100 requests after the first refund.
    assert "check-before-refund" not in early
    # Checked as the trace grows by a quarter: about log(100) / log(1.25) times, not 100.
    assert builds <= 30, builds
    # A failure that does happen is reported in flight, on its request (an invariant not checked
    # before), not when the trace has grown by a quarter.
    assert early == ([] if delete_at is None else ["refund-never"])
    if delete_at is not None:
        carried_it = (delete_at - 1) // 10 * 10 + 10  # spans 1-10, 11-20, ...: that request's last
        assert [r["span_count"] for r in records if r["decision"] == "early"] == [carried_it]
