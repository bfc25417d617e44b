"""Terminal rendering of reports (same layout as DecGuard's, with the Wilson intervals)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

MAX_SHOWN = 10
VERDICTS = {
    "pass": "PASS: all gates hold",
    "warn": "WARN: requirements hold, some warning gates do not",
    "fail": "FAIL: at least one requirement does not hold",
}


def num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def short_hash(value: str) -> str:
    algorithm, _, digest = value.partition(":")
    return f"{algorithm}:{digest[:12]}"


def preview(value: object, width: int = 70) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def describe_example(presentation: Sequence[Sequence[str]] | None, value: object) -> str:
    text = preview(value)
    if presentation:
        text = f"options [{', '.join(shown for shown, _ in presentation)}] · {text}"
    return text


def check_lines(checks: Sequence[Mapping[str, Any]], width: int = 38) -> list[str]:
    lines = []
    for check in checks:
        tag = "" if check["level"] == "requirement" else " (warning)"
        interval = check.get("interval")
        ci = f" [95% CI {interval['lo']:.3f}-{interval['hi']:.3f}]" if interval else ""
        lines.append(f"    {check['status'].upper():<4}  {check['gate']:<{width}} {check['message']}{ci}{tag}")
    return lines


def render_report(report: Mapping[str, Any]) -> str:
    c = report["metrics"]["counts"]
    backend = report["backend"]
    model = " / ".join(p for p in (backend.get("model"), backend.get("model_version")) if p) or "-"
    lines = [
        f"otel-plumb decision · {report['contract']['name']} ({report['contract']['type']})"
        f" · {report['status'].upper()}",
        "",
        f"  contract  {report['contract']['path']}  {short_hash(report['contract']['hash'])}",
        f"  dataset   {report['dataset']['path']}  {short_hash(report['dataset']['hash'])}",
        f"  backend   {backend['name']}: {backend['provider']} · {model}",
    ]
    health = report.get("health")
    if health is not None and health["status"] != "ok":
        lines.append(f"  health    {health['status']}: {health['detail']}")
    errors = ", ".join(f"{kind} {n}" for kind, n in c["errors_by_kind"].items())
    lines += [
        "",
        f"  Cases        {c['total']} total · {c['succeeded']} decided · {c['errored']} errored"
        + (f" ({errors})" if errors else "")
        + f" · {c['labeled']} labeled",
    ]
    if report["mode"] != "fuzz":
        lines += _golden_lines(report["metrics"])
    props = report.get("properties")
    if props is not None:
        lines += _property_lines(props)
    lines += ["", "  Checks", *check_lines(report["checks"])]
    failures = report["failures"]
    if failures and report["mode"] != "fuzz":
        shown = failures[:MAX_SHOWN]
        lines += ["", f"  Failures ({len(shown)} of {len(failures)})"]
        for f in shown:
            what = (
                (f["error"] or "error")
                if f["kind"] == "error"
                else (f"expected {f['expected']}, got {f['selected']} ({num(f['confidence'], 2)})")
            )
            lines += [f"    {f['case_id']:<12} {what}", f"    {'':<12} input: {preview(f['input'])}"]
    if props is not None:
        lines += _property_failure_lines(props)
    lines += ["", VERDICTS[report["status"]]]
    return "\n".join(lines)


def _golden_lines(m: Mapping[str, Any]) -> list[str]:
    cl, ca, lat, sel = m["classification"], m["calibration"], m["latency"], m["selective"]
    lines = [
        f"  Accuracy     {num(cl['accuracy'])}   macro-F1 {num(cl['macro_f1'])}"
        + (f"   ordinal MAE {num(cl['ordinal_mae'])}" if cl["ordinal_mae"] is not None else ""),
        f"  Calibration  ECE {num(ca['ece'])}   Brier {num(ca['brier'])}   NLL {num(ca['nll'])}   ({ca['bins']} bins)",
    ]
    if cl["per_label"]:
        lines.append(
            "  Per label    "
            + "   ".join(
                f"{label} P {num(s['precision'], 2)} R {num(s['recall'], 2)} F1 {num(s['f1'], 2)}"
                for label, s in cl["per_label"].items()
            )
        )
    if sel is not None:
        lines.append(
            f"  Selective    confidence >= {sel['threshold']:g}: coverage {num(sel['coverage'])}"
            f"   abstention {num(sel['abstention_rate'])}   accuracy {num(sel['selective_accuracy'])}"
        )
    lines.append(
        f"  Latency ms   mean {num(lat['mean_ms'], 1)}   p50 {num(lat['p50_ms'], 1)}"
        f"   p95 {num(lat['p95_ms'], 1)}   max {num(lat['max_ms'], 1)}"
    )
    return lines


def _property_lines(props: Mapping[str, Any]) -> list[str]:
    lines = ["", f"  Properties   seed {props['seed']}"]
    for s in props["summaries"]:
        parts = [
            f"{s['n_evaluated']} compared",
            f"{s['n_violations']} violating ({pct(s['violation_rate'])})",
            f"flips {s['n_flips']} ({pct(s['flip_rate'])}",
        ]
        flip_ci = s.get("flip_interval")
        parts[-1] += f", 95% CI {pct(flip_ci['lo'])}-{pct(flip_ci['hi'])})" if flip_ci and s["n_evaluated"] else ")"
        if s["max_level_decrease"] is not None:
            parts.append(f"max level drop {num(s['max_level_decrease'])}")
        else:
            parts.append(f"max TV {num(s['max_tv_distance'])}")
        if s["n_errors"]:
            parts.append(f"{s['n_errors']} errored")
        if s["n_skipped"]:
            parts.append(f"{s['n_skipped']} skipped")
        lines.append(f"    {s['property']:<20} " + " · ".join(parts))
    return lines


def _property_failure_lines(props: Mapping[str, Any]) -> list[str]:
    failures = [
        p
        for p in props["pairs"]
        if p["violations"] or (p["error"] is not None and p["error"]["kind"] != "original_error")
    ]
    if not failures:
        return []
    shown = failures[:MAX_SHOWN]
    lines = ["", f"  Property failures ({len(shown)} of {len(failures)}; replay with `otel-plumb decision replay`)"]
    for p in shown:
        lines.append(f"    {p['id']}")
        if p["error"] is not None:
            lines.append(f"      error: {p['error']['kind']}: {p['error']['message']}")
        else:
            lines.append(f"      {'; '.join(p['violations'])}")
        lines.append(f"      sent: {describe_example(p['presentation'], p['input'])}")
        if p["reduced"] is not None:
            r = p["reduced"]
            lines.append(
                f"      minimal: {describe_example(r['presentation'], r['input'])} ({'; '.join(r['violations'])})"
            )
    return lines
