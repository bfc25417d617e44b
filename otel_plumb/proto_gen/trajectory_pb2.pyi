# mypy: ignore-errors
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Step(_message.Message):
    __slots__ = ("index", "kind", "name", "span_id", "parent_span_id", "trace_id", "start_time_unix_nano", "end_time_unix_nano", "args", "args_status", "args_source", "result", "result_status", "error", "source", "agent", "convention", "tool_call_id", "tokens", "framework")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    END_TIME_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ARGS_STATUS_FIELD_NUMBER: _ClassVar[int]
    ARGS_SOURCE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RESULT_STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    CONVENTION_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORK_FIELD_NUMBER: _ClassVar[int]
    index: int
    kind: str
    name: str
    span_id: str
    parent_span_id: str
    trace_id: str
    start_time_unix_nano: int
    end_time_unix_nano: int
    args: _struct_pb2.Value
    args_status: str
    args_source: str
    result: _struct_pb2.Value
    result_status: str
    error: str
    source: str
    agent: str
    convention: str
    tool_call_id: str
    tokens: int
    framework: str
    def __init__(self, index: _Optional[int] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., span_id: _Optional[str] = ..., parent_span_id: _Optional[str] = ..., trace_id: _Optional[str] = ..., start_time_unix_nano: _Optional[int] = ..., end_time_unix_nano: _Optional[int] = ..., args: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., args_status: _Optional[str] = ..., args_source: _Optional[str] = ..., result: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., result_status: _Optional[str] = ..., error: _Optional[str] = ..., source: _Optional[str] = ..., agent: _Optional[str] = ..., convention: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tokens: _Optional[int] = ..., framework: _Optional[str] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("invariant", "policy", "verdict", "severity", "step_index", "span_id", "message", "expected", "got")
    INVARIANT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    GOT_FIELD_NUMBER: _ClassVar[int]
    invariant: str
    policy: str
    verdict: str
    severity: str
    step_index: int
    span_id: str
    message: str
    expected: _struct_pb2.Value
    got: _struct_pb2.Value
    def __init__(self, invariant: _Optional[str] = ..., policy: _Optional[str] = ..., verdict: _Optional[str] = ..., severity: _Optional[str] = ..., step_index: _Optional[int] = ..., span_id: _Optional[str] = ..., message: _Optional[str] = ..., expected: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., got: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class Violation(_message.Message):
    __slots__ = ("invariant", "severity", "message", "expected", "got")
    INVARIANT_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    GOT_FIELD_NUMBER: _ClassVar[int]
    invariant: str
    severity: str
    message: str
    expected: _struct_pb2.Value
    got: _struct_pb2.Value
    def __init__(self, invariant: _Optional[str] = ..., severity: _Optional[str] = ..., message: _Optional[str] = ..., expected: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., got: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("trace_id", "trace_ids", "key", "service", "agent", "session_id", "status", "complete", "incomplete_reason", "policies", "case_id", "variant_id", "trial_id", "arm", "root_span_id", "start_time_unix_nano", "end_time_unix_nano", "span_count", "steps", "verdicts", "problems", "decision")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_IDS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    INCOMPLETE_REASON_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    CASE_ID_FIELD_NUMBER: _ClassVar[int]
    VARIANT_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    ARM_FIELD_NUMBER: _ClassVar[int]
    ROOT_SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    END_TIME_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    SPAN_COUNT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    trace_ids: _containers.RepeatedScalarFieldContainer[str]
    key: str
    service: str
    agent: str
    session_id: str
    status: str
    complete: bool
    incomplete_reason: str
    policies: _containers.RepeatedScalarFieldContainer[str]
    case_id: str
    variant_id: str
    trial_id: str
    arm: str
    root_span_id: str
    start_time_unix_nano: int
    end_time_unix_nano: int
    span_count: int
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    verdicts: _containers.RepeatedCompositeFieldContainer[Verdict]
    problems: _containers.RepeatedScalarFieldContainer[str]
    decision: str
    def __init__(self, trace_id: _Optional[str] = ..., trace_ids: _Optional[_Iterable[str]] = ..., key: _Optional[str] = ..., service: _Optional[str] = ..., agent: _Optional[str] = ..., session_id: _Optional[str] = ..., status: _Optional[str] = ..., complete: _Optional[bool] = ..., incomplete_reason: _Optional[str] = ..., policies: _Optional[_Iterable[str]] = ..., case_id: _Optional[str] = ..., variant_id: _Optional[str] = ..., trial_id: _Optional[str] = ..., arm: _Optional[str] = ..., root_span_id: _Optional[str] = ..., start_time_unix_nano: _Optional[int] = ..., end_time_unix_nano: _Optional[int] = ..., span_count: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., verdicts: _Optional[_Iterable[_Union[Verdict, _Mapping]]] = ..., problems: _Optional[_Iterable[str]] = ..., decision: _Optional[str] = ...) -> None: ...
