"""Campaign reports: JSON (``campaign_report_version: "1"``), JUnit XML, self-contained HTML,
and the side-by-side view of two trajectories of the same case and variant."""

from __future__ import annotations

import html
import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from otel_plumb.campaign.analysis import analyse
from otel_plumb.campaign.config import Paraphrase, guard_record
from otel_plumb.campaign.store import RunInfo, Store
from otel_plumb.check.align import align

REPORT_VERSION = "1"


def build_report(store: Store, run: RunInfo) -> dict[str, Any]:
    trials = list(store.trials(run.run_id))
    gates = run.config.get("gates") or {}
    target = gates.get("min_certified_bound")
    analysed = analyse(trials, store.discards(run.run_id), run.arms, run.seed, target)
    return {
        "campaign_report_version": REPORT_VERSION,
        "campaign": run.campaign,
        "run_id": run.run_id,
        "run_status": run.status,
        "gates": {"min_certified_bound": target, "max_violations": gates.get("max_violations")},
        "paraphrase_guard": paraphrase_guard(run.config),
        "arms": analysed["arms"],
        "parity": analysed["parity"],
        "trials": [
            {"trial_id": t.trial_id, "arm": t.arm, "case_id": t.case_id, "variant_id": t.variant_id,
             "perturbation": t.perturbation, "trace_id": t.trace_id,
             "status": t.traj_status if t.status == "ok" else "error", "error": t.error,
             "violations": (t.summary or {}).get("violations", [])}
            for t in trials
        ],
    }


def paraphrase_guard(config: dict[str, Any]) -> dict[str, Any] | None:
    """The guard the run's paraphrases went through (None without a paraphrase perturbation)."""
    raw = (config.get("perturbations") or {}).get("paraphrase")
    if raw is None:
        return None
    try:
        return guard_record(Paraphrase.model_validate(raw))
    except ValidationError:  # a run stored from a campaign file of another release
        return None


def guard_line(record: dict[str, Any] | None) -> str | None:
    """One line for the terminal and the HTML: which guard ran, with which threshold, and why."""
    if record is None:
        return None
    why = "as configured" if record["configured"] else (
        "the default for paraphrases from a file: reviewed, used as written"
        if record["source"] == "file" else "the default for generated paraphrases")
    if record["provider"] == "embedding":
        what = f"embedding (all-MiniLM-L6-v2), similarity at least {record['min_similarity']}"
    elif record["provider"] == "judge":
        what = f"judge (model {record['model']} asked whether the meaning is the same)"
    else:
        what = "none"
    return f"paraphrase guard: {what} ({why})"


# What the numbers of a cell mean, one line each, under the terminal summary and the HTML tables.
MEASURES = {
    "critical conformance": "complete trials where no critical invariant failed or was indeterminate",
    "structural": "trials whose tool path (succeeded calls) equals the case's modal baseline path exactly",
    "parity success": "trials ending in the modal baseline's end state (critical conformance if no state)",
    "[lo, hi]": "Wilson 95% interval; pass^k: chance that k trials of a case all conform (mean over cases)",
}


def write_json(report: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")


def _pct(r: dict[str, Any] | None) -> str:
    if not r or r.get("rate") is None:
        return "n/a"
    return f"{100 * r['rate']:.1f}% [{100 * r['lo']:.1f}, {100 * r['hi']:.1f}] n={r['n']}"


def write_junit(report: dict[str, Any], path: str | Path) -> None:
    """One test case per arm and perturbation (fails on any critical violation or trial error),
    and one per arm for the certificate against the gate's bound."""
    suites = ET.Element("testsuites", name=f"campaign {report['campaign']}")
    bound_gate = (report.get("gates") or {}).get("min_certified_bound")
    for arm, data in report["arms"].items():
        cases: list[ET.Element] = []
        for name, p in data["perturbations"].items():
            case = ET.Element("testcase", classname=f"{report['campaign']}.{arm}", name=name)
            crit = p["critical_conformance"]
            problems = []
            if crit["n"] and crit["successes"] < crit["n"]:
                problems.append(f"{crit['n'] - crit['successes']} of {crit['n']} trials broke a critical invariant")
            if p["errors"]:
                problems.append(f"{p['errors']} trials had no trajectory")
            if problems:
                f = ET.SubElement(case, "failure", message="; ".join(problems))
                f.text = "\n".join(f"{d['kind']} {d['tool']} at step {d['step_index']}: expected {d['expected']!r}, "
                                   f"got {d['got']!r} ({d['count']}x)" for d in p["divergences"][:10])
            ET.SubElement(case, "system-out").text = f"conformance {_pct(p['conformance'])}; critical {_pct(crit)}"
            cases.append(case)
        cert = data["certificate"]
        case = ET.Element("testcase", classname=f"{report['campaign']}.{arm}", name="certificate")
        if bound_gate is not None and (cert["bound"] is None or cert["bound"] < bound_gate):
            ET.SubElement(case, "failure", message=f"certified bound {cert['bound']} below {bound_gate} "
                          f"(set by {cert['perturbation']})")
        cases.append(case)
        suite = ET.SubElement(suites, "testsuite", name=arm, tests=str(len(cases)),
                              failures=str(sum(1 for c in cases if c.find("failure") is not None)))
        suite.extend(cases)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2330;max-width:1150px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #dde}
table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #dde;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f5fa}.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}.bad{color:#b3261e;font-weight:600}
.ok{color:#1b7f3b}.muted{color:#667}.diff{background:#fff1ef}.err{color:#b3261e}code{font-size:12px}
.cert{font-size:16px;padding:8px 12px;background:#f3f5fa;display:inline-block;border-radius:6px}
"""

_COLOURS = ["#3461c1", "#d9822b", "#2e8b57", "#8e44ad", "#c0392b", "#16a085"]


def _chart(report: dict[str, Any]) -> str:
    """Per-perturbation critical conformance with Wilson intervals, one colour per arm."""
    arms = list(report["arms"])
    perts: list[str] = []
    for data in report["arms"].values():
        perts += [p for p in data["perturbations"] if p not in perts]
    row_h, left, width = 18 * max(1, len(arms)) + 14, 130, 560
    height = 40 + row_h * len(perts)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 40}" height="{height + 30}" '
           f'role="img" aria-label="critical conformance by perturbation">']
    for tick in range(0, 11, 2):
        x = left + width * tick / 10
        out.append(f'<line x1="{x}" y1="20" x2="{x}" y2="{height}" stroke="#e3e6ef"/>'
                   f'<text x="{x}" y="{height + 16}" font-size="11" text-anchor="middle">{tick * 10}%</text>')
    for i, name in enumerate(perts):
        y0 = 28 + i * row_h
        out.append(f'<text x="{left - 8}" y="{y0 + row_h / 2}" font-size="12" text-anchor="end">{html.escape(name)}'
                   f"</text>")
        for j, arm in enumerate(arms):
            p = report["arms"][arm]["perturbations"].get(name)
            if not p or p["critical_conformance"]["rate"] is None:
                continue
            r = p["critical_conformance"]
            y = y0 + 9 + j * 18
            colour = _COLOURS[j % len(_COLOURS)]
            x_lo, x_hi, x_pt = (left + width * r[k] for k in ("lo", "hi", "rate"))
            out.append(
                f'<g><title>{html.escape(arm)} / {html.escape(name)}: {_pct(r)}</title>'
                f'<line x1="{x_lo:.1f}" y1="{y}" x2="{x_hi:.1f}" y2="{y}" stroke="{colour}" stroke-width="3"/>'
                f'<line x1="{x_lo:.1f}" y1="{y - 5}" x2="{x_lo:.1f}" y2="{y + 5}" stroke="{colour}" stroke-width="2"/>'
                f'<line x1="{x_hi:.1f}" y1="{y - 5}" x2="{x_hi:.1f}" y2="{y + 5}" stroke="{colour}" stroke-width="2"/>'
                f'<circle cx="{x_pt:.1f}" cy="{y}" r="4.5" fill="{colour}"/></g>')
    for j, arm in enumerate(arms):
        out.append(f'<rect x="{left + j * 120}" y="2" width="10" height="10" fill="{_COLOURS[j % len(_COLOURS)]}"/>'
                   f'<text x="{left + j * 120 + 14}" y="11" font-size="12">{html.escape(arm)}</text>')
    out.append("</svg>")
    return "".join(out)


def _cell(r: dict[str, Any] | None) -> str:
    if not r or r.get("rate") is None:
        return '<td class="num muted">n/a</td>'
    cls = "num" + (" bad" if r["rate"] < 1 else "")
    return (f'<td class="{cls}" title="{r["successes"]}/{r["n"]}">{100 * r["rate"]:.1f}%<br>'
            f'<small class="muted">[{100 * r["lo"]:.1f}, {100 * r["hi"]:.1f}] n={r["n"]}</small></td>')


# (heading, left title, left record, right title, right record)
View = tuple[str, str, dict[str, Any], str, dict[str, Any]]


def render_html(report: dict[str, Any], views: list[View] | None = None) -> str:
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Campaign {e(report['campaign'])}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>Campaign <code>{e(report['campaign'])}</code></h1>",
             f"<p class='muted'>run {e(report['run_id'])} · {e(str(report.get('run_status')))} · "
             f"{len(report['trials'])} trials</p>"]
    guard = guard_line(report.get("paraphrase_guard"))
    if guard:
        parts.append(f"<p>{e(guard)}</p>")
    for arm, data in report["arms"].items():
        c = data["certificate"]
        bound = "n/a" if c["bound"] is None else f"{100 * c['bound']:.1f}%"
        parts.append(f"<div class='cert'><b>{e(arm)}</b>: certified critical conformance ≥ <b>{bound}</b> "
                     f"(set by {e(str(c['perturbation']))}; a {100 * c['target']:.0f}% bound needs "
                     f"{c['runs_needed']} clean runs per perturbation)</div> ")
    parts.append("<h2>Critical conformance by perturbation (Wilson 95%)</h2>" + _chart(report))
    for arm, data in report["arms"].items():
        parts.append(f"<h2>Arm {e(arm)}</h2><table><tr><th>perturbation</th><th>trials</th><th>errors</th>"
                     "<th>discarded</th><th>conformance</th><th>critical</th><th>structural</th><th>argument</th>"
                     "<th>outcome</th><th>pass^k</th></tr>")
        for name, p in data["perturbations"].items():
            passk = " ".join(f"k={k}: {100 * v:.0f}%" for k, v in list(p["pass_k"].items())[:5])
            errs = f'<td class="num{" bad" if p["errors"] else ""}">{p["errors"]}</td>'
            parts.append(f"<tr><td>{e(name)}</td><td class='num'>{p['trials']}</td>{errs}"
                         f"<td class='num'>{p['discarded']['count']}</td>{_cell(p['conformance'])}"
                         f"{_cell(p['critical_conformance'])}{_cell(p['consistency']['structural'])}"
                         f"{_cell(p['consistency']['argument'])}{_cell(p['outcome_agreement'])}"
                         f"<td class='muted'>{e(passk)}</td></tr>")
        parts.append("</table>")
        worst = sorted(((name, d) for name, p in data["perturbations"].items() for d in p["divergences"]),
                       key=lambda x: -x[1]["count"])[:10]
        if worst:
            parts.append("<h3>Worst divergences from the modal baseline path</h3><table><tr><th>perturbation</th>"
                         "<th>kind</th><th>step</th><th>tool</th><th>expected</th><th>got</th><th>count</th></tr>")
            for name, d in worst:
                parts.append(f"<tr><td>{e(name)}</td><td>{e(d['kind'])}</td><td class='num'>{d['step_index']}</td>"
                             f"<td>{e(str(d['tool']))}</td><td><code>{e(json.dumps(d['expected'], default=str))}"
                             f"</code></td><td><code>{e(json.dumps(d['got'], default=str))}</code></td>"
                             f"<td class='num'>{d['count']}</td></tr>")
            parts.append("</table>")
    for pair in report["parity"]:
        a, b = pair["arms"]
        parts.append(f"<h2>Parity {e(a)} vs {e(b)}</h2><table><tr><th>perturbation</th><th>pairs</th>"
                     f"<th>success {e(a)}</th><th>success {e(b)}</th><th>outcome agreement</th><th>path agreement</th>"
                     "<th>argument agreement</th><th>difference</th><th>p (permutation)</th></tr>")
        for name, p in pair["by_perturbation"].items():
            diff = "n/a" if p["difference"] is None else f"{100 * p['difference']:+.1f} pts"
            pv = "n/a" if p["p_value"] is None else (
                f"{p['p_value']:.4f}" if p["p_value"] >= 1e-4 else f"{p['p_value']:.1e}")
            sig = " bad" if p["p_value"] is not None and p["p_value"] < 0.05 else ""
            parts.append(f"<tr><td>{e(name)}</td><td class='num'>{p['pairs']}</td>{_cell(p['success'][a])}"
                         f"{_cell(p['success'][b])}{_cell(p['outcome'])}{_cell(p['path'])}{_cell(p['argument'])}"
                         f"<td class='num'>{diff}</td><td class='num{sig}'>{pv}</td></tr>")
        parts.append("</table>")
    parts.append("<h2>What the numbers mean</h2><ul>" + "".join(
        f"<li><b>{e(name)}</b>: {e(text)}</li>" for name, text in MEASURES.items()) + "</ul>")
    errors = [t for t in report["trials"] if t["status"] == "error"]
    if errors:
        parts.append(f"<h2>Trials without a trajectory ({len(errors)})</h2><table><tr><th>trial</th><th>arm</th>"
                     "<th>variant</th><th>error</th></tr>")
        for t in errors[:50]:
            parts.append(f"<tr><td><code>{e(t['trial_id'])}</code></td><td>{e(t['arm'])}</td>"
                         f"<td>{e(t['variant_id'])}</td><td class='err'>{e(str(t['error']))}</td></tr>")
        parts.append("</table>")
    for heading, lt, left, rt, right in views or ():
        parts.append(f"<h2>{e(heading)}</h2>" + _aligned_table(lt, left, rt, right))
    parts.append("</body></html>")
    return "".join(parts)


def write_html(report: dict[str, Any], path: str | Path, views: list[View] | None = None) -> None:
    Path(path).write_text(render_html(report, views), encoding="utf-8")


def divergence_views(store: Store, report: dict[str, Any]) -> list[View]:
    """For each arm, its most frequent divergence: the example trial aligned with the modal
    baseline trajectory of the same case."""
    from otel_plumb.campaign.analysis import baselines

    run_id = report["run_id"]
    trials = {t["trial_id"]: t for t in report["trials"]}
    views: list[View] = []
    for arm, data in report["arms"].items():
        found = [(name, d) for name, p in data["perturbations"].items() for d in p["divergences"]]
        if not found:
            continue
        name, top = max(found, key=lambda x: x[1]["count"])
        example = trials.get(top["example_trial"])
        if example is None:
            continue
        case_rows = [t for t in store.trials(run_id) if t.case_id == example["case_id"]]
        base = baselines(case_rows).get((arm, example["case_id"]))
        left = store.trajectory(run_id, base.trial_id) if base is not None and base.trial_id else None
        right = store.trajectory(run_id, example["trial_id"])
        if left is None or right is None:
            continue
        heading = (f"Arm {arm}, {name}: {top['kind']} {top['tool']} ({top['count']}x), case {example['case_id']}")
        views.append((heading, f"{arm} modal baseline", left, f"{arm} {example['variant_id']}", right))
    return views


# ---- two trajectories side by side -----------------------------------------------------

def _tool_steps(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in record.get("steps", []) if s.get("kind") == "tool"]


def _label(step: dict[str, Any] | None) -> str:
    if step is None:
        return ""
    args = step.get("args")
    shown = ""
    if isinstance(args, dict) and args:
        shown = " " + ", ".join(f"{k}={v}" for k, v in list(args.items())[:3])
    error = str(step.get("error") or "")
    failure = f" ({error[:60]}{'…' if len(error) > 60 else ''})" if error else ""
    # The failure mark goes by the name, so it stays on the first line when the label wraps.
    return f"[{step['index']}] {step['name']}{' ✗' if error else ''}{shown}{failure}"


def failed_invariants(record: dict[str, Any]) -> list[str]:
    """The invariants a trajectory failed, each with its severity and where and how it failed."""
    return [f"{v['invariant']} ({v['severity']}): {v.get('message') or 'failed'}"
            for v in record.get("verdicts") or [] if v.get("verdict") == "fail"]


def side_by_side(left: dict[str, Any], right: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None,
                                                                          dict[str, Any] | None]]:
    """Aligned rows (mark, left step, right step); mark is "" for the same step, else the kind."""
    a, b = _tool_steps(left), _tool_steps(right)

    def score(x: dict[str, Any], y: dict[str, Any]) -> int:
        # The same tool scores +2, or +1 when it failed on one side only; another tool -1.
        if x["name"] != y["name"]:
            return -1
        return 2 if bool(x.get("error")) == bool(y.get("error")) else 1

    rows: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
    for op in align(a, b, score_pair=score):
        x = a[op.expected] if op.expected is not None else None
        y = b[op.got] if op.got is not None else None
        mark: str = op.kind
        if op.kind == "match":
            assert x is not None and y is not None
            if bool(x.get("error")) != bool(y.get("error")):
                mark = "failed" if y.get("error") else "succeeded"
            else:
                mark = "" if json.dumps(x.get("args"), sort_keys=True, default=str) == json.dumps(
                    y.get("args"), sort_keys=True, default=str) else "argument"
        rows.append((mark, x, y))
    return rows


# ``campaign show`` fits a terminal this wide: long steps wrap inside their column.
SHOW_WIDTH = 100


def render_text(title_left: str, title_right: str, left: dict[str, Any], right: dict[str, Any],
                width: int = SHOW_WIDTH) -> str:
    """The two trajectories in two columns (differing rows marked ``≠`` and named on the right),
    each side's status, then the invariants each side failed."""
    rows = side_by_side(left, right)
    tail = max((len(f"  <- {mark}") for mark, _, _ in rows if mark), default=0)
    col = (width - 4 - tail) // 2

    def cell(text: str) -> list[str]:
        return textwrap.wrap(text, col, subsequent_indent="    ", break_on_hyphens=False) or [""]

    def row(a: str, b: str, flag: str = "  ", mark: str = "") -> list[str]:
        lines_a, lines_b = cell(a), cell(b)
        out = []
        for i in range(max(len(lines_a), len(lines_b))):
            x = lines_a[i] if i < len(lines_a) else ""
            y = lines_b[i] if i < len(lines_b) else ""
            first = i == 0
            if first and mark:
                y = f"{y:<{col}}  <- {mark}"
            out.append(f"{x:<{col}}  {flag if first else '  '}{y}".rstrip())
        return out

    out = [*row(title_left, title_right), f"{'-' * col}    {'-' * col}"]
    for mark, x, y in rows:
        out += row(_label(x), _label(y), "≠ " if mark else "  ", mark)
    out += row(str(left.get("status", "")), str(right.get("status", "")))
    for title, record in ((title_left, left), (title_right, right)):
        failed = failed_invariants(record)
        count = f"failed {len(failed)} invariant{'s' if len(failed) != 1 else ''}"
        out.append(f"{title}: {count if failed else 'no invariant failed'}")
        for line in failed:
            out += textwrap.wrap(line, width, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(out)


def _aligned_table(title_left: str, left: dict[str, Any], title_right: str, right: dict[str, Any]) -> str:
    e = html.escape
    body = "".join(
        f"<tr class='{'diff' if mark else ''}'><td>{e(_label(x))}</td><td class='muted'>{e(mark)}</td>"
        f"<td>{e(_label(y))}</td></tr>" for mark, x, y in side_by_side(left, right))
    failed = "".join(
        f"<p><b>{e(title)}</b>: {'failed' if lines else 'no invariant failed'}</p>"
        + ("<ul>" + "".join(f"<li>{e(line)}</li>" for line in lines) + "</ul>" if lines else "")
        for title, lines in ((title_left, failed_invariants(left)), (title_right, failed_invariants(right))))
    return (f"<table><tr><th>{e(title_left)}</th><th></th><th>{e(title_right)}</th></tr>{body}"
            f"<tr><th>{e(str(left.get('status')))}</th><th></th><th>{e(str(right.get('status')))}</th></tr></table>"
            f"{failed}")


def render_show_html(title_left: str, title_right: str, left: dict[str, Any], right: dict[str, Any]) -> str:
    e = html.escape
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title_left)} vs {e(title_right)}</title>"
            f"<style>{_CSS}</style></head><body><h1>Two trajectories, aligned</h1>"
            f"{_aligned_table(title_left, left, title_right, right)}</body></html>")
