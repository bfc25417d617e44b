"""``otel-plumb check-policy P...``: validate policy files without running anything."""

from __future__ import annotations

import click

from otel_plumb.check import CompiledPolicy, PolicyError, load_policy
from otel_plumb.cli.main import RunError


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
