"""Redaction of what the processor emits: the rules compiled once, applied to a decided
trajectory after its checks ran on the real values.

Two passes per trajectory. First the path rules: the values at the configured argument and
result paths are replaced, and remembered as literals. Then every emitted string (arguments,
results, errors, verdict messages, expected, got, problems) has those literals and the pattern
rules' matches replaced, so a card number hashed at ``card.number`` is hashed the same way in a
verdict message that quotes it. Cost: linear in the size of the emitted values (RE2 scans).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import re2

from otel_plumb.model import Decided, Step, Trajectory, Verdict
from otel_plumb.redact.config import Action, PathRule, PatternRule, RedactionRules, Truncate
from otel_plumb.redact.patterns import BUILTIN_PATTERNS, compile_regex

# Values found by path shorter than this are replaced where they stand, not searched for in
# other text (a path value "42" must not blank every 42 in a message).
MIN_LITERAL = 4
# At most this many values found by path are searched for per trajectory (the rest are still
# replaced at their paths).
MAX_LITERALS = 256
# Deeper values are replaced whole: nothing emitted is left unscanned.
MAX_DEPTH = 64
TOO_DEEP = "[redacted: nested too deep]"
_DROP = object()


def _rank(action: Action) -> tuple[int, int]:
    """Strictness, to pick between two rules for the same value: drop > hash > mask > truncate
    (a shorter cut is stricter)."""
    if isinstance(action, Truncate):
        return (0, -action.truncate)
    return ({"mask": 1, "hash": 2, "drop": 3}[action], 0)


_Rule = TypeVar("_Rule", PatternRule, PathRule)


def _merged(old: _Rule | None, new: _Rule) -> _Rule:
    """Two rules for the same value: the first, with the stricter of the two actions."""
    if old is None:
        return new
    return old if _rank(old.action) >= _rank(new.action) else old.model_copy(update={"action": new.action})


def _canonical(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def hmac_token(key: bytes, text: str) -> str:
    digest = hmac.new(key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
    return f"[hmac:{digest[:16]}]"


class Redactor:
    """The merged rules of one set of sections (the global one and those of the policies that
    applied), compiled once."""

    def __init__(self, sections: Iterable[RedactionRules], key: bytes) -> None:
        self._key = key
        patterns: dict[str, PatternRule] = {}
        paths: dict[tuple[str, tuple[str, ...], tuple[str, ...]], PathRule] = {}
        for section in sections:
            for p in section.patterns:
                patterns[p.name] = _merged(patterns.get(p.name), p)
            for r in section.paths:
                k = (r.path, tuple(sorted(r.tools)), tuple(sorted(r.within)))
                paths[k] = _merged(paths.get(k), r)
        self._patterns = list(patterns.values())
        self._paths = [
            (frozenset(r.tools), tuple(r.path.split(".")), frozenset(r.within), r.action, r.path)
            for r in paths.values()
        ]
        self._valid: list[Callable[[str], bool] | None] = []
        alternatives = []
        for i, p in enumerate(self._patterns):
            builtin = BUILTIN_PATTERNS.get(p.name) if p.regex is None else None
            alternatives.append(f"(?P<r{i}>{p.regex if builtin is None else builtin.regex})")
            self._valid.append(builtin.valid if builtin is not None else None)
        self._combined = compile_regex("|".join(alternatives)) if alternatives else None

    @property
    def active(self) -> bool:
        return bool(self._patterns or self._paths)

    def replacement(self, action: Action, text: str, label: str) -> str | None:
        """What stands in for ``text`` (None: dropped)."""
        if action == "drop":
            return None
        if action == "mask":
            return f"[redacted:{label}]"
        if action == "hash":
            return hmac_token(self._key, text)
        assert isinstance(action, Truncate)
        cut = action.truncate
        return text if len(text) <= cut else f"{text[:cut]}… [{len(text) - cut} characters redacted]"

    def scrub(self, trajectory: Trajectory | None = None) -> Scrub:
        """The replacements for one trajectory (its path values found first); without a
        trajectory, the patterns alone (for spans forwarded before their trajectory is known)."""
        return Scrub(self, trajectory)

    def decided(self, decided: Decided, scrub: Scrub | None = None) -> Decided:
        """``decided`` as it may leave the processor; ``decided`` itself is not changed.
        ``scrub``: this redactor's scrub of the trajectory, when the caller has made it already."""
        if not self.active:
            return decided
        s = scrub or self.scrub(decided.trajectory)
        t = decided.trajectory
        steps = [s.step(i, step) for i, step in enumerate(t.steps)]
        trajectory = replace(t, steps=steps, problems=[s.text(p) for p in t.problems], attributes=s.value(t.attributes))
        return replace(decided, trajectory=trajectory, verdicts=[s.verdict(v) for v in decided.verdicts])


@dataclass(slots=True)
class _Found:
    args: Any
    result: Any


class Scrub:
    """The replacements for one trajectory: path values found in its steps, then patterns."""

    __slots__ = ("_exact", "_found", "_literal_regex", "_literals", "_r")

    def __init__(self, redactor: Redactor, trajectory: Trajectory | None) -> None:
        self._r = redactor
        self._found: dict[int, _Found] = {}
        self._literals: dict[str, str] = {}
        self._exact: dict[Any, Any] = {}
        for i, step in enumerate(trajectory.steps if trajectory is not None else ()):
            args, result = step.args, step.result
            for tools, segments, within, action, label in redactor._paths:
                if tools and step.name not in tools:
                    continue
                if "args" in within and step.args_status == "captured":
                    args = self._at_path(args, segments, action, label)
                if "result" in within and step.result_status == "captured":
                    result = self._at_path(result, segments, action, label)
            if args is not step.args or result is not step.result:
                self._found[i] = _Found(args, result)
        literals = sorted(self._literals, key=len, reverse=True)[:MAX_LITERALS]
        self._literal_regex = compile_regex("|".join(re2.escape(x) for x in literals)) if literals else None

    def _at_path(self, value: Any, segments: tuple[str, ...], action: Action, label: str) -> Any:
        """``value`` with what is at ``segments`` replaced (copied on the way down, never in place)."""
        if not segments:
            self._remember(value, action, label)
            out = self._r.replacement(action, _canonical(value), label)
            return _DROP if out is None else out
        head, rest = segments[0], segments[1:]
        if head == "**":
            # Zero levels here, or one more level and still "**".
            value = self._at_path(value, rest, action, label)
            return self._children(value, lambda child: self._at_path(child, segments, action, label), None)
        return self._children(value, lambda child: self._at_path(child, rest, action, label), head)

    @staticmethod
    def _children(value: Any, apply: Callable[[Any], Any], key: str | None) -> Any:
        """``apply`` to the children of ``value`` named ``key`` (None or ``*``: all of them)."""
        if value is _DROP:
            return value
        if isinstance(value, dict):
            out, changed = {}, False
            for k, child in value.items():
                new = apply(child) if key in (None, "*", str(k)) else child
                changed |= new is not child
                if new is not _DROP:
                    out[k] = new
            return out if changed else value
        if isinstance(value, list):
            items = [apply(child) if key in (None, "*", str(i)) else child for i, child in enumerate(value)]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return [None if item is _DROP else item for item in items]
        return value

    def _remember(self, value: Any, action: Action, label: str, depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            return
        if isinstance(value, dict):
            for child in value.values():
                self._remember(child, action, label, depth + 1)
            return
        if isinstance(value, list):
            for child in value:
                self._remember(child, action, label, depth + 1)
            return
        if value is None or isinstance(value, bool):
            return
        text = _canonical(value)
        out = self._r.replacement(action, text, label)
        if not isinstance(value, str):
            self._exact[value] = out
        if len(text) >= MIN_LITERAL:
            self._literals[text] = "" if out is None else out

    def text(self, text: str) -> str:
        if self._literal_regex is not None and self._literals:
            literals = self._literals
            text = str(self._literal_regex.sub(lambda m: literals[m.group(0)], text))
        combined = self._r._combined
        if combined is None:
            return text
        return str(combined.sub(self._pattern_match, text))

    def _pattern_match(self, m: Any) -> str:
        r = self._r
        for i, rule in enumerate(r._patterns):
            found = m.group(f"r{i}")
            if found is None:
                continue
            valid = r._valid[i]
            if valid is not None and not valid(found):
                return str(found)
            out = r.replacement(rule.action, found, rule.name)
            return "" if out is None else out
        return str(m.group(0))

    def value(self, value: Any, depth: int = 0) -> Any:
        """Every string in ``value`` scrubbed (dict keys kept); values found by path replaced."""
        if isinstance(value, str):
            return self.text(value)
        if depth > MAX_DEPTH:
            return TOO_DEEP
        if isinstance(value, dict):
            return {k: self.value(v, depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v, depth + 1) for v in value]
        if value is not None and not isinstance(value, bool) and self._exact:
            try:
                if value in self._exact:
                    return self._exact[value]
            except TypeError:  # unhashable
                pass
        return value

    def step(self, index: int, step: Step) -> Step:
        found = self._found.get(index)
        args, result = (found.args, found.result) if found is not None else (step.args, step.result)
        if args is _DROP:
            args = None
        if result is _DROP:
            result = None
        return replace(
            step,
            args=self.value(args),
            result=self.value(result),
            error=None if step.error is None else self.text(step.error),
        )

    def verdict(self, v: Verdict) -> Verdict:
        return replace(v, message=self.text(v.message), expected=self.value(v.expected), got=self.value(v.got))


class Redaction:
    """The global rules and each policy's, with one compiled ``Redactor`` per set of policies
    that applied to a trajectory."""

    def __init__(
        self, global_rules: RedactionRules | None, by_policy: Mapping[str, RedactionRules | None], key: bytes
    ) -> None:
        self._global = global_rules
        self._by_policy = {name: rules for name, rules in by_policy.items() if rules is not None}
        self._key = key
        self._cache: dict[tuple[str, ...], Redactor] = {}

    @property
    def configured(self) -> bool:
        has_global = self._global is not None and bool(self._global.patterns or self._global.paths)
        return has_global or any(r.patterns or r.paths for r in self._by_policy.values())

    def redactor(self, policies: Sequence[str]) -> Redactor:
        names = tuple(sorted(p for p in set(policies) if p in self._by_policy))
        found = self._cache.get(names)
        if found is None:
            sections = ([self._global] if self._global is not None else []) + [self._by_policy[n] for n in names]
            found = self._cache[names] = Redactor(sections, self._key)
        return found

    def decided(self, decided: Decided) -> Decided:
        return self.redactor(decided.policies).decided(decided)

    def digest(self, text: str) -> str:
        """``text`` as a keyed hash: for keys that must compare equal without showing the value."""
        return hmac_token(self._key, text)
