"""A self-contained HTML report (inline CSS, no external assets) rendered from the report dict.

Jinja2 with autoescape: every value from a trace (tool names, arguments, messages) is escaped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jinja2

from otel_plumb.model import SEVERITIES

# A report can hold thousands of trajectories: show every violation up to this many, and
# point to the JSON for the rest.
MAX_VIOLATING_SHOWN = 200
MAX_INDETERMINATE_SHOWN = 50
VALUE_CHARS = 160

def template_env(folder: str) -> jinja2.Environment:
    """Templates beside the code in ``folder``, every value escaped (values come from traces),
    a missing name an error rather than an empty string."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder), autoescape=True, trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )  # fmt: skip


_ENV = template_env(os.path.dirname(os.path.abspath(__file__)))


def short(value: Any, limit: int = VALUE_CHARS) -> str:
    """A value as compact JSON, cut to ``limit`` characters."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


_ENV.filters["short"] = short
_ENV.filters["pct"] = pct


def render(report: Mapping[str, Any], title: str = "otel-plumb report") -> str:
    records = list(report.get("trajectories", ()))
    violating = [_view(r) for r in records if r.get("status") == "violating"]
    indeterminate = [_view(r) for r in records if r.get("status") == "indeterminate" and r.get("policies")]
    invariants = sorted(
        report.get("by_invariant", {}).items(),
        key=lambda kv: (SEVERITIES.index(kv[1].get("severity", "low")), -kv[1].get("fail", 0), kv[0]),
    )
    return _ENV.get_template("report.html").render(
        title=title,
        report=report,
        summary=report.get("summary", {}),
        conformance=report.get("conformance", {}),
        invariants=invariants,
        violating=violating[:MAX_VIOLATING_SHOWN],
        violating_total=len(violating),
        indeterminate=indeterminate[:MAX_INDETERMINATE_SHOWN],
        indeterminate_total=len(indeterminate),
        coverage=report.get("coverage", {}),
        errors=report.get("errors", []),
        severities=SEVERITIES,
    )


def _view(record: Mapping[str, Any]) -> dict[str, Any]:
    """A trajectory prepared for display: which steps are offending, and by which invariants."""
    marks: dict[int, list[dict[str, Any]]] = {}
    whole: list[dict[str, Any]] = []
    for v in record.get("verdicts", ()):
        if v["verdict"] not in ("fail", "indeterminate"):
            continue
        if v.get("step_index") is None:
            whole.append(v)
        else:
            marks.setdefault(v["step_index"], []).append(v)
    fails = [v for v in record.get("verdicts", ()) if v["verdict"] == "fail"]
    fails.sort(key=lambda v: SEVERITIES.index(v.get("severity", "low")))
    undecided = [v for v in record.get("verdicts", ()) if v["verdict"] == "indeterminate"]
    return {"record": record, "marks": marks, "whole": whole, "fails": fails, "undecided": undecided}

