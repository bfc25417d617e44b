"""``otel-plumb campaign run|report|parity|show|replay|minimise``."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import click

from otel_plumb.cli.main import RunError

STORE_HELP = "SQLite run store (default .otel-plumb/runs.db)"


def _store(path: str | None) -> Any:
    from otel_plumb.campaign.store import DEFAULT_STORE, Store

    return Store(path or DEFAULT_STORE)


def _run_info(store: Any, ref: str) -> Any:
    from otel_plumb.campaign.store import RunNotFound

    try:
        return store.run(ref)
    except RunNotFound as e:
        raise RunError(str(e)) from None


def _load(path: str) -> Any:
    from otel_plumb.campaign.config import CampaignError, load_campaign

    try:
        return load_campaign(path)
    except CampaignError as e:
        raise RunError(str(e)) from None


def _campaign_run(loaded: Any, store: Any, **kwargs: Any) -> Any:
    from otel_plumb.campaign.config import CampaignError
    from otel_plumb.campaign.engine import CampaignRun

    try:
        return CampaignRun(loaded, store, **kwargs)
    except CampaignError as e:
        raise RunError(str(e)) from None


def _progress(quiet: bool) -> Any:
    if quiet:
        return None
    done = {"n": 0}

    def tick(row: Any) -> None:
        done["n"] += 1
        mark = {"conformant": ".", "violating": "x", "indeterminate": "?"}.get(row.traj_status, "E")
        click.echo(mark, nl=done["n"] % 80 == 0, err=True)

    return tick


def _write(report: dict[str, Any], json_out: str | None, html_out: str | None, junit_out: str | None,
           store: Any = None) -> None:
    from otel_plumb.campaign import reports

    if json_out:
        reports.write_json(report, json_out)
    if html_out:
        reports.write_html(report, html_out, reports.divergence_views(store, report) if store is not None else None)
    if junit_out:
        reports.write_junit(report, junit_out)


def _pct(r: dict[str, Any] | None) -> str:
    if not r or r.get("rate") is None:
        return "n/a"
    return f"{100 * r['rate']:5.1f}% [{100 * r['lo']:.1f}, {100 * r['hi']:.1f}]"


def _p(value: float) -> str:
    return f"{value:.4f}" if value >= 1e-4 else f"{value:.1e}"


def _summary(report: dict[str, Any]) -> None:
    """The report in a terminal: lines of at most 100 columns, the measures explained last."""
    from otel_plumb.campaign.reports import MEASURES, guard_line

    click.echo(f"campaign {report['campaign']}  run {report['run_id']}  ({report['run_status']}, "
               f"{len(report['trials'])} trials)")
    guard = guard_line(report.get("paraphrase_guard"))
    if guard:
        click.echo(guard)
    for arm, data in report["arms"].items():
        click.echo(f"\narm {arm}")
        click.echo(f"  {'perturbation':<12} {'trials':>6} {'err':>4} {'disc':>4}  {'critical conformance':<22} "
                   f"{'structural':<22} pass^1")
        for name, p in data["perturbations"].items():
            pass1 = p["pass_k"].get("1")
            click.echo(f"  {name:<12} {p['trials']:>6} {p['errors']:>4} {p['discarded']['count']:>4}  "
                       f"{_pct(p['critical_conformance']):<22} {_pct(p['consistency']['structural']):<22} "
                       f"{'n/a' if pass1 is None else f'{pass1:.3f}'}")
        c = data["certificate"]
        if c["bound"] is None:
            click.echo("  certificate: none (no trial of this arm has a trajectory)")
        else:
            click.echo(f"  certificate: {c['bound']:.4f}, set by {c['perturbation']} (a {c['target']} bound "
                       f"needs {c['runs_needed']} clean runs per perturbation)")
    for pair in report["parity"]:
        _parity_table(pair)
    click.echo("")
    for name, text in MEASURES.items():
        click.echo(f"{name}: {text}")


def _parity_table(pair: dict[str, Any]) -> None:
    a, b = pair["arms"]
    click.echo(f"\nparity {a} vs {b} (parity success per arm, difference, permutation p, path agreement)")
    click.echo(f"  {'perturbation':<12} {('success ' + a)[:22]:<22} {('success ' + b)[:22]:<22} "
               f"{'difference':>11} {'p':>8} {'path':>7}")
    for name, p in pair["by_perturbation"].items():
        diff = "n/a" if p["difference"] is None else f"{100 * p['difference']:+.1f} pts"
        pv = "n/a" if p["p_value"] is None else _p(p["p_value"])
        path = p["path"]
        agree = "n/a" if not path or path.get("rate") is None else f"{100 * path['rate']:.1f}%"
        click.echo(f"  {name:<12} {_pct(p['success'][a]):<22} {_pct(p['success'][b]):<22} {diff:>11} {pv:>8} "
                   f"{agree:>7}")


def _gate_exit(report: dict[str, Any]) -> None:
    from otel_plumb.campaign.gate import campaign_gate_failures

    failures = campaign_gate_failures(report, None, None, None)
    for f in failures:
        click.echo(f"GATE: {f}", err=True)
    if failures:
        sys.exit(1)


# Modules of the ``campaign`` extra (pyproject.toml) the campaign commands import.
_EXTRA_MODULES = ("numpy", "tokenizers", "safetensors", "threadpoolctl", "opentelemetry.processor")


class _CampaignGroup(click.Group):
    """Without the ``campaign`` extra a command stops with what to install, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as e:
            name = e.name or ""
            if not any(name == m or name.startswith(m + ".") for m in _EXTRA_MODULES):
                raise
            raise RunError(f"campaigns need the campaign extra ({name} is not installed): "
                           "pip install 'otel-plumb[campaign]'") from None


@click.group(cls=_CampaignGroup)
def campaign() -> None:
    """Metamorphic campaigns: perturb an agent's inputs, run it, check its trajectories."""


@campaign.command()
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--arm", "arms", multiple=True, help="run only these arms (repeatable)")
@click.option("--store", "store_path", help=STORE_HELP)
@click.option("--json", "json_out", help="write the campaign report JSON here")
@click.option("--html", "html_out", help="write the HTML report here")
@click.option("--junit", "junit_out", help="write JUnit XML here")
@click.option("--resume", help="continue an interrupted run (id, id prefix or 'latest')")
@click.option("--fresh", is_flag=True, help="ask the agents again instead of using cached answers")
@click.option("-q", "--quiet", is_flag=True, help="no progress marks")
def run(campaign_file: str, arms: tuple[str, ...], store_path: str | None, json_out: str | None,
        html_out: str | None, junit_out: str | None, resume: str | None, fresh: bool, quiet: bool) -> None:
    """Run CAMPAIGN_FILE: every case, perturbation and arm; exit 1 when its gates fail."""
    from otel_plumb.campaign.config import CampaignError
    from otel_plumb.campaign.reports import build_report

    loaded = _load(campaign_file)
    store = _store(store_path)
    runner = _campaign_run(loaded, store, arms=arms or None, use_cache=not fresh, progress=_progress(quiet),
                           notice=lambda text: click.echo(f"\n{text}", err=True))
    from otel_plumb.campaign.store import RunNotFound

    def interrupted(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    # A terminated run is marked interrupted (not left "running") and can be resumed.
    previous = signal.signal(signal.SIGTERM, interrupted)
    run_id: str | None = None
    try:
        run_id = runner.start(resume=resume)
        click.echo(f"run {run_id}", err=True)
        outcome = asyncio.run(runner.execute(run_id))
    except (CampaignError, RunNotFound) as e:
        raise RunError(str(e)) from None
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: resume with --resume {run_id}" if run_id else "\ninterrupted", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not quiet:
        click.echo("", err=True)
    report = build_report(store, store.run(outcome.run_id))
    _write(report, json_out, html_out, junit_out, store)
    _summary(report)
    if outcome.stopped_arms:
        # Said again last, where it is seen: the run could not be done for these arms.
        for text in outcome.stopped_arms.values():
            click.echo(f"error: {text}", err=True)
        sys.exit(2)
    _gate_exit(report)


@campaign.command()
@click.argument("run_ref", metavar="RUN")
@click.option("--store", "store_path", help=STORE_HELP)
@click.option("--json", "json_out")
@click.option("--html", "html_out")
@click.option("--junit", "junit_out")
def report(run_ref: str, store_path: str | None, json_out: str | None, html_out: str | None,
           junit_out: str | None) -> None:
    """Rebuild the report of a stored RUN (id, id prefix or 'latest')."""
    from otel_plumb.campaign.reports import build_report

    store = _store(store_path)
    rep = build_report(store, _run_info(store, run_ref))
    _write(rep, json_out, html_out, junit_out, store)
    _summary(rep)


@campaign.command()
@click.argument("run_ref", metavar="RUN")
@click.argument("arm_a")
@click.argument("arm_b")
@click.option("--store", "store_path", help=STORE_HELP)
@click.option("--json", "json_out", help="write the parity result as JSON")
def parity(run_ref: str, arm_a: str, arm_b: str, store_path: str | None, json_out: str | None) -> None:
    """Compare two arms of RUN on the same cases and variants, with a permutation test."""
    from otel_plumb.campaign.analysis import parity as parity_of

    store = _store(store_path)
    info = _run_info(store, run_ref)
    trials = list(store.trials(info.run_id))
    present = {t.arm for t in trials}
    for arm in (arm_a, arm_b):
        if arm not in present:
            raise RunError(f"run {info.run_id} has no trials of arm {arm!r} (arms: {', '.join(sorted(present))})")
    order = ("baseline", "paraphrase", "distractor", "decoy_tools", "tool_fault", "sampling")
    names = sorted({t.perturbation for t in trials}, key=lambda n: order.index(n) if n in order else 99)
    result = parity_of(trials, arm_a, arm_b, info.seed, names)
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2) + "\n")
    _parity_table(result)
    from otel_plumb.campaign.reports import MEASURES

    click.echo("")
    for name in ("parity success", "[lo, hi]"):
        click.echo(f"{name}: {MEASURES[name]}")


def _trial_records(store: Any, run_id: str, case: str, variant: str, arm: str | None) -> list[tuple[Any, Any]]:
    rows = [t for t in store.trials(run_id) if t.case_id == case
            and (t.variant_id == variant or t.variant_id == f"{case}/{variant}") and (arm is None or t.arm == arm)]
    return [(t, store.trajectory(run_id, t.trial_id)) for t in rows]


@campaign.command()
@click.argument("run_ref", metavar="RUN")
@click.option("--case", "case_id", required=True)
@click.option("--variant", required=True, help="variant id, e.g. tool_fault-0 (or CASE/tool_fault-0)")
@click.option("--arm", "arms", multiple=True, help="the two arms to compare (default: the run's first two); with "
              "one arm, its modal baseline trajectory is compared with the variant")
@click.option("--store", "store_path", help=STORE_HELP)
@click.option("--html", "html_out", help="also write the aligned view as HTML")
def show(run_ref: str, case_id: str, variant: str, arms: tuple[str, ...], store_path: str | None,
         html_out: str | None) -> None:
    """Two trajectories of the same case and variant, aligned side by side."""
    from otel_plumb.campaign.analysis import baselines
    from otel_plumb.campaign.reports import render_show_html, render_text

    store = _store(store_path)
    info = _run_info(store, run_ref)
    chosen = list(arms) or info.arms[:2]
    if len(chosen) >= 2:
        sides = []
        for arm in chosen[:2]:
            found = [(t, r) for t, r in _trial_records(store, info.run_id, case_id, variant, arm) if r is not None]
            if not found:
                raise RunError(f"no trajectory for case {case_id}, variant {variant}, arm {arm} in run {info.run_id}")
            sides.append((f"{arm} ({found[0][0].trial_id[:8]})", found[0][1]))
    else:
        arm = chosen[0]
        found = [(t, r) for t, r in _trial_records(store, info.run_id, case_id, variant, arm) if r is not None]
        if not found:
            raise RunError(f"no trajectory for case {case_id}, variant {variant}, arm {arm} in run {info.run_id}")
        base = baselines([t for t in store.trials(info.run_id) if t.case_id == case_id]).get((arm, case_id))
        if base is None or base.trial_id is None:
            raise RunError(f"case {case_id} has no baseline trajectory for arm {arm}")
        sides = [(f"{arm} modal baseline", store.trajectory(info.run_id, base.trial_id)),
                 (f"{arm} {variant}", found[0][1])]
    (lt, left), (rt, right) = sides
    click.echo(render_text(lt, rt, left, right))
    if html_out:
        Path(html_out).write_text(render_show_html(lt, rt, left, right), encoding="utf-8")


def _failing_variants(store: Any, run_id: str, arm: str | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in store.trials(run_id):
        if arm is not None and t.arm != arm:
            continue
        if t.status != "ok" or t.traj_status != "conformant":
            out[t.variant_id] = out.get(t.variant_id, 0) + 1
    return out


@campaign.command()
@click.argument("run_ref", metavar="RUN")
@click.option("--failing", is_flag=True, help="only the variants with a non-conformant or failed trial")
@click.option("--store", "store_path", help=STORE_HELP)
@click.option("--json", "json_out")
@click.option("--html", "html_out")
@click.option("-q", "--quiet", is_flag=True)
def replay(run_ref: str, failing: bool, store_path: str | None, json_out: str | None, html_out: str | None,
           quiet: bool) -> None:
    """Run RUN's stored variants again (as a new run) and say which failures reproduce."""
    from otel_plumb.campaign.reports import build_report

    store = _store(store_path)
    info = _run_info(store, run_ref)
    loaded = _load(info.config_path)
    variants = store.variants(info.run_id)
    before = _failing_variants(store, info.run_id)
    if failing:
        variants = [v for v in variants if v.variant_id in before]
        if not variants:
            click.echo(f"run {info.run_id} has no failing variant")
            return
    runner = _campaign_run(loaded, store, arms=info.arms, use_cache=False, progress=_progress(quiet))
    new_id = runner.start(variants=variants, parent=info.run_id, note="replay --failing" if failing else "replay")
    asyncio.run(runner.execute(new_id))
    after = _failing_variants(store, new_id)
    click.echo(f"\nreplay {new_id} of {info.run_id}: {len(variants)} variants")
    for v in variants:
        was, now = before.get(v.variant_id, 0), after.get(v.variant_id, 0)
        if was or now:
            verdict = "reproduced" if was and now else ("new failure" if now else "did not reproduce")
            click.echo(f"  {v.variant_id:<40} failing trials {was} -> {now}  {verdict}")
    rep = build_report(store, store.run(new_id))
    _write(rep, json_out, html_out, None, store)


@campaign.command()
@click.argument("run_ref", metavar="RUN")
@click.option("--variant", "variant_id", required=True, help="the failing variant (CASE/perturbation-N)")
@click.option("--arm", help="the arm it fails on (default: the first arm with a failing trial)")
@click.option("--trials", type=click.IntRange(1), default=3, show_default=True,
              help="trials per candidate; a candidate fails if any of them does")
@click.option("--store", "store_path", help=STORE_HELP)
def minimise(run_ref: str, variant_id: str, arm: str | None, trials: int, store_path: str | None) -> None:
    """Remove steps from a failing variant while it still fails: the smallest step list."""
    from otel_plumb.campaign.perturb import Variant

    store = _store(store_path)
    info = _run_info(store, run_ref)
    variant = next((v for v in store.variants(info.run_id) if v.variant_id == variant_id
                    or v.variant_id.endswith("/" + variant_id)), None)
    if variant is None:
        raise RunError(f"run {info.run_id} has no variant {variant_id!r}")
    failing_arms = [t.arm for t in store.trials(info.run_id)
                    if t.variant_id == variant.variant_id and (t.status != "ok" or t.traj_status != "conformant")]
    arm = arm or (failing_arms[0] if failing_arms else None)
    if arm is None:
        raise RunError(f"variant {variant.variant_id} did not fail in run {info.run_id}; nothing to minimise")
    loaded = _load(info.config_path)
    runner = _campaign_run(loaded, store, arms=[arm], use_cache=False, trials=trials)
    run_id = runner.start(variants=[], parent=info.run_id, note=f"minimise {variant.variant_id}")
    count = {"n": 0}

    def fails(steps: list[dict[str, Any]]) -> bool:
        count["n"] += 1
        candidate = Variant(f"{variant.variant_id}~{count['n']}", variant.case_id, variant.perturbation, steps)
        store.save_variants(run_id, [candidate], [])
        asyncio.run(runner.execute(run_id))
        return candidate.variant_id in _failing_variants(store, run_id)

    steps = list(variant.steps)
    if not fails(steps):
        click.echo(f"variant {variant.variant_id} no longer fails on arm {arm} in {trials} trials (run {run_id})")
        sys.exit(1)
    # Greedy one-step removal until no single step can go (1-minimal, as in delta debugging).
    shrunk = True
    while shrunk and steps:
        shrunk = False
        for i in range(len(steps)):
            candidate = steps[:i] + steps[i + 1:]
            if fails(candidate):
                steps, shrunk = candidate, True
                break
    store.set_status(run_id, "complete")
    click.echo(f"minimal failing steps for {variant.variant_id} on arm {arm} ({len(variant.steps)} -> {len(steps)}, "
               f"{count['n']} candidates, run {run_id}):")
    click.echo(json.dumps(steps, indent=2))
