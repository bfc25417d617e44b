"""Watch on a running processor: the bundled agent sends its traces over the real OTLP exporter
and the decided trajectories arrive on the VerdictService stream of the same gRPC port."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
from test_live_support import agent_provider, config, run_agent, wait_until

from otel_plumb.demo.agent import INVOICES
from otel_plumb.demo.run import policy_path
from otel_plumb.processor import Processor
from otel_plumb.proto_gen import trajectory_pb2, watch_pb2, watch_pb2_grpc
from otel_plumb.report.records import decided_record
from otel_plumb.watch.service import trajectory_message

DEADLINE = 20.0


async def _take(call: Any, count: int) -> list[trajectory_pb2.Trajectory]:
    messages = []
    async with asyncio.timeout(DEADLINE):
        async for message in call:
            messages.append(message)
            if len(messages) == count:
                break
    return messages


async def test_running_processor_streams_verdicts(tmp_path: Path) -> None:
    processor = Processor(config(tmp_path, policies=[str(policy_path())]))
    decided: list[dict[str, Any]] = []
    processor.on_decided(lambda d: decided.append(decided_record(d)))
    await processor.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc_port}")
    try:
        stub = watch_pb2_grpc.VerdictServiceStub(channel)
        # Final decisions only: failures found while a trace is in flight are also streamed
        # early, as many as arrive before the trace completes.
        everything = stub.Watch(watch_pb2.WatchRequest(decisions=["final"]), timeout=DEADLINE)
        violating = stub.Watch(
            watch_pb2.WatchRequest(policies=["ap-controls"], statuses=["violating"], decisions=["final"]),
            timeout=DEADLINE,
        )
        for call in (everything, violating):
            await call.initial_metadata()

        provider, _ = agent_provider(processor.grpc_port or 0)

        await asyncio.to_thread(run_agent, provider)
        await wait_until(lambda: len(decided) == len(INVOICES), DEADLINE, "every trajectory decided")
        expected_violating = [r for r in decided if r["status"] == "violating"]
        assert expected_violating and len(expected_violating) < len(decided)

        got_all = await _take(everything, len(decided))
        got_violating = await _take(violating, len(expected_violating))
        by_trace = {r["trace_id"]: r for r in decided}
        assert sorted(m.trace_id for m in got_all) == sorted(by_trace)
        assert [m.trace_id for m in got_violating] == [r["trace_id"] for r in expected_violating]
        for message in got_all:
            assert message == trajectory_message(by_trace[message.trace_id])
        failed = {v.invariant for m in got_violating for v in m.verdicts if v.verdict == "fail"}
        assert "dup-check" in failed
        everything.cancel()
        violating.cancel()
    finally:
        await channel.close()
        await processor.stop()
