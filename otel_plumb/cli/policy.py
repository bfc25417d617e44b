"""``otel-plumb check-policy P...``: validate policy files without running anything; and the policy
loading, report writing and verdict summary the checking commands share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from otel_plumb.check import CompiledPolicy, PolicyError, load_policies, load_policy
from otel_plumb.cli.main import RunError
from otel_plumb.report import html, junit
from otel_plumb.terminal import safe


@click.command("check-policy")
@click.argument("policies", nargs=-1, required=True, type=click.Path(path_type=str))
def check_policy(policies: tuple[str, ...]) -> None:
    """Validate policies: prints "ok" per file, or each problem as file:line: message (exit 2)."""
    bad = 0
    names: dict[str, str] = {}
    for path in policies:
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            bad += 1
            for problem in exc.problems:
                click.echo(str(problem), err=True)
            continue
        if policy.name in names:
            bad += 1
            click.echo(f"{path}: policy name {policy.name!r} is also used by {names[policy.name]}", err=True)
            continue
        names[policy.name] = path
        click.echo(f"{path}: ok ({describe(policy)})")
    if bad:
        raise RunError(f"{bad} of {len(policies)} polic{'y is' if len(policies) == 1 else 'ies are'} not valid")


def describe(policy: CompiledPolicy) -> str:
    by_severity: dict[str, int] = {}
    for inv in policy.invariants:
        by_severity[inv.severity] = by_severity.get(inv.severity, 0) + 1
    counts = ", ".join(f"{n} {s}" for s, n in by_severity.items())
    return f"policy {policy.name}: {len(policy.invariants)} invariants ({counts})"


# ---- shared by the commands that check trajectories (replay) --------------------------------


def load_policies_or_fail(paths: Sequence[str]) -> list[CompiledPolicy]:
    """Load and compile every policy before anything runs; any problem is a RunError (exit 2)."""
    try:
        return load_policies(paths)
    except PolicyError as exc:
        raise RunError("invalid policy:\n  " + "\n  ".join(str(p) for p in exc.problems)) from None


def write_reports(report: Mapping[str, Any], html_out: str | None, junit_out: str | None) -> None:
    for path, render in ((html_out, html.render), (junit_out, junit.render)):
        if not path:
            continue
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(render(report))
        except OSError as exc:
            raise RunError(f"{path}: cannot write report: {exc.strerror or exc}") from None


def print_verdicts(report: Mapping[str, Any], shown: int = 10) -> None:
    """Conformance with Wilson bounds and the first violations, for the terminal."""
    if not report.get("policies"):
        return
    s = report["summary"]
    click.echo(
        f"checked: {s['conformant']} conformant, {s['violating']} violating, {s['indeterminate']} indeterminate"
        + (f", {s['unchecked']} with no applicable policy" if s["unchecked"] else "")
    )
    for label, key in (("conformance", "overall"), ("critical conformance", "critical")):
        r = report["conformance"][key]
        rate = "n/a" if r["rate"] is None else f"{r['rate']:.1%}"
        click.echo(f"{label}: {r['successes']}/{r['n']} = {rate}, Wilson 95% [{r['lo']:.3f}, {r['hi']:.3f}]")
    fails = [(t, v) for t in report["trajectories"] for v in t["verdicts"] if v["verdict"] == "fail"]
    for t, v in fails[:shown]:
        where = "trajectory" if v["step_index"] is None else f"step {v['step_index']}"
        key = "" if t.get("key") in (None, t["trace_id"]) else f"{safe(t['key'])} "
        click.echo(
            f"  FAIL {v['severity']:<8} {v['invariant']}  {key}{t['trace_id'][:16]} {where}: {safe(v['message'])}"
        )
    if len(fails) > shown:
        click.echo(f"  ... {len(fails) - shown} more violations (see --json / --html)")
