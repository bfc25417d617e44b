"""``otel-plumb suggest``: trace files -> candidate invariants -> a policy to review, and a report.

Reading is replay's (``otel_plumb.replay.iter_trajectories``, streaming); mining is
``otel_plumb.suggest``. The written policy is loaded back as ``check-policy`` would load it.
"""

from __future__ import annotations

import os

import click

from otel_plumb.check import PolicyError, load_policy
from otel_plumb.cli.main import RunError
from otel_plumb.cli.replay import check_inputs, check_something_read, write_json
from otel_plumb.replay import ReplayStats, iter_trajectories
from otel_plumb.suggest import GroupBy, Miner, Options
from otel_plumb.suggest.render import policy_yaml, report, summary_lines
from otel_plumb.terminal import safe


def _group_by(value: str) -> tuple[GroupBy, str | None]:
    if value == "none":
        return "none", None
    if value == "agent":
        return "agent", None
    if value.startswith("attribute:") and value.removeprefix("attribute:"):
        return "attribute", value.removeprefix("attribute:")
    raise click.BadParameter("one of none, agent, attribute:NAME (a task attribute such as attribute:intent)")


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--policy-out", metavar="P.yaml", help="Write the candidates as a commented policy to review.")
@click.option(
    "--min-support",
    type=click.FloatRange(0, 1),
    default=0.95,
    show_default=True,
    help="Propose what held in at least this share of the trajectories it applied to.",
)
@click.option(
    "--min-applied",
    type=click.IntRange(1),
    default=5,
    show_default=True,
    help="... and applied to at least this many trajectories.",
)
@click.option(
    "--min-bound",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="... and whose Wilson 95%% lower bound is at least this.",
)
@click.option(
    "--group-by",
    "group_by",
    default="none",
    show_default=True,
    metavar="none|agent|attribute:NAME",
    help="Mine each agent, or each value of a task attribute, on its own (guarded invariants).",
)
@click.option("--policy-name", default="suggested", show_default=True, help="The written policy's name.")
@click.option("--json", "json_out", metavar="OUT", help="Write the candidate report as JSON to OUT ('-' for stdout).")
def suggest(
    files: tuple[str, ...],
    policy_out: str | None,
    min_support: float,
    min_applied: int,
    min_bound: float,
    group_by: str,
    policy_name: str,
    json_out: str | None,
) -> None:
    """Mine candidate invariants from trace files (assumed mostly good) into a policy to review, with each one's
    support, Wilson bound and the traces it would flag."""
    kind, attribute = _group_by(group_by)
    options = Options(min_support=min_support, min_applied=min_applied, min_bound=min_bound, group_by=kind,
                      attribute=attribute)  # fmt: skip
    paths = check_inputs(files)
    stats = ReplayStats()
    miner = Miner(options)
    for trajectory in iter_trajectories(paths, stats):
        miner.add(trajectory)
    check_something_read(stats)
    result = miner.finish()
    if json_out:
        write_json(json_out, report(result))
    if json_out != "-":
        for line in summary_lines(result):
            click.echo(safe(line))
    if not any(g.kept for g in result.groups):
        raise RunError(f"no invariant held in {min_support:g} of at least {min_applied} trajectories; "
                       "nothing written (try a lower --min-support or --min-applied)")  # fmt: skip
    if policy_out:
        sources = ", ".join(os.path.basename(f) for f in files)
        try:
            with open(policy_out, "w", encoding="utf-8") as f:
                f.write(policy_yaml(result, policy_name, sources))
        except OSError as exc:
            raise RunError(f"{policy_out}: cannot write the policy: {exc.strerror or exc}") from exc
        try:
            policy = load_policy(policy_out)
        except PolicyError as exc:
            raise RunError(f"the suggested policy does not load: {exc}") from exc
        if json_out != "-":
            click.echo(f"policy: {policy_out} ({len(policy.invariants)} invariants to review)")
