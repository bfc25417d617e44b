# mypy: ignore-errors
from . import trajectory_pb2 as _trajectory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class WatchRequest(_message.Message):
    __slots__ = ("policies", "agents", "statuses", "decisions")
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    policies: _containers.RepeatedScalarFieldContainer[str]
    agents: _containers.RepeatedScalarFieldContainer[str]
    statuses: _containers.RepeatedScalarFieldContainer[str]
    decisions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, policies: _Optional[_Iterable[str]] = ..., agents: _Optional[_Iterable[str]] = ..., statuses: _Optional[_Iterable[str]] = ..., decisions: _Optional[_Iterable[str]] = ...) -> None: ...
