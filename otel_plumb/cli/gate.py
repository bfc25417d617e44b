"""``otel-plumb gate REPORT.json``: fail CI (exit 1) when a report falls short.

Reads replay reports (``report_version``) and campaign reports (``campaign_report_version``).
With neither ``--min-bound`` nor ``--max-violations``, any violation fails the gate. A report
in which nothing was checked (no trajectory or trial checked against a policy) fails too,
unless ``--allow-empty`` is given: a gate that passes on nothing is no gate.
"""

from __future__ import annotations

import json
from typing import Any

import click

from otel_plumb.cli.main import RunError
from otel_plumb.model import SEVERITIES, Severity
from otel_plumb.report.json_report import REPORT_VERSION, conformance, violations


@click.command()
@click.argument("report_path", metavar="REPORT.json", type=click.Path(path_type=str))
@click.option("--min-bound", type=click.FloatRange(0, 1), help="Fail when the Wilson 95% lower bound of "
              "conformance is below B.")  # fmt: skip
@click.option("--max-violations", type=click.IntRange(min=0), help="Fail when there are more than N violations.")
@click.option("--severity", type=click.Choice(SEVERITIES), help="Count only invariants of severity S and above "
              "[default: all].")  # fmt: skip
@click.option("--allow-empty", is_flag=True, help="Pass a report in which nothing was checked (no trajectory or "
              "trial checked against a policy) instead of failing it.")  # fmt: skip
def gate(
    report_path: str, min_bound: float | None, max_violations: int | None, severity: Severity | None, allow_empty: bool
) -> None:
    """Exit 1 when the report falls short of the bounds given or nothing in it was checked, 2 when
    it cannot be read."""
    report = _read(report_path)
    if "campaign_report_version" in report:
        from otel_plumb.campaign.gate import campaign_gate_failures, campaign_nothing_checked

        failures = campaign_gate_failures(report, min_bound, max_violations, severity)
        empty = campaign_nothing_checked(report)
    elif "report_version" in report:
        failures = trajectory_gate_failures(report, report_path, min_bound, max_violations, severity)
        empty = trajectory_nothing_checked(report)
    else:
        raise RunError(
            f"{report_path}: not an otel-plumb report (no report_version or campaign_report_version); "
            "decision reports are gated by 'otel-plumb decision'"
        )
    if empty is not None:
        if allow_empty:
            click.echo(f"note: {empty}; passed over with --allow-empty", err=True)
        else:
            failures.insert(0, f"{empty} (pass --allow-empty to accept that)")
    for failure in failures:
        click.echo(f"gate failed: {failure}", err=True)
    if failures:
        raise SystemExit(1)
    click.echo("gate passed")


def trajectory_gate_failures(
    report: dict[str, Any], path: str, min_bound: float | None, max_violations: int | None, severity: Severity | None
) -> list[str]:
    if report["report_version"] != REPORT_VERSION:
        raise RunError(
            f"{path}: report_version {report['report_version']!r} is not supported (expected {REPORT_VERSION!r})"
        )
    records = report.get("trajectories")
    if not isinstance(records, list) or not all(_is_record(r) for r in records):
        raise RunError(f"{path}: trajectories[] is missing or malformed")
    records = [r for r in records if _checked(r)]
    floor: Severity = severity or "low"
    scope = f"severity {floor} and above" if severity else "all invariants"
    conf = conformance(records, floor)
    found = violations(records, floor)
    shown_rate = "n/a" if conf["rate"] is None else f"{conf['rate']:.1%}"
    click.echo(
        f"conformance ({scope}): {conf['successes']}/{conf['n']} = {shown_rate}, Wilson 95% "
        f"[{conf['lo']:.3f}, {conf['hi']:.3f}], {conf['indeterminate']} indeterminate; violations: {found}"
    )
    failures = []
    if min_bound is not None and conf["lo"] < min_bound:
        failures.append(f"lower bound {conf['lo']:.4f} < {min_bound} ({conf['successes']} of {conf['n']} decided "
                        f"trajectories conformant, {scope})")  # fmt: skip
    limit = 0 if max_violations is None and min_bound is None else max_violations
    if limit is not None and found > limit:
        failures.append(f"{found} violations > {limit} ({scope})")
    return failures


def trajectory_nothing_checked(report: dict[str, Any]) -> str | None:
    """Why nothing in a (validated) replay report was checked, or None when something was."""
    records = report["trajectories"]
    if not report.get("policies") and not any(r.get("policies") for r in records):
        return "the report names no policy: nothing was checked"
    if not records:
        return "the report has no trajectories: nothing was checked"
    if not any(_checked(r) for r in records):
        return f"none of the {len(records)} trajectories was checked against a policy"
    return None


def _checked(record: dict[str, Any]) -> bool:
    """Was a policy applied to this trajectory? (``unchecked``: none was.)"""
    return bool(record.get("policies")) and record.get("status") != "unchecked"


def _is_record(r: Any) -> bool:
    return (
        isinstance(r, dict)
        and isinstance(r.get("verdicts", []), list)
        and all(isinstance(v, dict) and "verdict" in v for v in r.get("verdicts", []))
    )


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise RunError(f"{path}: cannot read report: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise RunError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RunError(f"{path}: a report is a JSON object")
    return data
