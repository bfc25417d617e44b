"""The committed generated code matches the .proto files, and the messages match the records."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.model import Decided, Step, Trajectory, Verdict, trajectory_status
from otel_plumb.proto_gen import trajectory_pb2
from otel_plumb.report.records import decided_record, step_record, verdict_record
from otel_plumb.watch.service import trajectory_message


def record_of(trajectory: Trajectory, verdicts: list[Verdict], policies: list[str]) -> dict[str, Any]:
    return decided_record(Decided(trajectory, verdicts, policies, trajectory_status(trajectory, verdicts)))

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "otel_plumb" / "proto_gen"

# The generator stamps its own version into the code; a different grpcio-tools release
# changes those lines and nothing else.
_VERSION_STAMPS = [
    re.compile(r"^# Protobuf Python Version: .*$", re.MULTILINE),
    re.compile(r"ValidateProtobufRuntimeVersion\([^)]*\)", re.DOTALL),
    re.compile(r"^GRPC_GENERATED_VERSION = .*$", re.MULTILINE),
]


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_proto"] = module
    spec.loader.exec_module(module)
    return module


def _without_stamps(text: str) -> str:
    for stamp in _VERSION_STAMPS:
        text = stamp.sub("<version>", text)
    return text


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    written = _load_generator().generate(tmp_path)
    assert {p.name for p in written} == {p.name for p in COMMITTED.iterdir() if p.is_file()}
    for fresh in written:
        committed = COMMITTED / fresh.name
        assert _without_stamps(fresh.read_text()) == _without_stamps(committed.read_text()), (
            f"{committed} is stale: run python scripts/gen_proto.py"
        )


def test_generated_modules_import_package_relative() -> None:
    for path in COMMITTED.glob("*.py"):
        assert "from otel_plumb.v1 import" not in path.read_text(), path


def _sample() -> Trajectory:
    steps = [
        Step(0, "agent", "planner", "a1", None, "t" * 32, 10, 90, "openinference", agent="support"),
        Step(
            1,
            "tool",
            "refund",
            "b2",
            "a1",
            "t" * 32,
            20,
            30,
            "genai",
            args={"order": 7, "amount": 12.5, "tags": ["x", None]},
            args_status="captured",
            args_source="gen_ai.tool.call.arguments",
            result="ok",
            result_status="captured",
            tool_call_id="call_1",
            tokens=12,
        ),
        Step(2, "tool", "lookup", "c3", "a1", "t" * 32, 40, 50, "genai", error="timeout", args_status="redacted"),
    ]
    return Trajectory(
        key="t" * 32,
        trace_ids=["t" * 32],
        steps=steps,
        complete=False,
        incomplete_reason="max_wait",
        root_span_id="a1",
        service="svc",
        agent="support",
        start_ns=10,
        end_ns=2**62,
        span_count=3,
        attributes={"plumb.case.id": "case-1", "plumb.arm": "control"},
        problems=["x.y: not JSON"],
    )


def _verdicts() -> list[Verdict]:
    return [
        Verdict("no_refund", "payments", "fail", "critical", 1, "b2", "refund called", expected=None, got={"n": 1}),
        Verdict("lookup_first", "payments", "pass", "high"),
    ]


def test_every_record_field_has_a_proto_field_of_the_same_name() -> None:
    trajectory = _sample()
    fields = {
        trajectory_pb2.Trajectory: record_of(trajectory, _verdicts(), ["payments"]),
        trajectory_pb2.Step: step_record(trajectory.steps[1]),
        trajectory_pb2.Verdict: verdict_record(_verdicts()[0]),
    }
    # The live stream and the verdict log add how the trajectory was decided.
    fields[trajectory_pb2.Trajectory]["decision"] = "final"
    for message, record in fields.items():
        assert set(record) == set(message.DESCRIPTOR.fields_by_name), message.DESCRIPTOR.full_name


def test_record_round_trips_through_the_message() -> None:
    record = record_of(_sample(), _verdicts(), ["payments"])
    message = trajectory_message(record)
    back = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    # proto3 JSON writes 64-bit integers as strings, and leaves unset optional fields out.
    for key in ("start_time_unix_nano", "end_time_unix_nano"):
        back[key] = int(back[key])
    for step in back["steps"]:
        for key in ("start_time_unix_nano", "end_time_unix_nano"):
            step[key] = int(step[key])
    assert _drop_nulls(back) == _drop_nulls(record)
    assert message.steps[1].args.struct_value["amount"] == 12.5
    assert message.steps[2].args.WhichOneof("kind") == "null_value"
    assert message.steps[2].args_status == "redacted"
    assert not message.verdicts[1].HasField("step_index")
    assert message.end_time_unix_nano == 2**62


def _drop_nulls(value: object) -> object:
    """Null and absent mean the same in the message, except inside free-form values."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None or k in ("expected", "got")}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(args=JSON, result=JSON, expected=JSON, got=JSON, extra=st.dictionaries(st.text(min_size=1, max_size=5), JSON))
def test_conversion_is_the_proto3_json_mapping(
    args: object, result: object, expected: object, got: object, extra: dict[str, object]
) -> None:
    """The field-by-field conversion gives exactly what json_format.ParseDict gives, for any
    JSON values in the free-form fields, and ignores fields the proto does not know."""
    trajectory = _sample()
    record = record_of(trajectory, _verdicts(), ["payments"])
    record["steps"][1]["args"], record["steps"][1]["result"] = args, result
    record["verdicts"][0]["expected"], record["verdicts"][0]["got"] = expected, got
    record["decision"] = "early"
    unknown = {f"x_{k}": v for k, v in extra.items()}
    reference = json_format.ParseDict(record, trajectory_pb2.Trajectory())
    assert trajectory_message({**record, **unknown}) == reference
