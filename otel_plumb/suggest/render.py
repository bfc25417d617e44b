"""A suggestion as a commented policy a person reviews, and as a report (JSON-ready, and lines)."""

from __future__ import annotations

import json
import re
from typing import Any

from otel_plumb.suggest import Candidate, Group, Suggestion

SEVERITY = "medium"
SUGGEST_VERSION = "1"
# Counter-examples named in a policy comment; the report has all that were kept.
_SHOWN = 3
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
# Plain scalars YAML would read as something other than text.
_YAML_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "null", "y", "n"})


def invariant(c: Candidate, group: Group) -> dict[str, Any]:
    out: dict[str, Any] = {"id": c.id, "severity": SEVERITY}
    guards = [g for g in (group.guard, c.when) if g is not None]
    if guards:
        out["when"] = guards[0] if len(guards) == 1 else " && ".join(f"({g})" for g in guards)
    out.update(c.check)
    return out


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _YAML_WORDS:
        return text
    if text.isprintable():
        return "'" + text.replace("'", "''") + "'"
    return json.dumps(text)


def flow(value: Any) -> str:
    """``value`` as a YAML flow collection."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_scalar(k)}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    return _scalar(value)


def _comment(text: str) -> str:
    """Trace content in a comment: one line, printable."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def support(c: Candidate) -> str:
    return f"{c.held}/{c.applied} ({c.rate:.3f}, Wilson 95% lower bound {c.lower_bound:.3f})"


def flagged(c: Candidate, shown: int = _SHOWN) -> str:
    if not c.failed:
        return ""
    ids = ", ".join(c.examples[:shown])
    more = f", ... ({c.failed} in all)" if c.failed > min(shown, len(c.examples)) else ""
    return f"; would flag {ids}{more}"


def policy_yaml(s: Suggestion, name: str, sources: str) -> str:
    """The policy: every kept candidate with its support as a comment, then the implied ones."""
    o = s.options
    lines = [
        f"# Suggested by otel-plumb suggest from {s.trajectories} trajectories ({_comment(sources)}).",
        f"# Each invariant held in at least {o.min_support:g} of the trajectories it applied to "
        f"(at least {o.min_applied} of them).",
        "# Review every one before use: delete what is a habit rather than a rule, set severities,",
        "# add descriptions. Comments: support held/applied (rate, Wilson lower bound), and the",
        "# trace ids the invariant would flag in these traces.",
    ]
    if s.incomplete:
        lines.append(f"# {s.incomplete} incomplete trajectories were left out.")
    if s.not_agent:
        lines.append(f"# {s.not_agent} traces with no agent span were left out.")
    lines += [f"policy: {_scalar(name)}", "invariants:"]
    for group in s.groups:
        if group.value is not None:
            lines.append(f"  # group {_comment(group.label)}: {group.trajectories} trajectories")
        for c in group.kept:
            lines.append(f"  # {_comment(c.text)}: {support(c)}{_comment(flagged(c))}")
            lines.append(f"  - {flow(invariant(c, group))}")
    implied = [c for g in s.groups for c in g.implied]
    if implied:
        lines.append("# Implied by the invariants above, so not written:")
        for c in implied:
            lines.append(f"#   {_comment(c.text)} ({c.held}/{c.applied}): by {', '.join(c.implied_by)}")
    return "\n".join(lines) + "\n"


def record(c: Candidate, group: Group) -> dict[str, Any]:
    return {
        "id": c.id,
        "kind": next(k for k in c.check if k != "scope"),
        "invariant": invariant(c, group),
        "text": c.text,
        "applied": c.applied,
        "held": c.held,
        "failed": c.failed,
        "rate": c.rate,
        "lower_bound": c.lower_bound,
        "counter_examples": list(c.examples),
        "implied_by": list(c.implied_by),
    }


def report(s: Suggestion) -> dict[str, Any]:
    o = s.options
    return {
        "suggest_version": SUGGEST_VERSION,
        "min_support": o.min_support,
        "min_applied": o.min_applied,
        "min_bound": o.min_bound,
        "trajectories": s.trajectories,
        "incomplete": s.incomplete,
        "ungrouped": s.ungrouped,
        "not_agent": s.not_agent,
        "groups": [
            {
                "group": g.value,
                "when": g.guard,
                "trajectories": g.trajectories,
                "ignored_tools": g.ignored_tools,
                "candidates": [record(c, g) for c in g.kept],
                "implied": [record(c, g) for c in g.implied],
            }
            for g in s.groups
        ],
    }


def summary_lines(s: Suggestion) -> list[str]:
    """What a terminal shows: per group, every proposed invariant and what it would flag."""
    out = [f"mined {s.trajectories} trajectories ({s.incomplete} incomplete left out"
           + (f", {s.not_agent} with no agent span" if s.not_agent else "")
           + (f", {s.ungrouped} without a group" if s.ungrouped else "") + ")"]  # fmt: skip
    for g in s.groups:
        out.append(f"group {g.label}: {g.trajectories} trajectories, {len(g.kept)} invariants proposed, "
                   f"{len(g.implied)} implied by them")  # fmt: skip
        if g.ignored_tools:
            out.append(f"  tools past the limit, not mined: {', '.join(g.ignored_tools)}")
        for c in g.kept:
            out.append(f"  {c.rate:6.3f} (lo {c.lower_bound:.3f}) {c.held:>6}/{c.applied:<6} {c.id}: {c.text}"
                       f"{flagged(c)}")  # fmt: skip
    return out
