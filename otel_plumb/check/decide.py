"""One decision per trajectory: every applicable policy checked once, the task key set, the
status worked out. The live processor, replay, the demo and campaigns all decide through here,
and reports, the verdict log and Watch read the ``Decided`` it returns (nothing is checked twice)."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterable, Sequence
from typing import Final

from otel_plumb.check.policy import CompiledPolicy
from otel_plumb.model import Decided, Trajectory, Verdict, trajectory_status
from otel_plumb.model.trajectory import ATTRIBUTES_DROPPED, MISSING_PARENT, UNREADABLE_INPUT, UNREADABLE_SPAN
from otel_plumb.redact import Redaction, RedactionConfig


def decide(policies: Iterable[CompiledPolicy], trajectory: Trajectory) -> Decided:
    agent_run = _agent_run(trajectory)
    applied = [
        p for p in policies
        if p.applies_to(trajectory) and (agent_run or p.unread_tool_span(trajectory) is not None)
    ]  # fmt: skip
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


def late_span_could_change(policies: Iterable[CompiledPolicy], decided: Decided) -> bool:
    """Whether a span not yet seen could change what ``decided`` says in a way that matters
    (a complete trace's spans from another process, or resent after a lost acknowledgement,
    arrive after ``idle_timeout``): clear a failure, give a span its missing parent, give an
    agent framework's trace the agent's spans (so far only, say, its root: not checked), or
    bring the call of a tool a span no convention reads is named after (so far indeterminate).

    A failure is one a late span could clear when it rests on what is missing (``must_call``,
    ``precedes``, ``call_count`` minimum, a check reading other steps), while a forbidden call
    or a budget crossed stays so whatever else arrives: its failing invariants are checked
    again as if spans may be missing from anywhere, and one that is then no longer a certain
    fail could be cleared."""
    t = decided.trajectory
    if not decided.is_agent_run:
        return any(st.framework for st in t.steps)
    if not t.complete:
        return t.incomplete_reason == MISSING_PARENT
    failing = {(v.policy, v.invariant) for v in decided.failures}
    if not failing:
        applied = set(decided.policies)
        return decided.status == "indeterminate" and any(
            p.name in applied and p.unread_tool_span(t) is not None for p in policies
        )
    missing = dataclasses.replace(t, complete=False, incomplete_reason=MISSING_PARENT, problems=list(t.problems))
    names = {policy for policy, _ in failing}
    for p in policies:
        if p.name in names and any(
            (v.policy, v.invariant) in failing and v.verdict != "fail" for v in p.evaluate(missing)
        ):
            return True
    return False


def _agent_run(trajectory: Trajectory) -> bool:
    """Whether policies apply at all. A trace with no agent span (a gateway's HTTP and database
    traffic) is not an agent's run: checking it would report every ``must_call`` as violated.
    Unless some of its spans could not be read: those may have been the agent's, so the policies
    apply and say indeterminate. (So does a policy one of whose tools names a span no convention
    reads: ``CompiledPolicy.unread_tool_span``.)"""
    return trajectory.has_agent_spans or trajectory.incomplete_reason in _UNREAD


_UNREAD: Final = frozenset({UNREADABLE_SPAN, UNREADABLE_INPUT, ATTRIBUTES_DROPPED})

# The HMAC key when none is configured: one per process, so hashed values compare equal within
# one run (one report, one processor's lifetime) and not across runs.
_RUN_KEY: Final = secrets.token_bytes(32)


def redaction_for(
    policies: Sequence[CompiledPolicy], config: RedactionConfig | None = None, key: bytes | None = None
) -> Redaction | None:
    """How decisions on these policies are redacted before they are emitted: the ``redaction``
    section given (the processor's) with each policy's own added; None when there is no rule.
    The HMAC key: ``key``, else the section's ``hash_key``, else one random key per process."""
    if key is None:
        key = config.hash_key.encode() if config is not None and config.hash_key else _RUN_KEY
    redaction = Redaction(config, {p.name: p.redaction for p in policies}, key)
    return redaction if redaction.configured else None
