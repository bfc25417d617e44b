"""The policy file as pydantic models (SPEC section 4). Unknown keys are errors."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from otel_plumb.model import Severity
from otel_plumb.redact.config import RedactionRules

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
ToolRef = str | list[str]
CHECK_KINDS = (
    "must_call",
    "never_call",
    "call_count",
    "precedes",
    "responds",
    "arg_equals",
    "arg_matches",
    "arg_satisfies",
    "budget",
    "expr",
    "matches_reference",
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AppliesTo(_Model):
    service: str | None = None
    agent: str | None = None


class TaskSpec(_Model):
    attribute: str = Field(min_length=1)


class ContextSpec(_Model):
    attributes_prefix: str = "plumb.context."
    file: str | None = None
    # A context file outside the policy's folder (after symlinks) is read only when this says so:
    # a policy must not read /proc/self/environ or a secrets mount by accident.
    allow_outside_policy_dir: bool = False


class ToolSpec(_Model):
    tool: ToolRef


class NeverCall(_Model):
    tool: ToolRef
    attempts: bool = False


class CallCount(_Model):
    tool: ToolRef
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> CallCount:
        if self.min is None and self.max is None:
            raise ValueError("call_count needs min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"call_count min {self.min} is above max {self.max}")
        return self


class Precedes(_Model):
    first: ToolRef
    then: ToolRef


class Responds(_Model):
    trigger: ToolRef
    then: ToolRef


class StepValue(_Model):
    """Dataflow source: an argument or result of the latest earlier successful call of ``tool``."""

    tool: ToolRef
    result: str | None = None
    arg: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> StepValue:
        if (self.result is None) == (self.arg is None):
            raise ValueError("step needs exactly one of result or arg (a path)")
        return self


class ArgEquals(_Model):
    tool: ToolRef
    arg: str
    value: Any = None
    context: str | None = None
    step: StepValue | None = None
    tolerance: Decimal = Field(default=Decimal(0), ge=0)
    compare: Literal["normalised", "exact", "set"] = "normalised"

    @model_validator(mode="after")
    def _one_expected(self) -> ArgEquals:
        given = [k for k in ("value", "context", "step") if k in self.model_fields_set]
        if len(given) != 1:
            raise ValueError("arg_equals needs exactly one of value, context or step")
        return self


class ArgMatches(_Model):
    tool: ToolRef
    arg: str
    regex: str


class ArgSatisfies(_Model):
    tool: ToolRef
    expr: str


class Budget(_Model):
    max_steps: int | None = Field(default=None, ge=0)
    max_tool_calls: int | None = Field(default=None, ge=0)
    max_llm_calls: int | None = Field(default=None, ge=0)
    max_tool_errors: int | None = Field(default=None, ge=0)
    max_duration_ms: float | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _some_limit(self) -> Budget:
        if not self.model_fields_set:
            raise ValueError("budget needs at least one limit")
        return self


class ReferenceSource(_Model):
    """Where the reference trajectory comes from: a context value, or a file of references by
    task (the trajectory attribute ``key``, default the policy's ``task.attribute``)."""

    context: str | None = None
    file: str | None = None
    key: str | None = None

    @model_validator(mode="after")
    def _one(self) -> ReferenceSource:
        if (self.context is None) == (self.file is None):
            raise ValueError("reference needs exactly one of context or file")
        if self.key is not None and self.file is None:
            raise ValueError("reference.key goes with reference.file")
        return self


ReferenceMode = Literal["strict", "unordered", "subset", "superset"]
ArgsMode = Literal["exact", "ignore", "subset", "superset"]


class MatchesReference(_Model):
    reference: ReferenceSource
    mode: ReferenceMode = "strict"
    args: ArgsMode = "ignore"
    per_tool: dict[str, ArgsMode] = Field(default_factory=dict)
    # A reference file outside the policy's folder (see context.allow_outside_policy_dir).
    allow_outside_policy_dir: bool = False


class Scope(_Model):
    after: ToolRef | None = None
    before: ToolRef | None = None
    between: tuple[ToolRef, ToolRef] | None = None

    @model_validator(mode="after")
    def _one(self) -> Scope:
        if len(self.model_fields_set) != 1:
            raise ValueError("scope needs exactly one of after, before or between")
        return self


class Invariant(_Model):
    id: str = Field(pattern=NAME_PATTERN)
    severity: Severity = "high"
    description: str | None = None
    when: str | None = None
    applies_to: AppliesTo | None = None
    scope: Scope | None = None
    attempts: bool | None = None
    must_call: ToolRef | ToolSpec | None = None
    never_call: ToolRef | NeverCall | None = None
    call_count: CallCount | None = None
    precedes: Precedes | None = None
    responds: Responds | None = None
    arg_equals: ArgEquals | None = None
    arg_matches: ArgMatches | None = None
    arg_satisfies: ArgSatisfies | None = None
    budget: Budget | None = None
    expr: str | None = None
    matches_reference: MatchesReference | None = None

    def kind(self) -> str:
        kinds = [k for k in CHECK_KINDS if getattr(self, k) is not None]
        if not kinds:
            raise ValueError(f"invariant {self.id!r} has no check (one of: {', '.join(CHECK_KINDS)})")
        if len(kinds) > 1:
            raise ValueError(
                f"invariant {self.id!r} has {len(kinds)} checks ({', '.join(kinds)}); use one invariant each"
            )
        return kinds[0]


class PolicyFile(_Model):
    policy: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    applies_to: AppliesTo | None = None
    task: TaskSpec | None = None
    context: ContextSpec | None = None
    # Added to the processor's redaction rules for the trajectories this policy applies to.
    redaction: RedactionRules | None = None
    invariants: list[Invariant] = Field(min_length=1)
