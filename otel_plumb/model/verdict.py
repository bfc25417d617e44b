"""Verdicts: what a check says about one invariant on one trajectory (SPEC section 4)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

from otel_plumb.model.trajectory import Trajectory

VerdictValue = Literal["pass", "fail", "not_applicable", "indeterminate"]
Severity = Literal["critical", "high", "medium", "low"]
TrajectoryStatus = Literal["violating", "indeterminate", "conformant", "unchecked"]

SEVERITIES: Final[tuple[Severity, ...]] = ("critical", "high", "medium", "low")


@dataclass(slots=True, init=False)  # its own __init__: see model/trajectory.py
class Verdict:
    invariant: str
    policy: str
    verdict: VerdictValue
    severity: Severity
    # Where a failure is localised: a step (index and span_id), or the trajectory (both None),
    # e.g. for a call that never happened.
    step_index: int | None = None
    span_id: str | None = None
    message: str = ""
    expected: Any = None
    got: Any = None

    def __init__(
        self, invariant: str, policy: str, verdict: VerdictValue, severity: Severity, step_index: int | None = None,
        span_id: str | None = None, message: str = "", expected: Any = None, got: Any = None,
    ) -> None:  # fmt: skip
        self.invariant = invariant
        self.policy = policy
        self.verdict = verdict
        self.severity = severity
        self.step_index = step_index
        self.span_id = span_id
        self.message = message
        self.expected = expected
        self.got = got


def severity_at_least(severity: Severity, floor: Severity) -> bool:
    """``critical`` is the highest; ``severity_at_least("high", "medium")`` is True."""
    return SEVERITIES.index(severity) <= SEVERITIES.index(floor)


def trajectory_status(trajectory: Trajectory, verdicts: Iterable[Verdict], checked: bool = True) -> TrajectoryStatus:
    """Violating if anything fails, else indeterminate if anything is indeterminate or the
    trajectory is incomplete, else conformant; unchecked when no policy applied to it
    (``checked`` False). Missing data is never a pass."""
    if not checked:
        return "unchecked"
    values = {v.verdict for v in verdicts}
    if "fail" in values:
        return "violating"
    if "indeterminate" in values or not trajectory.complete:
        return "indeterminate"
    return "conformant"
