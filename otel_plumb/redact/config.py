"""The ``redaction`` section: what leaves the processor, per argument path and per pattern.

The same rules appear globally (the processor config's ``redaction``) and per policy (a policy
file's ``redaction``): a policy's rules are added to the global ones for the trajectories it
applies to, and where two rules cover the same value the stricter action wins.
"""

from __future__ import annotations

from typing import Literal

import re2
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from otel_plumb.redact.patterns import BUILTIN_PATTERNS, compile_regex


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Truncate(_Model):
    """Keep the first ``truncate`` characters and say how many were cut."""

    truncate: int = Field(ge=0)


# drop: the value (a path) or the matched text (a pattern) is removed; mask: replaced by a
# marker naming the rule; hash: replaced by a keyed HMAC, so equal values stay equal.
Action = Literal["drop", "mask", "hash"] | Truncate


class PatternRule(_Model):
    """Text matching ``regex`` (RE2 syntax), or the built-in pattern ``name`` when no regex is given,
    anywhere in an emitted value: arguments, results, errors, verdict messages, expected and got."""

    name: str = Field(min_length=1, max_length=64)
    regex: str | None = None
    action: Action = "mask"

    @model_validator(mode="after")
    def _known(self) -> PatternRule:
        if self.regex is None and self.name not in BUILTIN_PATTERNS:
            known = ", ".join(sorted(BUILTIN_PATTERNS))
            raise ValueError(f"no built-in pattern {self.name!r} (known: {known}); give a regex for your own pattern")
        if self.regex is not None:
            try:
                compile_regex(self.regex)
            except re2.error as exc:
                arg = exc.args[0] if exc.args else exc
                text = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
                raise ValueError(f"regex {self.regex!r} is not RE2 syntax: {text}") from None
        return self


Where = Literal["args", "result"]
WHERE: tuple[Where, ...] = ("args", "result")


class PathRule(_Model):
    """The value at ``path`` in a step's arguments (and results), e.g. ``card.number``,
    ``items.*.ssn`` (``*``: any one key or list index), ``**.password`` (at any depth).
    Wherever the same value appears in other emitted text (a message, a prompt forwarded
    downstream) it is replaced the same way."""

    path: str = Field(min_length=1)
    # Only for these tools (all tools when empty).
    tools: list[str] = Field(default_factory=list)
    # Where to look: a step's arguments, its result, or both.
    within: list[Where] = Field(default_factory=lambda: list(WHERE), alias="in")
    action: Action = "mask"

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("path")
    @classmethod
    def _segments(cls, path: str) -> str:
        if any(not segment for segment in path.split(".")):
            raise ValueError(f"path {path!r} has an empty segment")
        return path


class RedactionRules(_Model):
    """The rules of one policy's ``redaction`` section."""

    # A bare name stands for that built-in pattern with action mask.
    patterns: list[PatternRule] = Field(default_factory=list)
    paths: list[PathRule] = Field(default_factory=list)

    @field_validator("patterns", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        if isinstance(value, list):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value


class RedactionConfig(RedactionRules):
    """The processor config's ``redaction`` section."""

    # The HMAC key of ``hash`` (use ``${env:...}``); without one, a random key per process, so
    # hashes compare equal within one run only.
    hash_key: str | None = Field(default=None, min_length=16)
    # Also redact the span attributes forwarded downstream (the processor then acts as a
    # redaction processor); otherwise the spans go out as received, with only the annotations.
    redact_forwarded: bool = False
