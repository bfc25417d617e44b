"""VerdictService.Watch over a real grpc.aio server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from otel_plumb.model import Decided, Step, Trajectory, Verdict, trajectory_status
from otel_plumb.proto_gen import watch_pb2, watch_pb2_grpc
from otel_plumb.report.records import decided_record
from otel_plumb.watch import VerdictHub
from otel_plumb.watch.service import add_verdict_service


def record_of(trajectory: Trajectory, verdicts: list[Verdict], policies: list[str]) -> dict[str, Any]:
    return decided_record(Decided(trajectory, verdicts, policies, trajectory_status(trajectory, verdicts)))

DEADLINE = 10.0


@pytest.fixture
async def served() -> AsyncIterator[tuple[VerdictHub, watch_pb2_grpc.VerdictServiceStub]]:
    hub = VerdictHub()
    server = grpc.aio.server()
    add_verdict_service(server, hub)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield hub, watch_pb2_grpc.VerdictServiceStub(channel)
    finally:
        await channel.close()
        hub.close()
        await server.stop(grace=None)


def _record(n: int, agent: str, policy: str, verdict: str) -> dict[str, Any]:
    trace_id = f"{n:032x}"
    step = Step(
        0,
        "tool",
        "refund",
        f"{n:016x}",
        None,
        trace_id,
        1,
        2,
        "genai",
        args={"amount": n},
        args_status="captured",
        agent=agent,
    )
    trajectory = Trajectory(key=trace_id, trace_ids=[trace_id], steps=[step], agent=agent, span_count=1)
    verdicts = [Verdict("no_refund", policy, verdict, "critical", 0, step.span_id, "checked", 0, n)]  # type: ignore[arg-type]
    record = record_of(trajectory, verdicts, [policy])
    record["decision"] = "final"
    return record


async def _watch(stub: watch_pb2_grpc.VerdictServiceStub, **filters: list[str]) -> Any:
    call = stub.Watch(watch_pb2.WatchRequest(**filters), timeout=DEADLINE)
    await call.initial_metadata()  # the subscription is in place
    return call


async def test_watch_streams_published_records_with_filters(served: Any) -> None:
    hub, stub = served
    everything = await _watch(stub)
    violating_support = await _watch(stub, agents=["support"], statuses=["violating"])
    billing_policy = await _watch(stub, policies=["billing"])

    published = [
        _record(1, "support", "payments", "fail"),
        _record(2, "support", "payments", "pass"),
        _record(3, "sales", "billing", "fail"),
        _record(4, "support", "billing", "fail"),
    ]
    for record in published:
        hub.publish(record)
    hub.close()  # ends every stream after what was published

    got_all = [m async for m in everything]
    got_violating = [m async for m in violating_support]
    got_billing = [m async for m in billing_policy]

    assert [m.trace_id for m in got_all] == [r["trace_id"] for r in published]
    assert [m.trace_id for m in got_violating] == [published[0]["trace_id"], published[3]["trace_id"]]
    assert [m.trace_id for m in got_billing] == [published[2]["trace_id"], published[3]["trace_id"]]
    first = got_all[0]
    assert first.status == "violating" and first.agent == "support" and list(first.policies) == ["payments"]
    assert first.steps[0].args.struct_value["amount"] == 1
    assert first.verdicts[0].got.number_value == 1 and first.verdicts[0].step_index == 0
    assert got_all[1].status == "conformant"


async def test_watch_filters_early_decisions(served: Any) -> None:
    hub, stub = served
    early_only = await _watch(stub, decisions=["early"])
    early = {**_record(1, "support", "payments", "fail"), "decision": "early"}
    hub.publish(early)
    hub.publish(_record(1, "support", "payments", "fail"))
    hub.close()
    got = [m async for m in early_only]
    assert [(m.trace_id, m.decision) for m in got] == [(early["trace_id"], "early")]


async def test_watch_rejects_unknown_status(served: Any) -> None:
    _hub, stub = served
    call = stub.Watch(watch_pb2.WatchRequest(statuses=["broken"]), timeout=DEADLINE)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "broken" in (info.value.details() or "")
    call = stub.Watch(watch_pb2.WatchRequest(decisions=["soon"]), timeout=DEADLINE)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_cancelled_watch_unsubscribes(served: Any) -> None:
    hub, stub = served
    call = await _watch(stub)
    assert len(hub._subscribers) == 1
    call.cancel()
    async with asyncio.timeout(DEADLINE):
        while hub._subscribers:
            await asyncio.sleep(0.01)


async def test_a_trajectory_with_odd_arguments_does_not_break_the_stream(served: Any) -> None:
    """Arguments a ``google.protobuf.Value`` cannot hold as they are (int keys from a Python
    repr, an integer past a double, nesting deeper than a client's protobuf runtime reads) go
    as text; the subscriber gets that trajectory and the next."""
    hub, stub = served
    call = await _watch(stub)
    deep: Any = "bottom"
    for _ in range(60):
        deep = {"a": deep}
    odd = _record(1, "support", "payments", "fail")
    odd["steps"][0]["args"] = {"ids": {7: "x"}, "huge": 10**400, "deep": deep}
    hub.publish(odd)
    hub.publish(_record(2, "support", "payments", "pass"))
    first = await asyncio.wait_for(call.read(), DEADLINE)
    second = await asyncio.wait_for(call.read(), DEADLINE)
    assert [first.trace_id, second.trace_id] == [f"{1:032x}", f"{2:032x}"]
    args = first.steps[0].args.struct_value
    assert args["ids"]["7"] == "x" and args["huge"] == str(10**400)
    nested = args["deep"]
    for _ in range(15):
        nested = nested["a"]
    assert isinstance(nested, str) and "bottom" in nested  # below 16 levels: the JSON text
    call.cancel()
