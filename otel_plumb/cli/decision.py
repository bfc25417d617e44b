"""``otel-plumb decision``: DecGuard-compatible decision contracts.

Same arguments and exit codes as DecGuard 0.1: 0 pass (or warn), 1 a gate failed (``replay``:
a failure reproduced), 2 the run could not be done (bad contract, dataset, report or usage).
"""

from __future__ import annotations

import asyncio
import json
import os
import traceback
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from otel_plumb.cli.main import RunError

T = TypeVar("T")
PathArg = click.Path(path_type=Path, dir_okay=False)


@contextmanager
def _errors() -> Iterator[None]:
    """Every error exits 2 so it can never be mistaken for a failed gate (1)."""
    from otel_plumb.decision.errors import DecisionError

    try:
        yield
    except DecisionError as exc:
        raise RunError(str(exc)) from exc
    except (click.exceptions.Exit, click.ClickException, click.Abort):
        raise
    except Exception as exc:
        if os.environ.get("OTEL_PLUMB_DEBUG"):
            traceback.print_exc()
        raise RunError(f"internal error: {type(exc).__name__}: {exc} (set OTEL_PLUMB_DEBUG=1 for a traceback)") from exc


def _run(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(factory())


def _finish(status: str, fail_on_warn: bool) -> None:
    if status == "fail" or (fail_on_warn and status == "warn"):
        raise click.exceptions.Exit(1)


def _emit(
    document: Mapping[str, Any],
    fmt: str,
    output: Path | None,
    text: Callable[[Mapping[str, Any]], str],
    what: str = "report",
    decguard_format: bool = False,
) -> None:
    from otel_plumb.decision import report as reports

    if decguard_format:
        document = reports.decguard_format(document)
    if output is not None:
        reports.write_report(document, output)
        click.echo(f"{what} written to {output}", err=True)
    click.echo(reports.dumps(document) if fmt == "json" else text(document))


def _common(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--dataset", "-d", type=PathArg, help="Golden dataset (.jsonl/.json); overrides the contract's."),
        click.option("--backend", "-b", help="Named backend from the contract's 'backends' section."),
        click.option("--output", "-o", type=PathArg, help="Also write the JSON report to this file."),
        click.option("--format", "-f", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True),
        click.option("--max-concurrency", type=click.IntRange(1, 256), help="Parallel backend calls."),
        click.option("--fail-on-warn", is_flag=True, help="Exit 1 when warning gates are violated."),
        click.option("--healthcheck/--no-healthcheck", default=True, help="Check backend health before running."),
        click.option("--seed", type=click.IntRange(0, 2**63 - 1), help="Transformation seed (default: fuzz.seed)."),
        click.option("--property", "-p", "properties", multiple=True, help="Run only this property (repeatable)."),
        click.option("--minimize/--no-minimize", default=None, help="Shrink failing transformations."),
        click.option(
            "--decguard-format", is_flag=True, help="Leave out our additions so DecGuard itself can load the report."
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return click.argument("contract", type=PathArg)(fn)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def decision() -> None:
    """DecGuard-compatible decision contracts: golden gates and metamorphic properties.

    Exit codes: 0 pass (or warn), 1 a gate failed, 2 the run could not be done.
    """


@decision.command()
@click.argument("contract", type=PathArg)
@click.option("--dataset", "-d", type=PathArg)
def validate(contract: Path, dataset: Path | None) -> None:
    """Check a contract, its backend settings and its dataset (offline)."""
    from otel_plumb.decision.backends import create_backend
    from otel_plumb.decision.contract import load_contract
    from otel_plumb.decision.engine import resolve_dataset
    from otel_plumb.decision.paraphrase import create_paraphraser

    with _errors():
        loaded = load_contract(contract)
        c = loaded.contract
        spec = c.spec()
        for name in c.backend_names():
            create_backend(c.backend_config(name), decision=spec, name=name)
        paraphrase = c.properties.paraphrase
        if paraphrase is not None and paraphrase.enabled:
            create_paraphraser(paraphrase.source, base_dir=loaded.path.parent)
        lines = [
            f"OK  {contract}",
            f"    decision  {spec.name} ({spec.type}): {', '.join(spec.labels)}",
            "    backends  " + ", ".join(f"{n}={c.backend_config(n).provider}" for n in c.backend_names()),
        ]
        if dataset is not None or c.dataset is not None:
            data = resolve_dataset(loaded, dataset)
            lines.append(f"    dataset   {data.path}: {len(data.cases)} cases, {data.n_labeled} labeled")
        else:
            lines.append("    dataset   none (pass --dataset to `otel-plumb decision test`)")
        lines += [
            f"    gates     requirements: {len(c.requirements.configured())}, warnings: {len(c.warnings.configured())}",
            "    properties " + (", ".join(c.properties.configured()) or "none (add 'properties' to fuzz)"),
            f"    production segments: {', '.join(c.production.segments) or 'none'}; "
            f"requirements: {len(c.production.requirements.configured())}; "
            f"segment requirements: {len(c.production.segment_requirements.configured())}",
            "    policy     " + (f"{len(c.policy.routes)} routes" if c.policy is not None else "none"),
            f"    hash      {loaded.hash}",
        ]
        click.echo("\n".join(lines))


def _test(
    contract: Path,
    mode: str,
    dataset: Path | None,
    backend: str | None,
    output: Path | None,
    fmt: str,
    max_concurrency: int | None,
    fail_on_warn: bool,
    healthcheck: bool,
    seed: int | None,
    properties: tuple[str, ...],
    minimize: bool | None,
    decguard_format: bool,
) -> None:
    from otel_plumb.decision.contract import load_contract
    from otel_plumb.decision.render import render_report
    from otel_plumb.decision.report import run_and_report

    with _errors():
        loaded = load_contract(contract)
        report = _run(
            lambda: run_and_report(
                loaded,
                dataset=dataset,
                backend=backend,
                concurrency=max_concurrency,
                check_health=healthcheck,
                mode=mode,
                seed=seed,
                properties=properties or None,
                minimize=minimize,
            )
        )
        _emit(report, fmt, output, render_report, decguard_format=decguard_format)
    _finish(report["status"], fail_on_warn)


@decision.command("test")
@_common
@click.option("--all", "all_checks", is_flag=True, help="Also check the contract's metamorphic properties.")
def test_command(contract: Path, all_checks: bool, **options: Any) -> None:
    """Run the golden dataset through a backend and check the contract's gates."""
    _test(contract, "all" if all_checks else "test", **options)


@decision.command()
@_common
def fuzz(contract: Path, **options: Any) -> None:
    """Check the contract's metamorphic properties (deterministic for a seed)."""
    _test(contract, "fuzz", **options)


@decision.command()
@click.argument("results", type=PathArg)
@click.option("--contract", "-c", type=PathArg, help="Re-judge the stored results against this contract (offline).")
@click.option("--output", "-o", type=PathArg)
@click.option("--format", "-f", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--fail-on-warn", is_flag=True)
@click.option("--decguard-format", is_flag=True, help="Leave out our additions so DecGuard itself can load the report.")
def report(
    results: Path, contract: Path | None, output: Path | None, fmt: str, fail_on_warn: bool, decguard_format: bool
) -> None:
    """Show a stored report (verified on load); exits with its gate status."""
    from otel_plumb.decision.contract import load_contract
    from otel_plumb.decision.render import render_report
    from otel_plumb.decision.report import load_report, rejudge

    with _errors():
        stored = load_report(results)
        document = rejudge(stored, load_contract(contract)) if contract is not None else stored.data
        _emit(document, fmt, output, render_report, decguard_format=decguard_format)
    _finish(document["status"], fail_on_warn)


@decision.command()
@click.argument("baseline", type=PathArg)
@click.argument("candidate", type=PathArg)
@click.option("--contract", "-c", type=PathArg, help="Apply this contract's 'regression' gates and evaluation.")
@click.option("--segment-by", "-s", multiple=True, help="Case metadata key to segment by (repeatable).")
@click.option("--output", "-o", type=PathArg)
@click.option("--format", "-f", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--fail-on-warn", is_flag=True)
def diff(
    baseline: Path,
    candidate: Path,
    contract: Path | None,
    segment_by: tuple[str, ...],
    output: Path | None,
    fmt: str,
    fail_on_warn: bool,
) -> None:
    """Compare two reports of the same decision; exits 1 when a regression gate is violated."""
    from otel_plumb.decision.contract import load_contract
    from otel_plumb.decision.diff import diff_reports, render_diff
    from otel_plumb.decision.report import load_report

    with _errors():
        result = diff_reports(
            load_report(baseline),
            load_report(candidate),
            contract=load_contract(contract) if contract else None,
            segment_by=segment_by or None,
            baseline_path=str(baseline),
            candidate_path=str(candidate),
        )
        _emit(result, fmt, output, render_diff, "diff")
    _finish(result["status"], fail_on_warn)


@decision.command()
@click.argument("results", type=PathArg)
@click.option("--id", "ids", multiple=True, help="Transformed case '<property>/<case id>/<sample>' (repeatable).")
@click.option("--contract", "-c", type=PathArg, help="Contract to use (default: the report's).")
@click.option("--backend", "-b")
@click.option("--format", "-f", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def replay(results: Path, ids: tuple[str, ...], contract: Path | None, backend: str | None, fmt: str) -> None:
    """Re-send stored property failures; exits 1 when a failure reproduces."""
    from otel_plumb.decision.replay import render_replay, replay_failures
    from otel_plumb.decision.report import dumps

    with _errors():
        result = _run(lambda: replay_failures(results, ids=ids or None, contract=contract, backend=backend))
        click.echo(dumps(result) if fmt == "json" else render_replay(result))
    _finish(result["status"], False)


@decision.command()
@click.argument("contract", type=PathArg)
@click.option("--dataset", "-d", type=PathArg, required=True, help="Collected production records (.jsonl/.json).")
@click.option("--baseline", type=PathArg, help="Baseline records or a previous `decision check` JSON report.")
@click.option("--output", "-o", type=PathArg)
@click.option("--format", "-f", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--fail-on-warn", is_flag=True)
def check(
    contract: Path, dataset: Path, baseline: Path | None, output: Path | None, fmt: str, fail_on_warn: bool
) -> None:
    """Analyse collected production decisions offline and apply post-deployment gates."""
    from otel_plumb.decision.production import render_production, run_check

    with _errors():
        result = run_check(contract, dataset=dataset, baseline=baseline)
        _emit(result, fmt, output, render_production, "production report")
    _finish(result["status"], fail_on_warn)


@decision.command("run")
@click.argument("contract", type=PathArg)
@click.argument("input_value")
@click.option("--backend", "-b")
@click.option("--input-json", is_flag=True, help="Parse INPUT_VALUE as a JSON object.")
@click.option("--id", "case_id", default="runtime", show_default=True, help="Decision/correlation id.")
@click.option("--format", "-f", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--healthcheck/--no-healthcheck", default=True)
def run_policy(
    contract: Path, input_value: str, backend: str | None, input_json: bool, case_id: str, fmt: str, healthcheck: bool
) -> None:
    """Make one decision and apply the contract's first-match runtime policy."""
    from otel_plumb.decision.errors import DecisionError
    from otel_plumb.decision.policy import decide_with_policy

    with _errors():
        value: str | dict[str, Any] = input_value
        if input_json:
            try:
                parsed = json.loads(input_value)
            except ValueError as exc:
                raise DecisionError(f"--input-json is not valid JSON: {exc}") from exc
            if not isinstance(parsed, dict):
                raise DecisionError("--input-json must decode to a JSON object")
            value = parsed
        result = _run(
            lambda: decide_with_policy(contract, value, backend=backend, case_id=case_id, check_health=healthcheck)
        )
        if fmt == "json":
            click.echo(json.dumps(result, indent=2, ensure_ascii=False))
        else:
            r = result["result"]
            suffix = f" -> {result['fallback_backend']}" if result["fallback_backend"] is not None else ""
            click.echo(
                f"{result['action']}{suffix} · selected {r['selected']} · confidence {r['confidence']:.3f}"
                f" · route {result['route_index']}"
            )
