"""``otel-plumb gate`` for campaign reports: the certificate against a bound, violations, and
whether any trial was checked at all."""

from __future__ import annotations

from typing import Any

from otel_plumb.model import SEVERITIES, severity_at_least


def campaign_gate_failures(report: dict[str, Any], min_bound: float | None, max_violations: int | None,
                           severity: str | None) -> list[str]:
    """Why the campaign report falls short (empty when it passes).

    ``min_bound`` (default: the report's ``gates.min_certified_bound``) is compared with each
    arm's certified bound; an arm without a certificate (no trial produced a trajectory)
    fails. ``max_violations`` (default: the report's ``gates.max_violations``) caps, per arm,
    the trials that broke an invariant of at least ``severity`` (any severity when None).
    When a gate is set, trials without a trajectory fail it too: missing data is never a pass.
    """
    if severity is not None and severity not in SEVERITIES:
        raise ValueError(f"unknown severity {severity!r}; expected one of {', '.join(SEVERITIES)}")
    gates = report.get("gates") or {}
    floor = min_bound if min_bound is not None else gates.get("min_certified_bound")
    cap = max_violations if max_violations is not None else gates.get("max_violations")
    failures: list[str] = []
    arms = report.get("arms") or {}
    if not arms and (floor is not None or cap is not None):
        failures.append("the report has no arms: nothing was measured")
    for arm, data in arms.items():
        cert = data.get("certificate") or {}
        if floor is None:
            continue
        bound = cert.get("bound")
        if bound is None:
            failures.append(f"arm {arm}: no certified bound (no trial produced a trajectory)")
        elif bound < floor:
            failures.append(f"arm {arm}: certified bound {bound:.4f} below {floor} (set by {cert.get('perturbation')})")
    trials = report.get("trials") or []
    if cap is not None:
        per_arm: dict[str, int] = {}
        for t in trials:
            if any(severity is None or severity_at_least(v["severity"], severity)
                   for v in t.get("violations") or ()):
                per_arm[t["arm"]] = per_arm.get(t["arm"], 0) + 1
        for arm, count in per_arm.items():
            if count > cap:
                what = f"at {severity} severity or above" if severity else "of any severity"
                failures.append(f"arm {arm}: {count} trials with violations {what}, more than {cap}")
    errors = sum(1 for t in trials if t.get("status") == "error")
    if errors and (floor is not None or cap is not None):
        failures.append(f"{errors} trial(s) produced no trajectory")
    return failures


# A trial's status when its trajectory was checked against a policy (else "unchecked", or
# "error" when the trial produced no trajectory).
CHECKED = frozenset({"conformant", "violating", "indeterminate"})


def campaign_nothing_checked(report: dict[str, Any]) -> str | None:
    """Why no trial of the campaign report was checked (no trials, none with a checked
    trajectory), or None when one was."""
    trials = report.get("trials") or []
    if not trials:
        return "the report has no trials: nothing was checked"
    if not any(t.get("status") in CHECKED for t in trials):
        return f"none of the {len(trials)} trials has a trajectory checked against a policy"
    return None
