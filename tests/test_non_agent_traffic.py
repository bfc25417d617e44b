"""A gateway sees more than agents: traces of plain HTTP services (here the real httpx
instrumentation against a local server) go through the processor beside an agent's. They are no
agent's run, so no policy applies to them: never a violation, forwarded exactly as sent."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from test_live_support import (
    agent_provider,
    attribute,
    config,
    http_service,
    metric,
    orders_server,
    run_agent,
    scrape,
    sent_spans,
    wait_until,
)

from otel_plumb.demo.agent import INVOICES
from otel_plumb.demo.backend import OtlpBackend
from otel_plumb.processor import Processor

# No applies_to: the policy would apply to every trajectory, and must_call fails on any trace
# that shows no such call.
POLICY = """
policy: everywhere
invariants:
  - {id: dup-check, severity: critical, must_call: check_duplicate}
  - {id: short, budget: {max_steps: 40}}
"""
HTTP_TRACES = 5
FAULTY_DUP_CHECK = sum(1 for i in INVOICES if i.fault == "skip_duplicate_check")


async def test_http_service_traces_are_forwarded_untouched_and_never_violate(tmp_path: Path) -> None:
    policy = tmp_path / "everywhere.yaml"
    policy.write_text(POLICY)
    backend = OtlpBackend()
    await backend.start(0)
    processor = Processor(config(tmp_path, backend.endpoint, policies=[str(policy)]))
    await processor.start()
    try:
        assert processor.grpc_port
        http_provider, http_sent = agent_provider(processor.grpc_port, "grpc")
        agent, agent_sent = agent_provider(processor.grpc_port, "grpc")
        # Each trace: two httpx calls under one span of the service's own.
        paths = [[f"/orders/O-{n}", f"/orders/O-{n}/lines"] for n in range(HTTP_TRACES)]
        with orders_server() as base:
            await asyncio.gather(
                asyncio.to_thread(http_service, http_provider, base, paths), asyncio.to_thread(run_agent, agent)
            )
        http = sent_spans(http_sent)
        sent = {**http, **sent_spans(agent_sent)}
        assert len(http) == 3 * HTTP_TRACES
        await wait_until(lambda: backend.span_count >= len(sent), 15, "every span downstream")
        text = await asyncio.to_thread(scrape, processor.metrics_port or 0)
    finally:
        await processor.stop()
        await backend.stop()

    received = backend.spans()
    assert Counter(s.span_id.hex() for s in received) == Counter(sent.keys()), "every span exactly once"
    for span in received:
        if span.span_id.hex() in http:
            # Not even plumb.verdict: the trace is not a trajectory.
            assert span == http[span.span_id.hex()]
    roots = [s for s in received if not s.parent_span_id and s.span_id.hex() not in http]
    assert len(roots) == len(INVOICES)
    assert all(attribute(r, "plumb.policy") == "everywhere" for r in roots)
    violating = [r for r in roots if attribute(r, "plumb.verdict") == "violating"]
    assert len(violating) == FAULTY_DUP_CHECK
    assert metric(text, "plumb_violations_total", invariant="dup-check") == FAULTY_DUP_CHECK
    assert metric(text, "plumb_violations_total") == FAULTY_DUP_CHECK
    assert metric(text, "plumb_trajectories_total", status="unchecked") == HTTP_TRACES
    # Counted under the service its root names, as every trajectory with no agent is.
    assert metric(text, "plumb_trajectories_total", status="unchecked", agent="ap-service-grpc") == HTTP_TRACES
    assert metric(text, "plumb_trajectories_total", policy="everywhere") == len(INVOICES)
    # The verdict log (like the store and Watch) holds the agents' trajectories only.
    logged = [json.loads(line) for line in (tmp_path / "verdicts.jsonl").read_text().splitlines()]
    assert sorted(r["trace_id"] for r in logged) == sorted(r.trace_id.hex() for r in roots)
