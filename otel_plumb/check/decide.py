"""One decision per trajectory: every applicable policy checked once, the task key set, the
status worked out. The live processor, replay, the demo and campaigns all decide through here,
and reports, the verdict log and Watch read the ``Decided`` it returns (nothing is checked twice)."""

from __future__ import annotations

from collections.abc import Iterable

from otel_plumb.check.policy import CompiledPolicy
from otel_plumb.model import Decided, Trajectory, Verdict, trajectory_status


def decide(policies: Iterable[CompiledPolicy], trajectory: Trajectory) -> Decided:
    applied = [p for p in policies if p.applies_to(trajectory)]
    verdicts: list[Verdict] = []
    for p in applied:
        verdicts.extend(p.evaluate(trajectory))
    # The business key (order id, invoice id) names the trajectory wherever it is shown; the
    # trace id stays beside it.
    task = next((t for p in applied if (t := p.task_id(trajectory)) is not None), None)
    if task is not None:
        trajectory.key = task
    status = trajectory_status(trajectory, verdicts, checked=bool(applied))
    return Decided(trajectory, verdicts, [p.name for p in applied], status)
