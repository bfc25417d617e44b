"""One decided trajectory (``model.Decided``) as a plain JSON-ready dict.

The one shape used by report JSON (``trajectories[]``), the JSONL verdict log, the Watch
stream and the campaign store, so every consumer reads the same field names.
"""

from __future__ import annotations

from typing import Any, Final

from otel_plumb.model import Decided, Step, Verdict


def step_record(step: Step) -> dict[str, Any]:
    """A step's record (its arguments and result only when captured)."""
    return {
        "index": step.index,
        "kind": step.kind,
        "name": step.name,
        "span_id": step.span_id,
        "parent_span_id": step.parent_span_id,
        "trace_id": step.trace_id,
        "start_time_unix_nano": step.start_ns,
        "end_time_unix_nano": step.end_ns,
        "args": step.args if step.args_status == "captured" else None,
        "args_status": step.args_status,
        "args_source": step.args_source,
        "result": step.result if step.result_status == "captured" else None,
        "result_status": step.result_status,
        "error": step.error,
        "source": step.source,
        "agent": step.agent,
        "convention": step.convention,
        "tool_call_id": step.tool_call_id,
        "tokens": step.tokens,
        "framework": step.framework,
    }


# The keys of a step's record, in order: the columns of the steps' table form (``step_row``).
STEP_KEYS: Final[tuple[str, ...]] = tuple(step_record(Step(0, "tool", "", "", None, "", 0, 0, "")))


def step_row(step: Step) -> tuple[Any, ...]:
    """A step's record values, in ``STEP_KEYS`` order."""
    return tuple(step_record(step).values())


def verdict_record(v: Verdict) -> dict[str, Any]:
    return {
        "invariant": v.invariant,
        "policy": v.policy,
        "verdict": v.verdict,
        "severity": v.severity,
        "step_index": v.step_index,
        "span_id": v.span_id,
        "message": v.message,
        "expected": v.expected,
        "got": v.got,
    }


def decided_record(decided: Decided, steps_as_table: bool = False) -> dict[str, Any]:
    """The record; with ``steps_as_table``, its steps as ``{"keys": STEP_KEYS, "rows": [...]}``
    (half the JSON: how the trajectory store keeps them)."""
    trajectory = decided.trajectory
    return {
        "trace_id": trajectory.trace_id,
        "trace_ids": list(trajectory.trace_ids),
        "key": trajectory.key,
        "decision": decided.decision,
        "service": trajectory.service,
        "agent": trajectory.agent,
        "session_id": trajectory.session_id,
        "status": decided.status,
        "complete": trajectory.complete,
        "incomplete_reason": trajectory.incomplete_reason,
        "policies": list(decided.policies),
        "case_id": trajectory.case_id,
        "variant_id": trajectory.variant_id,
        "trial_id": trajectory.trial_id,
        "arm": trajectory.arm,
        "root_span_id": trajectory.root_span_id,
        "start_time_unix_nano": trajectory.start_ns,
        "end_time_unix_nano": trajectory.end_ns,
        "span_count": trajectory.span_count,
        "steps": (
            {"keys": STEP_KEYS, "rows": [step_row(s) for s in trajectory.steps]}
            if steps_as_table
            else [step_record(s) for s in trajectory.steps]
        ),
        "verdicts": [verdict_record(v) for v in decided.verdicts],
        "problems": list(trajectory.problems),
    }
