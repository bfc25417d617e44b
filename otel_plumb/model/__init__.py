"""The data every stage shares: spans as received, normalised spans, steps and trajectories.

Plain classes with ``__slots__``: these are on the hot path and never validated by pydantic.
"""

from otel_plumb.model.decided import Decided, DecisionKind
from otel_plumb.model.span import SpanEvent, SpanRecord
from otel_plumb.model.trajectory import (
    RESERVED_PREFIX,
    CaptureStatus,
    NormalisedSpan,
    RequestedCall,
    Step,
    StepKind,
    Trajectory,
)
from otel_plumb.model.verdict import (
    SEVERITIES,
    Severity,
    TrajectoryStatus,
    Verdict,
    VerdictValue,
    severity_at_least,
    trajectory_status,
)

__all__ = [
    "RESERVED_PREFIX",
    "SEVERITIES",
    "CaptureStatus",
    "Decided",
    "DecisionKind",
    "NormalisedSpan",
    "RequestedCall",
    "Severity",
    "SpanEvent",
    "SpanRecord",
    "Step",
    "StepKind",
    "Trajectory",
    "TrajectoryStatus",
    "Verdict",
    "VerdictValue",
    "severity_at_least",
    "trajectory_status",
]
