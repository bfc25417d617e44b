"""Check stage: policies (YAML, compiled once) and verdicts per trajectory (SPEC section 4).

Pure: no I/O except reading the policy and its context file when it is loaded.
"""

from otel_plumb.check.decide import decide, late_span_could_change, redaction_for
from otel_plumb.check.errors import PolicyError
from otel_plumb.check.expr import BUDGET_EXCEEDED
from otel_plumb.check.policy import (
    CompiledInvariant,
    CompiledPolicy,
    ToolNames,
    budget_exceeded,
    load_policies,
    load_policy,
)

__all__ = [
    "BUDGET_EXCEEDED",
    "CompiledInvariant",
    "CompiledPolicy",
    "PolicyError",
    "ToolNames",
    "budget_exceeded",
    "decide",
    "late_span_could_change",
    "load_policies",
    "load_policy",
    "redaction_for",
]  # fmt: skip
