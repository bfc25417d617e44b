"""Compare a candidate run with a baseline run of the same decision (DecGuard's ``diff``).

Cases are matched by id; per-case shifts use cases both runs decided, and metrics are
recomputed on the matched cases of each run with the same evaluation settings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from otel_plumb.decision import DECGUARD_COMPAT_VERSION
from otel_plumb.decision.contract import LoadedContract, Regression, dump_section
from otel_plumb.decision.errors import ReportError
from otel_plumb.decision.model import Record
from otel_plumb.decision.render import check_lines, describe_example, num, pct
from otel_plumb.decision.report import STATUS_EXIT, StoredReport, compute_metrics, make_check, overall_status
from otel_plumb.stats import classification as cm
from otel_plumb.stats import distribution as dist

MISSING_SEGMENT = "(missing)"
REGRESSION_GATES = {
    "max_answer_flip_rate": "answer_flip_rate",
    "max_accuracy_drop": "accuracy_drop",
    "max_macro_f1_drop": "macro_f1_drop",
    "max_ece_increase": "ece_increase",
    "max_brier_increase": "brier_increase",
    "max_nll_increase": "nll_increase",
    "max_mean_tv_distance": "mean_tv_distance",
    "max_mean_confidence_shift": "mean_abs_confidence_delta",
    "max_error_rate_increase": "error_rate_increase",
    "max_latency_p95_increase_ms": "latency_p95_increase_ms",
    "max_segment_accuracy_drop": "segment_accuracy_drop",
}


def _metric_values(m: Mapping[str, Any]) -> dict[str, float | None]:
    return {
        "accuracy": m["classification"]["accuracy"],
        "macro_f1": m["classification"]["macro_f1"],
        "ordinal_mae": m["classification"]["ordinal_mae"],
        "ece": m["calibration"]["ece"],
        "brier": m["calibration"]["brier"],
        "nll": m["calibration"]["nll"],
        "coverage": m["selective"]["coverage"] if m["selective"] else None,
        "error_rate": m["counts"]["error_rate"],
        "latency_p50_ms": m["latency"]["p50_ms"],
        "latency_p95_ms": m["latency"]["p95_ms"],
    }


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _run_info(report: StoredReport, path: str) -> dict[str, Any]:
    d = report.data
    return {
        "path": path,
        "created_at": d["created_at"],
        "mode": d["mode"],
        "contract_hash": d["contract"]["hash"],
        "dataset": d["dataset"],
        "backend": d["backend"],
    }


def _segment_value(record: Record, key: str) -> str:
    if key not in record.case.metadata:
        return MISSING_SEGMENT
    value = record.case.metadata[key]
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _accuracy(records: Sequence[Record]) -> float | None:
    hits = [r.result.selected == r.case.expected for r in records if r.case.expected is not None and r.result]
    return sum(hits) / len(hits) if hits else None


def _compare_cases(
    pairs: Sequence[tuple[Record, Record]], labels: Sequence[str]
) -> tuple[dict[str, Any], dict[str, int], list[dict[str, Any]]]:
    changes: list[dict[str, Any]] = []
    tv: list[float] = []
    js: list[float] = []
    conf: list[float] = []
    tally = dict.fromkeys(
        ("answer_flips", "newly_wrong", "newly_correct", "newly_errored", "recovered", "still_errored"), 0
    )
    empty = {
        "expected": None,
        "baseline_selected": None,
        "candidate_selected": None,
        "baseline_confidence": None,
        "candidate_confidence": None,
        "tv_distance": None,
        "error": None,
    }
    for base, cand in pairs:
        b, c = base.result, cand.result
        head = {"case_id": cand.case.id, "input": cand.case.input}
        if b is None and c is None:
            tally["still_errored"] += 1
        elif c is None:
            tally["newly_errored"] += 1
            assert cand.error is not None
            changes.append(
                {
                    **head,
                    "kind": "newly_errored",
                    **empty,
                    "expected": cand.case.expected,
                    "baseline_selected": b.selected if b else None,
                    "error": f"{cand.error.kind}: {cand.error.message}",
                }
            )
        elif b is None:
            tally["recovered"] += 1
            changes.append(
                {
                    **head,
                    "kind": "recovered",
                    **empty,
                    "expected": cand.case.expected,
                    "candidate_selected": c.selected,
                    "candidate_confidence": c.confidence,
                }
            )
        else:
            distance, divergence, _ = dist.distances(b.probabilities, c.probabilities, labels)
            tv.append(distance)
            js.append(divergence)
            conf.append(c.confidence - b.confidence)
            if b.selected != c.selected:
                tally["answer_flips"] += 1
                expected = cand.case.expected
                if expected is not None:
                    tally["newly_wrong"] += b.selected == expected
                    tally["newly_correct"] += c.selected == expected
                changes.append(
                    {
                        **head,
                        "kind": "flip",
                        **empty,
                        "expected": expected,
                        "baseline_selected": b.selected,
                        "candidate_selected": c.selected,
                        "baseline_confidence": b.confidence,
                        "candidate_confidence": c.confidence,
                        "tv_distance": distance,
                    }
                )
    shift = {
        "answer_flip_rate": tally["answer_flips"] / len(tv) if tv else None,
        "mean_tv_distance": cm.mean(tv),
        "max_tv_distance": max(tv) if tv else None,
        "mean_js_divergence": cm.mean(js),
        "mean_confidence_delta": cm.mean(conf),
        "mean_abs_confidence_delta": cm.mean([abs(x) for x in conf]),
        "max_abs_confidence_delta": max((abs(x) for x in conf), default=None),
    }
    order = ("compared", "answer_flips", "newly_wrong", "newly_correct", "newly_errored", "recovered", "still_errored")
    counts = {key: len(tv) if key == "compared" else tally[key] for key in order}
    keyed = [{k: ch[k] for k in ("case_id", "kind", "input", *empty)} for ch in changes]
    return shift, counts, keyed


def _segments(pairs: Sequence[tuple[Record, Record]], keys: Sequence[str], min_size: int) -> list[dict[str, Any]]:
    out = []
    for key in keys:
        groups: dict[str, list[tuple[Record, Record]]] = {}
        for pair in pairs:
            groups.setdefault(_segment_value(pair[1], key), []).append(pair)
        for value in sorted(groups):
            group = groups[value]
            decided = [(b.result, c.result) for b, c in group if b.result and c.result]
            flips = sum(1 for b, c in decided if b.selected != c.selected)
            base_acc, cand_acc = _accuracy([b for b, _ in group]), _accuracy([c for _, c in group])
            out.append(
                {
                    "key": key,
                    "value": value,
                    "matched": len(group),
                    "compared": len(decided),
                    "baseline_accuracy": base_acc,
                    "candidate_accuracy": cand_acc,
                    "accuracy_drop": None if base_acc is None or cand_acc is None else base_acc - cand_acc,
                    "answer_flip_rate": flips / len(decided) if decided else None,
                    "gated": len(group) >= min_size,
                }
            )
    return out


def diff_reports(
    baseline: StoredReport,
    candidate: StoredReport,
    *,
    contract: LoadedContract | None = None,
    segment_by: Sequence[str] | None = None,
    baseline_path: str = "baseline",
    candidate_path: str = "candidate",
) -> dict[str, Any]:
    """Compare two reports; ``max_error_rate_increase`` is a requirement of 0 unless configured."""
    bs, cs = baseline.spec, candidate.spec
    if (bs.name, bs.type, bs.labels) != (cs.name, cs.type, cs.labels):
        raise ReportError(f"cannot compare {bs.name!r} ({list(bs.labels)}) with {cs.name!r} ({list(cs.labels)})")
    if contract is not None:
        spec = contract.contract.spec()
        if (spec.name, spec.type, spec.labels) != (cs.name, cs.type, cs.labels):
            raise ReportError(f"contract {contract.path} describes {spec.name!r}, but the reports are for {cs.name!r}")
    regression = contract.contract.regression if contract is not None else Regression()
    evaluation = contract.contract.evaluation if contract is not None else candidate.evaluation
    keys = tuple(segment_by) if segment_by else regression.segment_by
    base_by_id = baseline.records_by_id()
    cand_by_id = candidate.records_by_id()
    pairs = [(base_by_id[r.case.id], r) for r in candidate.records if r.case.id in base_by_id]
    shift, tally, changes = _compare_cases(pairs, cs.labels)
    counts = {
        "baseline_cases": len(baseline.records),
        "candidate_cases": len(candidate.records),
        "matched": len(pairs),
        "only_in_baseline": len(base_by_id) - len(pairs),
        "only_in_candidate": len(cand_by_id) - len(pairs),
        **tally,
    }
    base_m = _metric_values(compute_metrics(cs, [b for b, _ in pairs], evaluation))
    cand_m = _metric_values(compute_metrics(cs, [c for _, c in pairs], evaluation))
    metrics = {
        n: {"baseline": base_m[n], "candidate": cand_m[n], "delta": _delta(base_m[n], cand_m[n])} for n in base_m
    }
    segments = _segments(pairs, keys, regression.min_segment_size)
    gated = [s for s in segments if s["gated"] and s["accuracy_drop"] is not None]
    worst = max(gated, key=lambda s: s["accuracy_drop"] or 0.0, default=None)

    def drop(name: str) -> float | None:
        delta = metrics[name]["delta"]
        return None if delta is None else -delta

    values = {
        "answer_flip_rate": shift["answer_flip_rate"],
        "accuracy_drop": drop("accuracy"),
        "macro_f1_drop": drop("macro_f1"),
        "ece_increase": metrics["ece"]["delta"],
        "brier_increase": metrics["brier"]["delta"],
        "nll_increase": metrics["nll"]["delta"],
        "mean_tv_distance": shift["mean_tv_distance"],
        "mean_abs_confidence_delta": shift["mean_abs_confidence_delta"],
        "error_rate_increase": metrics["error_rate"]["delta"],
        "latency_p95_increase_ms": metrics["latency_p95_ms"]["delta"],
        "segment_accuracy_drop": worst["accuracy_drop"] if worst else None,
    }
    detail = f"worst segment {worst['key']}={worst['value']}" if worst else ""
    required = regression.configured()
    required.setdefault("max_error_rate_increase", 0.0)
    checks = [
        make_check(
            gate,
            REGRESSION_GATES[gate],
            "<=",
            threshold,
            values[REGRESSION_GATES[gate]],
            level=level,
            missing="no comparable cases",
            detail=detail if gate == "max_segment_accuracy_drop" else "",
        )
        for level, gates in (("requirement", required), ("warning", regression.warnings.configured()))
        for gate, threshold in gates.items()
    ]
    status = overall_status(checks)
    return {
        "diff_version": "0.1",
        "decguard_version": DECGUARD_COMPAT_VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "status": status,
        "exit_code": STATUS_EXIT[status],
        "contract": candidate.data["contract"],
        "baseline": _run_info(baseline, baseline_path),
        "candidate": _run_info(candidate, candidate_path),
        "same_dataset": baseline.data["dataset"]["hash"] == candidate.data["dataset"]["hash"],
        "evaluation": dump_section(evaluation),
        "counts": counts,
        "shift": shift,
        "metrics": metrics,
        "segments": segments,
        "checks": checks,
        "changes": changes,
    }


def render_diff(report: Mapping[str, Any], max_changes: int = 10) -> str:
    c, s = report["counts"], report["shift"]
    lines = [
        f"otel-plumb decision · diff {report['contract']['name']} ({report['contract']['type']})"
        f" · {report['status'].upper()}",
        "",
    ]
    for role in ("baseline", "candidate"):
        run = report[role]
        model = " / ".join(p for p in (run["backend"].get("model"), run["backend"].get("model_version")) if p) or "-"
        lines.append(f"  {role:<10}{run['path']}  {run['backend']['name']}: {run['backend']['provider']} · {model}")
    if not report["same_dataset"]:
        lines.append("  note      the runs used different datasets; cases are matched by id")
    lines += [
        "",
        f"  Cases        {c['matched']} matched · {c['compared']} compared · {c['only_in_baseline']} only in baseline"
        f" · {c['only_in_candidate']} only in candidate",
        f"  Answers      {c['answer_flips']} flipped ({pct(s['answer_flip_rate'])}) · {c['newly_wrong']} newly wrong"
        f" · {c['newly_correct']} newly correct",
        f"  Errors       {c['newly_errored']} new · {c['recovered']} recovered · {c['still_errored']} still",
        f"  Shift        mean TV {num(s['mean_tv_distance'])}   max TV {num(s['max_tv_distance'])}"
        f"   mean JS {num(s['mean_js_divergence'])}",
        "",
        f"  {'Metric':<16}{'baseline':>10}{'candidate':>11}{'delta':>10}",
    ]
    for name, m in report["metrics"].items():
        if m["baseline"] is None and m["candidate"] is None:
            continue
        delta = "n/a" if m["delta"] is None else f"{m['delta']:+.3f}"
        lines.append(f"  {name:<16}{num(m['baseline']):>10}{num(m['candidate']):>11}{delta:>10}")
    if report["segments"]:
        lines += ["", "  Segments"]
        for seg in report["segments"]:
            lines.append(
                f"    {seg['key']}={seg['value']:<14} n={seg['matched']:<4} accuracy "
                f"{num(seg['baseline_accuracy'])} -> {num(seg['candidate_accuracy'])}"
                f"   flips {pct(seg['answer_flip_rate'])}" + ("" if seg["gated"] else "   (not gated: small)")
            )
    lines += ["", "  Checks", *check_lines(report["checks"], 30)]
    if report["changes"]:
        shown = report["changes"][:max_changes]
        lines += ["", f"  Changes ({len(shown)} of {len(report['changes'])})"]
        for ch in shown:
            if ch["kind"] == "flip":
                what = (
                    f"{ch['baseline_selected']} ({num(ch['baseline_confidence'], 2)}) -> {ch['candidate_selected']}"
                    f" ({num(ch['candidate_confidence'], 2)})"
                    + (f", expected {ch['expected']}" if ch["expected"] else "")
                )
            elif ch["kind"] == "newly_errored":
                what = f"now errors: {ch['error']}"
            else:
                what = f"recovered: {ch['candidate_selected']}"
            lines += [f"    {ch['case_id']:<12} {what}", f"    {'':<12} input: {describe_example(None, ch['input'])}"]
    verdict = {
        "pass": "PASS: no regression gate is violated",
        "warn": "WARN: requirements hold, some warning gates do not",
        "fail": "FAIL: the candidate regresses beyond the contract's limits",
    }[report["status"]]
    return "\n".join([*lines, "", verdict])
