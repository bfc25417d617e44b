"""A decided trajectory: what every consumer of a decision receives (metrics, verdict log,
Watch, export, reports, the campaign store)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from otel_plumb.model.trajectory import Trajectory
from otel_plumb.model.verdict import TrajectoryStatus, Verdict

# "final": the trajectory is done and every invariant was checked; "early": failures already
# certain while the trajectory is still in flight (only those verdicts, step indices provisional).
DecisionKind = Literal["final", "early"]


@dataclass(slots=True, init=False)
class Decided:
    trajectory: Trajectory
    verdicts: list[Verdict]
    # The policies that applied to the trajectory (none: status "unchecked").
    policies: list[str]
    status: TrajectoryStatus
    decision: DecisionKind = "final"

    def __init__(
        self, trajectory: Trajectory, verdicts: list[Verdict], policies: list[str], status: TrajectoryStatus,
        decision: DecisionKind = "final",
    ) -> None:
        self.trajectory = trajectory
        self.verdicts = verdicts
        self.policies = policies
        self.status = status
        self.decision = decision

    @property
    def key(self) -> str:
        """The task key when a policy names one (``task: {attribute: ...}``), else the trace or
        session id."""
        return self.trajectory.key

    @property
    def failures(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.verdict == "fail"]

    @property
    def is_agent_run(self) -> bool:
        """Whether some policy applied or some span is an agent's. A trace of service spans
        only is counted and forwarded as it came, but it is no trajectory to log, store,
        stream, annotate or watch for consistency."""
        return bool(self.policies) or self.trajectory.has_agent_spans
