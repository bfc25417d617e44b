"""The report (SPEC section 5): trajectories with verdicts, conformance with Wilson bounds,
counts per invariant, coverage and errors. The HTML and JUnit reports and the gate all read
this dict, so they agree by construction.

Conformance counts trajectories, not verdicts. A trajectory is conformant, violating or
indeterminate (SPEC section 4). ``n`` counts the decided ones (conformant + violating):
an indeterminate trajectory is neither a success nor a trial, because nothing is known
about it; it is reported beside the rate (``indeterminate``) so a report full of them
cannot pass for a good one, and a small ``n`` widens the interval on its own. Trajectories
no policy applied to are ``unchecked`` and left out. ``critical`` is the same computed
from the critical invariants' verdicts only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from otel_plumb.check import CompiledPolicy, redaction_for
from otel_plumb.model import SEVERITIES, Decided, Severity, severity_at_least
from otel_plumb.report.records import decided_record
from otel_plumb.stats import rate

REPORT_VERSION = "1"
VERDICTS = ("pass", "fail", "not_applicable", "indeterminate")


def report_body(policies: Sequence[CompiledPolicy], decided: Iterable[Decided]) -> dict[str, Any]:
    """Everything but coverage and errors (which come from reading the input), from trajectories
    decided against ``policies`` (``check.decide``): nothing is checked again here. What the
    policies' ``redaction`` sections cover is redacted."""
    redaction = redaction_for(policies)
    records = [decided_record(d if redaction is None else redaction.decided(d)) for d in decided]
    return {
        "policies": [policy_record(p) for p in policies],
        "trajectories": records,
        "summary": summary(records),
        "conformance": {"overall": conformance(records, "low"), "critical": conformance(records, "critical")},
        "by_invariant": by_invariant(policies, records),
    }


def build_report(
    body: Mapping[str, Any], coverage: Mapping[str, Any] | None = None, errors: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    return {"report_version": REPORT_VERSION, **body, "coverage": dict(coverage or {}), "errors": list(errors)}


def policy_record(p: CompiledPolicy) -> dict[str, Any]:
    return {
        "name": p.name,
        "path": p.path,
        "invariants": [
            {"id": i.id, "severity": i.severity, "kind": i.kind, "description": i.description} for i in p.invariants
        ],
    }


def status_at(record: Mapping[str, Any], floor: Severity) -> str | None:
    """A trajectory record's status counting only verdicts of severity ``floor`` and above;
    None when no policy was applied to it."""
    if not record.get("policies"):
        return None
    values = {v["verdict"] for v in record.get("verdicts", ()) if _at_least(v.get("severity"), floor)}
    if "fail" in values:
        return "violating"
    if "indeterminate" in values or not record.get("complete", True):
        return "indeterminate"
    return "conformant"


def conformance(records: Iterable[Mapping[str, Any]], floor: Severity = "low") -> dict[str, Any]:
    """{successes, n, rate, lo, hi} (Wilson 95%) plus the indeterminate count; see the module doc."""
    counts = {"conformant": 0, "violating": 0, "indeterminate": 0}
    for r in records:
        status = status_at(r, floor)
        if status is not None:
            counts[status] += 1
    out: dict[str, Any] = rate(counts["conformant"], counts["conformant"] + counts["violating"]).as_dict()
    out["indeterminate"] = counts["indeterminate"]
    return out


def violations(records: Iterable[Mapping[str, Any]], floor: Severity = "low") -> int:
    return sum(
        1
        for r in records
        for v in r.get("verdicts", ())
        if v["verdict"] == "fail" and _at_least(v.get("severity"), floor)
    )


def summary(records: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    out = {"trajectories": len(records), "conformant": 0, "violating": 0, "indeterminate": 0, "unchecked": 0}
    for r in records:
        out[status_at(r, "low") or "unchecked"] += 1
    out["violations"] = violations(records)
    return out


def by_invariant(policies: Sequence[CompiledPolicy], records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Verdict counts per invariant, keyed by id (``policy/id`` when two policies share an id)."""
    ids = [i.id for p in policies for i in p.invariants]
    out: dict[str, dict[str, Any]] = {}
    keys: dict[tuple[str, str], str] = {}
    for p in policies:
        for i in p.invariants:
            key = i.id if ids.count(i.id) == 1 else f"{p.name}/{i.id}"
            keys[(p.name, i.id)] = key
            out[key] = {"policy": p.name, "severity": i.severity, **dict.fromkeys(VERDICTS, 0)}
    for r in records:
        for v in r.get("verdicts", ()):
            found = keys.get((v["policy"], v["invariant"]))
            if found is not None:
                out[found][v["verdict"]] += 1
    return out


def _at_least(severity: Any, floor: Severity) -> bool:
    return severity in SEVERITIES and severity_at_least(severity, floor)
