"""``otel_plumb.v1.VerdictService``: decided trajectories streamed to gRPC clients as they happen.

The processor publishes trajectory records (``otel_plumb.report.records.decided_record``)
to a :class:`VerdictHub`; each ``Watch`` call is one hub subscription with the request's filter.
Records become ``otel_plumb.v1.Trajectory`` messages by the proto3 JSON mapping: the field
names are the same, and free-form values (args, result, expected, got) become
``google.protobuf.Value``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import struct_pb2
from google.protobuf.message import Message

from otel_plumb.model.text import within_limits
from otel_plumb.proto_gen import trajectory_pb2, watch_pb2, watch_pb2_grpc
from otel_plumb.watch.hub import Record, VerdictHub

STATUSES = frozenset({"conformant", "violating", "indeterminate"})
DECISIONS = frozenset({"early", "final"})


def trajectory_message(record: Record) -> trajectory_pb2.Trajectory:
    """A trajectory record as a ``Trajectory`` message: the proto3 JSON mapping of the record
    (``json_format.ParseDict``), built field by field because ParseDict costs milliseconds per
    trajectory. Fields the proto does not know yet are left out rather than failing the stream."""
    message = trajectory_pb2.Trajectory()
    _fill(message, record)
    return message


# Per message type: (field name, how to set it) for every field, from the descriptor.
_SCALAR, _VALUE, _MESSAGES, _SCALARS = range(4)
_PLANS: dict[str, list[tuple[str, int]]] = {}


def _plan(descriptor: Any) -> list[tuple[str, int]]:  # a message Descriptor (Python or upb)
    plan = _PLANS.get(descriptor.full_name)
    if plan is None:
        plan = []
        for field in descriptor.fields:
            if field.message_type is None:
                plan.append((field.name, _SCALARS if field.is_repeated else _SCALAR))
            elif field.message_type.full_name == "google.protobuf.Value":
                plan.append((field.name, _VALUE))
            else:
                plan.append((field.name, _MESSAGES))
        _PLANS[descriptor.full_name] = plan
    return plan


def _fill(message: Message, record: Record) -> None:
    for name, kind in _plan(message.DESCRIPTOR):
        value = record.get(name)
        if kind == _VALUE:
            _set_value(getattr(message, name), value)
        elif value is None:
            continue  # unset: null in JSON
        elif kind == _SCALAR:
            setattr(message, name, value)
        elif kind == _SCALARS:
            getattr(message, name).extend(value)
        else:
            for item in value:
                _fill(getattr(message, name).add(), item)


# JSON levels of a value sent as it is: each is about three protobuf levels (Value, Struct, map
# entry), and a client's protobuf runtime refuses a message nested past 100. What a Value
# cannot hold as it is (non-string keys, an integer past a double, deeper levels) goes as text
# (``model.text.within_limits``), so one trajectory with odd arguments cannot break a stream.
_MAX_VALUE_DEPTH = 16
_MAX_DOUBLE_INT = 2**1023


def _set_value(target: struct_pb2.Value, value: Any) -> None:
    _set_json(target, within_limits(value, _MAX_VALUE_DEPTH, _MAX_DOUBLE_INT))


def _set_json(target: struct_pb2.Value, value: Any) -> None:
    if value is None:
        target.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, (int, float)):
        target.number_value = value
    elif isinstance(value, str):
        target.string_value = value
    elif isinstance(value, dict):
        target.struct_value.SetInParent()  # {} is a value too
        target.struct_value.update(value)
    elif isinstance(value, (list, tuple)):
        target.list_value.SetInParent()
        target.list_value.extend(value)
    else:
        target.string_value = str(value)


def record_filter(request: watch_pb2.WatchRequest) -> Callable[[Record], bool]:
    """The request's filter: every non-empty list must match, any listed value matches."""
    policies = frozenset(request.policies)
    agents = frozenset(request.agents)
    statuses = frozenset(request.statuses)
    decisions = frozenset(request.decisions)

    def accept(record: Record) -> bool:
        if statuses and record.get("status") not in statuses:
            return False
        if decisions and record.get("decision") not in decisions:
            return False
        if agents and record.get("agent") not in agents:
            return False
        return not policies or not policies.isdisjoint(_record_policies(record))

    return accept


def _record_policies(record: Record) -> set[str]:
    # A trajectory names the policies that applied; its verdicts name theirs too.
    names = set(record.get("policies") or ())
    names.update(v["policy"] for v in record.get("verdicts") or () if v.get("policy"))
    return names


class VerdictServicer(watch_pb2_grpc.VerdictServiceServicer):
    def __init__(self, hub: VerdictHub) -> None:
        self._hub = hub

    async def Watch(
        self, request: watch_pb2.WatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[trajectory_pb2.Trajectory]:
        for field, values, known in (
            ("status", request.statuses, STATUSES),
            ("decision", request.decisions, DECISIONS),
        ):
            unknown = sorted(set(values) - known)
            if unknown:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"unknown {field} {', '.join(unknown)}; expected one of {', '.join(sorted(known))}",
                )
        subscription = self._hub.subscribe(record_filter(request))
        try:
            # Tells the client the subscription is in place: everything decided from now on is sent.
            await context.send_initial_metadata(())
            async for record in subscription:
                yield trajectory_message(record)
        finally:
            subscription.close()


def add_verdict_service(server: grpc.aio.Server, hub: VerdictHub) -> None:
    """Serve ``otel_plumb.v1.VerdictService`` on ``server``, streaming what ``hub`` publishes."""
    # The generated helper is untyped; this names its type.
    add: Callable[[VerdictServicer, grpc.aio.Server], None] = watch_pb2_grpc.add_VerdictServiceServicer_to_server
    add(VerdictServicer(hub), server)
