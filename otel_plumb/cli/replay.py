"""``otel-plumb replay`` and ``otel-plumb coverage``: trace files offline.

``replay`` reads the files (otel_plumb.replay), decides every trajectory against the
policies (without policies every trajectory is unchecked), builds the report body from the
decisions, adds coverage, errors and inputs, writes the JSON and prints a short summary.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from otel_plumb.check import CompiledPolicy, decide
from otel_plumb.cli.main import RunError
from otel_plumb.cli.policy import load_policies_or_fail, print_verdicts, write_reports
from otel_plumb.consistency import path_agreement
from otel_plumb.model import Step, Trajectory
from otel_plumb.replay import GroupBy, ReplayResult, ReplayStats, iter_trajectories
from otel_plumb.replay import replay as run_replay
from otel_plumb.report import json_report
from otel_plumb.report.coverage import CoverageCounter, coverage_report
from otel_plumb.terminal import safe

REPORT_VERSION = json_report.REPORT_VERSION
# Terminal summary limits: the JSON report has everything.
SHOWN_TRAJECTORIES = 20
SHOWN_ERRORS = 10
PATH_WIDTH = 110


def build_report(result: ReplayResult, policies: Sequence[CompiledPolicy] = ()) -> dict[str, Any]:
    """The report of a replay: every trajectory decided against ``policies``, coverage (which
    counts the trajectories without the policies' task keys), errors and inputs."""
    decided = [decide(policies, t) for t in result.trajectories]
    tasks = [p.task_attribute for p in policies if p.task_attribute]
    tools = {t for p in policies for t in p.tool_names}
    report = json_report.build_report(
        json_report.report_body(policies, decided),
        coverage_report(result.trajectories, result.stats, tasks, tools),
        [e.record() for e in result.errors],
    )
    report["errors_total"] = result.stats.errors_total
    report["inputs"] = inputs_record(result.stats)
    # How consistently the agents take one tool path, per policy and agent (the live
    # plumb_path_agreement over the whole input).
    report["path_agreement"] = path_agreement(decided)
    return report


def inputs_record(stats: ReplayStats) -> list[dict[str, Any]]:
    return [{"file": f.path, "spans": f.spans, "errors": f.errors} for f in stats.files]


# ``-`` reads standard input, through the device file so every reader (format detection by
# content, decompression) works on it as on a file.
STDIN = "-"
STDIN_PATH = "/dev/stdin"


def check_inputs(files: Sequence[str]) -> list[str]:
    """Refuse, before reading anything, files that are missing or unreadable; the paths to read."""
    if files.count(STDIN) > 1:
        raise RunError("'-' (standard input) can be read once only")
    if STDIN in files and sys.stdin is not None and sys.stdin.isatty():
        raise RunError("'-' reads trace data from standard input, which is a terminal: pipe or redirect a file into it")
    paths = [STDIN_PATH if path == STDIN else path for path in files]
    for path in paths:
        if not os.path.exists(path):
            raise RunError(f"{path}: no such file")
        if os.path.isdir(path):
            raise RunError(f"{path}: is a directory, not a trace file")
        if not os.access(path, os.R_OK):
            raise RunError(f"{path}: not readable (permission denied)")
    return paths


def check_something_read(stats: ReplayStats) -> None:
    """No span read at all is a run that could not be done (exit 2), never an empty pass."""
    if stats.spans:
        return
    if stats.errors_total:
        first = "; ".join(str(e) for e in stats.errors[:3])
        raise RunError(f"no spans could be read from the input ({stats.errors_total} errors): {first}")
    raise RunError("no spans in the input: " + ", ".join(f.path for f in stats.files))


def write_json(path: str, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=2, default=_json_default, ensure_ascii=False)
    if path == "-":
        click.echo(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    except OSError as exc:
        raise RunError(f"{path}: cannot write report: {exc.strerror or exc}") from exc


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


_files = click.argument("files", nargs=-1, required=True, type=click.Path(path_type=str))
_json = click.option("--json", "json_out", metavar="OUT", help="Write the report as JSON to OUT ('-' for stdout).")
_group_by = click.option(
    "--group-by",
    type=click.Choice(["trace", "session"]),
    default="trace",
    show_default=True,
    help="One trajectory per trace, or per conversation/session.",
)


@click.command()
@_files
@click.option("--policy", "policy_paths", multiple=True, metavar="P", help="Check the trajectories against policy P "
              "(repeatable). Exit 1 when an invariant fails.")  # fmt: skip
@_json
@click.option("--html", "html_out", metavar="OUT", help="Write a self-contained HTML report to OUT.")
@click.option("--junit", "junit_out", metavar="OUT", help="Write JUnit XML (a test case per trajectory and invariant).")
@click.option("--store", "store_path", metavar="DB", help="Add the decided trajectories to the trajectory store DB "
              "(created if missing) for otel-plumb console.")  # fmt: skip
@_group_by
def replay(
    files: tuple[str, ...],
    policy_paths: tuple[str, ...],
    json_out: str | None,
    html_out: str | None,
    junit_out: str | None,
    store_path: str | None,
    group_by: GroupBy,
) -> None:
    """Read trace files (OTLP JSON/protobuf, Jaeger JSON, .gz/.zst; '-' for standard input) into trajectories,
    check them, report them."""
    policies = load_policies_or_fail(policy_paths)  # a bad policy stops the run before anything is read
    result = run_replay(check_inputs(files), group_by=group_by)
    check_something_read(result.stats)
    report = build_report(result, policies)
    if json_out:
        write_json(json_out, report)
    write_reports(report, html_out, junit_out)
    if store_path:
        run_id = store_replay(store_path, report)
    if json_out != "-":
        if store_path:
            click.echo(f"stored {len(report['trajectories'])} trajectories in {store_path} as replay {run_id}")
        print_summary(result, report)
        print_verdicts(report)
        print_agreement(report["path_agreement"])
    if report["summary"]["violating"]:
        raise SystemExit(1)


def print_agreement(rows: Sequence[dict[str, Any]], shown: int = 10) -> None:
    for r in rows[:shown]:
        click.echo(
            f"path agreement: {safe(r['policy'])} / {safe(r['group'] or '-')}: {r['successes']}/{r['n']} on the modal "
            f"path ({r['rate']:.0%}, Wilson 95% [{r['lo']:.3f}, {r['hi']:.3f}]; {r['paths']} distinct paths)"
        )


def store_replay(path: str, report: dict[str, Any]) -> str:
    """The report's trajectories (already redacted as its policies say) into a trajectory store,
    under a run id of their own."""
    from otel_plumb.store import TrajectoryStore

    run_id = time.strftime("replay-%Y%m%dT%H%M%S")
    try:
        store = TrajectoryStore(path)
        try:
            store.add(report["trajectories"], "replay", run_id=run_id)
        finally:
            store.close()
    except (OSError, sqlite3.Error) as exc:
        raise RunError(f"{path}: cannot store the trajectories: {exc}") from None
    return run_id


@click.command()
@_files
@_json
@_group_by
def coverage(files: tuple[str, ...], json_out: str | None, group_by: GroupBy) -> None:
    """What the trace files ('-' for standard input) can support: conventions, tool calls with/without arguments
    and results, notes."""
    paths = check_inputs(files)
    stats = ReplayStats()
    counter = CoverageCounter()
    for trajectory in iter_trajectories(paths, stats, group_by=group_by):
        counter.add(trajectory)
    check_something_read(stats)
    cov = counter.report(stats)
    if json_out:
        write_json(
            json_out,
            {
                "report_version": REPORT_VERSION,
                "coverage": cov,
                "errors": [e.record() for e in stats.errors],
                "errors_total": stats.errors_total,
                "inputs": inputs_record(stats),
            },
        )
    if json_out != "-":
        _print_read(stats, cov)
        _print_coverage(cov)


def print_summary(result: ReplayResult, report: dict[str, Any]) -> None:
    cov = report["coverage"]
    _print_read(result.stats, cov)
    _print_coverage(cov)
    trajectories = result.trajectories
    if trajectories:
        shown = trajectories[:SHOWN_TRAJECTORIES]
        more = f" (first {len(shown)} of {len(trajectories)})" if len(shown) < len(trajectories) else ""
        click.echo(f"trajectories{more}:")
        for t in shown:
            click.echo("  " + trajectory_line(t))


def _print_read(stats: ReplayStats, cov: dict[str, Any]) -> None:
    tools = cov["tool_calls"]
    click.echo(
        f"read {len(stats.files)} file{'s' if len(stats.files) != 1 else ''}: {stats.spans} spans, "
        f"{cov['trajectories']} trajectories ({cov['incomplete']['trajectories']} incomplete), "
        f"{tools['total']} tool calls ({tools['arguments']['captured']} with arguments, {tools['errored']} failed), "
        f"{stats.errors_total} errors"
    )
    for error in stats.errors[:SHOWN_ERRORS]:
        click.echo(f"  error: {safe(error)}")
    if stats.errors_total > SHOWN_ERRORS:
        click.echo(f"  ... {stats.errors_total - SHOWN_ERRORS} more errors (see --json)")


def _print_coverage(cov: dict[str, Any]) -> None:
    conventions = ", ".join(f"{name} {n}" for name, n in cov["conventions"].items()) or "none"
    click.echo(f"conventions: {safe(conventions)}")
    notes = cov["notes"]
    if notes:
        click.echo("coverage notes:")
        for note in notes:
            click.echo(f"  - {safe(note)}")


def trajectory_line(t: Trajectory) -> str:
    """One compact line: task key and trace, agent, state, and the tool path (failed calls marked)."""
    who = t.agent or t.service or "-"
    state = "complete" if t.complete else f"incomplete: {t.incomplete_reason}"
    path = " > ".join(_tool_label(s) for s in t.tool_steps) or "(no tool calls)"
    if len(path) > PATH_WIDTH:
        path = path[: PATH_WIDTH - 3] + "..."
    key = "" if t.key == t.trace_id else f"{t.key} "
    return safe(f"{key}{t.trace_id[:16]}  {who}  {len(t.steps)} steps, {state}  {path}")


def _tool_label(step: Step) -> str:
    return f"{step.name}!" if step.error is not None else step.name
