"""The JSON report: DecGuard 0.1's fields, plus Wilson 95% intervals on every violation and
flip rate (``violation_interval``/``flip_interval`` in summaries, ``interval`` on rate checks)
and the ``max_flip_rate_upper`` gate.

A report is a pure function of its results, its transformed cases and the settings stored in
it. Loading therefore rebuilds it from those and refuses any stored field that differs: a
tampered or corrupted report cannot pass.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import to_json

from otel_plumb import __version__ as OTEL_PLUMB_VERSION
from otel_plumb.decision import DECGUARD_COMPAT_VERSION
from otel_plumb.decision.compare import Comparison, compare, flips_limited, judge, tolerance_violations
from otel_plumb.decision.contract import (
    DecisionSpec,
    Evaluation,
    Fuzz,
    Gates,
    LoadedContract,
    Monotonic,
    Properties,
    PropertyConfig,
    dump_section,
)
from otel_plumb.decision.engine import (
    ORIGINAL_ERROR,
    Pair,
    PropertyRun,
    Reduced,
    RunOutcome,
    Skip,
    judge_pair,
    paused_gc,
    references,
    run_contract,
)
from otel_plumb.decision.errors import ReportError
from otel_plumb.decision.model import Case, CaseError, DecisionInput, Outcome, Record, Result, validate_probabilities
from otel_plumb.decision.transforms import Mutation, Transform, make_transform, set_text
from otel_plumb.decision.validation import format_errors
from otel_plumb.stats import classification as cm
from otel_plumb.stats import rate

REPORT_VERSION = "0.1"
STATUS_EXIT = {"pass": 0, "warn": 0, "fail": 1}
# Keys we add to DecGuard's format; a DecGuard-made report without them still loads.
EXTENSION_KEYS = frozenset(
    {
        "produced_by",
        "violation_interval",
        "flip_interval",
        "interval",
        "max_flip_rate_upper",
        "original_samples",
        "original_draws",
    }
)

GATES: dict[str, tuple[str, str]] = {
    "min_accuracy": ("accuracy", ">="),
    "min_macro_f1": ("macro_f1", ">="),
    "max_nll": ("nll", "<="),
    "max_brier": ("brier", "<="),
    "max_ece": ("ece", "<="),
    "min_coverage": ("coverage", ">="),
    "max_abstention_rate": ("abstention_rate", "<="),
    "min_selective_accuracy": ("selective_accuracy", ">="),
    "max_error_rate": ("error_rate", "<="),
    "max_latency_p95_ms": ("latency_p95_ms", "<="),
    "max_ordinal_mae": ("ordinal_mae", "<="),
}


# --- metrics -------------------------------------------------------------------------------------


def compute_metrics(spec: DecisionSpec, records: Sequence[Record], evaluation: Evaluation) -> dict[str, Any]:
    results = [r.result for r in records if r.result is not None]
    labeled = [(r.case.expected, r.result) for r in records if r.result is not None and r.case.expected is not None]
    expected = [e for e, _ in labeled]
    predicted = [res.selected for _, res in labeled]
    probabilities = [res.probabilities for _, res in labeled]
    errors = Counter(r.error.kind for r in records if r.error is not None)
    n_errors = sum(errors.values())
    per_label = cm.per_label_scores(expected, predicted, spec.labels) if labeled else {}
    bins = cm.reliability_bins(
        [res.confidence for _, res in labeled],
        [e == p for e, p in zip(expected, predicted, strict=True)],
        evaluation.calibration_bins,
    )
    selective = None
    threshold = evaluation.confidence_threshold
    if threshold is not None:
        covered_labeled = [(e, res) for e, res in labeled if res.confidence >= threshold]
        coverage = cm.mean([float(res.confidence >= threshold) for res in results])
        selective = {
            "threshold": threshold,
            "n": len(results),
            "coverage": coverage,
            "abstention_rate": None if coverage is None else 1.0 - coverage,
            "selective_accuracy": cm.accuracy(
                [e for e, _ in covered_labeled], [r.selected for _, r in covered_labeled]
            ),
            "n_covered_labeled": len(covered_labeled),
        }
    latencies = [res.latency_ms for res in results]
    return {
        "counts": {
            "total": len(records),
            "succeeded": len(results),
            "errored": n_errors,
            "labeled": len(labeled),
            "errors_by_kind": dict(sorted(errors.items())),
            "error_rate": n_errors / len(records) if records else 0.0,
        },
        "classification": {
            "n": len(labeled),
            "accuracy": cm.accuracy(expected, predicted),
            "macro_f1": cm.macro_f1(expected, predicted, spec.labels),
            "per_label": {
                label: {"precision": s.precision, "recall": s.recall, "f1": s.f1, "support": s.support}
                for label, s in per_label.items()
            },
            "ordinal_mae": cm.ordinal_mae(expected, predicted, spec.labels) if spec.type == "score" else None,
        },
        "calibration": {
            "n": len(labeled),
            "ece": cm.expected_calibration_error(bins),
            "brier": cm.brier(expected, probabilities),
            "nll": cm.nll(expected, probabilities),
            "bins": evaluation.calibration_bins,
            "reliability": [b.as_dict() for b in bins],
        },
        "selective": selective,
        "latency": {
            "n": len(latencies),
            "mean_ms": cm.mean(latencies),
            "p50_ms": cm.percentile(latencies, 50),
            "p90_ms": cm.percentile(latencies, 90),
            "p95_ms": cm.percentile(latencies, 95),
            "p99_ms": cm.percentile(latencies, 99),
            "max_ms": max(latencies) if latencies else None,
        },
    }


def gate_values(m: Mapping[str, Any]) -> dict[str, float | None]:
    sel = m["selective"] or {}
    return {
        "accuracy": m["classification"]["accuracy"],
        "macro_f1": m["classification"]["macro_f1"],
        "ordinal_mae": m["classification"]["ordinal_mae"],
        "nll": m["calibration"]["nll"],
        "brier": m["calibration"]["brier"],
        "ece": m["calibration"]["ece"],
        "coverage": sel.get("coverage"),
        "abstention_rate": sel.get("abstention_rate"),
        "selective_accuracy": sel.get("selective_accuracy"),
        "error_rate": m["counts"]["error_rate"],
        "latency_p95_ms": m["latency"]["p95_ms"],
    }


# --- checks --------------------------------------------------------------------------------------


def make_check(
    gate: str,
    metric: str,
    comparison: str,
    threshold: float,
    value: float | None,
    *,
    level: str,
    missing: str = "no eligible cases",
    detail: str = "",
) -> dict[str, Any]:
    """A check that ``value comparison threshold`` holds; a value that could not be computed fails."""
    if value is None:
        holds = False
        message = f"{metric} could not be computed ({missing})"
    else:
        holds = value >= threshold if comparison == ">=" else value <= threshold
        message = f"{metric} {value:.4g} {comparison} {threshold:g}"
        if not holds:
            message = f"{metric} {value:.4g} violates {comparison} {threshold:g}"
    if detail:
        message += f" ({detail})"
    status = "pass" if holds else "fail" if level == "requirement" else "warn"
    return {
        "gate": gate,
        "level": level,
        "metric": metric,
        "comparison": comparison,
        "threshold": threshold,
        "value": value,
        "status": status,
        "message": message,
    }


def overall_status(checks: Sequence[Mapping[str, Any]]) -> str:
    statuses = {c["status"] for c in checks}
    return "fail" if "fail" in statuses else "warn" if "warn" in statuses else "pass"


def evaluate_gates(requirements: Gates, warnings: Gates, metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Configured gates; ``max_error_rate`` is a requirement of 0 unless the contract says otherwise."""
    values = gate_values(metrics)
    required = requirements.configured()
    required.setdefault("max_error_rate", 0.0)
    checks = []
    for level, gates in (("requirement", required), ("warning", warnings.configured())):
        for gate, threshold in gates.items():
            metric, comparison = GATES[gate]
            checks.append(make_check(gate, metric, comparison, threshold, values[metric], level=level))
    return checks


# --- properties ------------------------------------------------------------------------------------


def summarize(
    name: str, config: PropertyConfig, pairs: Sequence[Pair], skipped: Sequence[Skip], n_cases: int
) -> dict[str, Any]:
    mine = [pair for pair in pairs if pair.property == name]
    evaluated = [pair.comparison for pair in mine if pair.comparison is not None]
    errors = Counter(pair.error.kind for pair in mine if pair.error is not None)
    n_violations = sum(1 for c in evaluated if tolerance_violations(config, c))
    flips = sum(1 for c in evaluated if c.flipped)
    level_decrease = None
    if isinstance(config, Monotonic):
        sign = 1.0 if config.direction == "increasing" else -1.0
        drops = [max(0.0, -sign * (c.level_delta or 0.0)) for c in evaluated]
        level_decrease = max(drops) if drops else None
    n = len(evaluated)

    def top(values: list[float]) -> float | None:
        return max(values) if values else None

    return {
        "property": name,
        "level": config.level,
        "relation": config.relation,
        "n_cases": n_cases,
        "n_transformed": len(mine),
        "n_skipped": sum(1 for skip in skipped if skip.property == name),
        "n_errors": sum(errors.values()),
        "errors_by_kind": dict(sorted(errors.items())),
        "n_evaluated": n,
        "n_violations": n_violations,
        "violation_rate": n_violations / n if n else None,
        "n_flips": flips,
        "flip_rate": flips / n if n else None,
        "mean_tv_distance": cm.mean([c.tv_distance for c in evaluated]),
        "max_tv_distance": top([c.tv_distance for c in evaluated]),
        "max_js_divergence": top([c.js_divergence for c in evaluated]),
        "max_abs_delta": top([c.max_abs_delta for c in evaluated]),
        "max_abs_confidence_delta": top([abs(c.confidence_delta) for c in evaluated]),
        "max_level_decrease": level_decrease,
        "n_reduced": sum(1 for pair in mine if pair.reduced is not None),
        "violation_interval": rate(n_violations, n).as_dict(),
        "flip_interval": rate(flips, n).as_dict(),
    }


def _interval(r: Mapping[str, Any]) -> dict[str, float]:
    return {"lo": r["lo"], "hi": r["hi"]}


def property_checks(summaries: Sequence[Mapping[str, Any]], config: Properties) -> list[dict[str, Any]]:
    """Checks for every enabled property; a property not run, or with nothing evaluated, fails."""
    by_name = {s["property"]: s for s in summaries}
    checks = []
    for name, prop in config.configured().items():
        s = by_name.get(name)
        missing = "the property was not run" if s is None else "no case could be transformed"
        n_transformed = s["n_transformed"] if s else 0
        error_rate = s["n_errors"] / n_transformed if s and n_transformed else None
        checks.append(
            make_check(
                f"{name}.max_error_rate",
                f"{name}.error_rate",
                "<=",
                0.0,
                error_rate,
                level="requirement",
                missing=missing,
            )
        )
        if prop.tolerances():
            limits = "per case: " + ", ".join(f"{k} {v:g}" for k, v in prop.tolerances().items())
            check = make_check(
                f"{name}.max_violation_rate",
                f"{name}.violation_rate",
                "<=",
                prop.max_violation_rate,
                s["violation_rate"] if s else None,
                level=prop.level,
                missing=missing,
                detail=limits,
            )
            if s and s["n_evaluated"]:
                check["interval"] = _interval(s["violation_interval"])
            checks.append(check)
        if prop.max_flip_rate is not None:
            check = make_check(
                f"{name}.max_flip_rate",
                f"{name}.flip_rate",
                "<=",
                prop.max_flip_rate,
                s["flip_rate"] if s else None,
                level=prop.level,
                missing=missing,
            )
            if s and s["n_evaluated"]:
                check["interval"] = _interval(s["flip_interval"])
            checks.append(check)
        if prop.max_flip_rate_upper is not None:
            upper = s["flip_interval"]["hi"] if s and s["n_evaluated"] else None
            checks.append(
                make_check(
                    f"{name}.max_flip_rate_upper",
                    f"{name}.flip_rate_upper",
                    "<=",
                    prop.max_flip_rate_upper,
                    upper,
                    level=prop.level,
                    missing=missing,
                    detail="Wilson 95% upper bound",
                )
            )
    return checks


def _reduced_json(r: Reduced) -> dict[str, Any]:
    return {
        "steps": list(r.steps),
        "input": r.input,
        "presentation": _presentation(r.presentation),
        "result": r.result.to_json(),
        "comparison": r.comparison.to_json(),
        "violations": list(r.violations),
        "backend_calls": r.backend_calls,
    }


def _presentation(p: Any) -> list[list[str]] | None:
    return None if p is None else [list(pair) for pair in p]


def pair_json(pair: Pair) -> dict[str, Any]:
    result, error = pair.result, pair.error
    return {
        "id": pair.id,
        "property": pair.property,
        "case_id": pair.case_id,
        "sample": pair.sample,
        "steps": list(pair.steps),
        "provenance": pair.provenance,
        "input": pair.input,
        "presentation": _presentation(pair.presentation),
        "result": result.to_json() if result else None,
        "error": error.to_json() if error else None,
        "comparison": pair.comparison.to_json() if pair.comparison else None,
        "violations": list(pair.violations),
        "reduced": _reduced_json(pair.reduced) if pair.reduced else None,
    }


def _outcome_json(outcome: Outcome) -> dict[str, Any]:
    if isinstance(outcome, CaseError):
        return {"result": None, "error": outcome.to_json()}
    return {"result": outcome.to_json(), "error": None}


def properties_json(run: PropertyRun, n_cases: int) -> dict[str, Any]:
    summaries = [
        summarize(name, prop, run.pairs, run.skipped, n_cases) for name, prop in run.config.configured().items()
    ]
    out: dict[str, Any] = {
        "seed": run.seed,
        "fuzz": dump_section(run.fuzz),
        "config": dump_section(run.config),
        "summaries": summaries,
        "pairs": [pair_json(pair) for pair in run.pairs],
        "skipped": [{"property": s.property, "case_id": s.case_id, "reason": s.reason} for s in run.skipped],
    }
    if run.draws:
        out["original_draws"] = {
            case_id: [_outcome_json(o) for o in outcomes] for case_id, outcomes in run.draws.items()
        }
    return out


# --- the report --------------------------------------------------------------------------------------


def collect_failures(records: Sequence[Record]) -> list[dict[str, Any]]:
    failures = []
    for r in records:
        base: dict[str, Any] = {"case_id": r.case.id, "input": r.case.input, "expected": r.case.expected}
        if r.error is not None:
            failures.append(
                {
                    **base,
                    "kind": "error",
                    "selected": None,
                    "confidence": None,
                    "error": f"{r.error.kind}: {r.error.message}",
                }
            )
        elif r.result is not None and r.case.expected is not None and r.result.selected != r.case.expected:
            failures.append(
                {
                    **base,
                    "kind": "mismatch",
                    "selected": r.result.selected,
                    "confidence": r.result.confidence,
                    "error": None,
                }
            )
    return [
        {
            "case_id": f["case_id"],
            "kind": f["kind"],
            "input": f["input"],
            "expected": f["expected"],
            "selected": f["selected"],
            "confidence": f["confidence"],
            "error": f["error"],
        }
        for f in failures
    ]


def assemble(
    header: Mapping[str, Any],
    spec: DecisionSpec,
    evaluation: Evaluation,
    requirements: Gates,
    warnings: Gates,
    records: Sequence[Record],
    mode: str,
    properties: dict[str, Any] | None,
    property_config: Properties | None,
) -> dict[str, Any]:
    metrics = compute_metrics(spec, records, evaluation)
    checks = evaluate_gates(requirements, warnings, metrics) if mode in ("test", "all") else []
    if properties is not None and property_config is not None:
        checks += property_checks(properties["summaries"], property_config)
    status = overall_status(checks)
    return {
        "report_version": REPORT_VERSION,
        "decguard_version": header["decguard_version"],
        "produced_by": header.get("produced_by", f"otel-plumb {OTEL_PLUMB_VERSION}"),
        "created_at": header["created_at"],
        "mode": mode,
        "status": status,
        "exit_code": STATUS_EXIT[status],
        "contract": header["contract"],
        "dataset": header["dataset"],
        "backend": header["backend"],
        "health": header["health"],
        "evaluation": dump_section(evaluation),
        "requirements": dump_section(requirements),
        "warnings": dump_section(warnings),
        "metrics": metrics,
        "checks": checks,
        "failures": collect_failures(records),
        "results": [r.to_json() for r in records],
        "properties": properties,
    }


def build_report(outcome: RunOutcome) -> dict[str, Any]:
    with paused_gc():
        return _build_report(outcome)


async def run_and_report(loaded: LoadedContract, **options: Any) -> dict[str, Any]:
    """One run, from the contract to its report."""
    return build_report(await run_contract(loaded, **options))


def _build_report(outcome: RunOutcome) -> dict[str, Any]:
    loaded, contract = outcome.loaded, outcome.loaded.contract
    spec = contract.spec()
    header = {
        "decguard_version": DECGUARD_COMPAT_VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "contract": {
            "name": spec.name,
            "type": spec.type,
            "labels": list(spec.labels),
            "schema_version": contract.schema_version,
            "hash": loaded.hash,
            "path": str(loaded.path),
        },
        "dataset": {
            "path": str(outcome.dataset.path),
            "hash": outcome.dataset.hash,
            "n_cases": len(outcome.dataset.cases),
            "n_labeled": outcome.dataset.n_labeled,
        },
        "backend": outcome.backend_info,
        "health": outcome.health.to_json() if outcome.health else None,
    }
    run = outcome.properties
    props = properties_json(run, len(outcome.records)) if run else None
    return assemble(
        header,
        spec,
        contract.evaluation,
        contract.requirements,
        contract.warnings,
        outcome.records,
        outcome.mode,
        props,
        run.config if run else None,
    )


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in EXTENSION_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def decguard_format(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report without our additions, so DecGuard 0.1.1 itself loads it. Refused when an added
    setting shaped the results (k original draws, an upper-bound gate): DecGuard could not
    re-derive them."""
    props = report.get("properties") or {}
    if (props.get("fuzz") or {}).get("original_samples", 1) != 1:
        raise ReportError("fuzz.original_samples is not part of DecGuard's format; drop --decguard-format")
    if any(c["gate"].endswith(".max_flip_rate_upper") for c in report["checks"]):
        raise ReportError("max_flip_rate_upper is not part of DecGuard's format; drop --decguard-format")
    stripped: dict[str, Any] = _strip(report)
    return stripped


def dumps(report: Mapping[str, Any], *, indent: bool = True) -> str:
    # pydantic-core's serializer: the standard library's is pure Python once indent is set.
    return to_json(report, indent=2 if indent else None).decode("utf-8")


def write_report(report: Mapping[str, Any], path: str | Path) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(report) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"{path}: cannot write report: {exc.strerror or exc}") from exc


# --- loading: rebuild and compare ----------------------------------------------------------------------


class StoredReport:
    """A loaded, verified report with its parts rebuilt as objects."""

    def __init__(
        self,
        data: dict[str, Any],
        spec: DecisionSpec,
        records: list[Record],
        run: PropertyRun | None,
        evaluation: Evaluation,
        requirements: Gates,
        warnings: Gates,
    ) -> None:
        self.data = data
        self.spec = spec
        self.records = records
        self.run = run
        self.evaluation = evaluation
        self.requirements = requirements
        self.warnings = warnings

    @property
    def mode(self) -> str:
        return str(self.data["mode"])

    def records_by_id(self) -> dict[str, Record]:
        return {r.case.id: r for r in self.records}


def _section(model: type[BaseModel], value: Any, where: str) -> Any:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise ValueError(f"{where}:\n{format_errors(exc, prefix=where)}") from exc


def _result(value: Any, spec: DecisionSpec, tolerance: float, where: str) -> Result:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: must be an object")
    try:
        labels = tuple(value["labels"])
        probabilities = validate_probabilities(labels, value["probabilities"], tolerance=tolerance)
        result = Result(
            str(value["case_id"]),
            value["decision"],
            value["decision_type"],
            labels,
            probabilities,
            value["selected"],
            value["confidence"],
            value["backend"],
            value["provider"],
            value["model"],
            value["model_version"],
            float(value["latency_ms"]),
            dict(value["metadata"]),
        )
    except Exception as exc:  # missing keys, wrong types, an invalid distribution
        raise ValueError(f"{where}: {exc}") from exc
    if list(value["probabilities"]) != list(labels):
        raise ValueError(f"{where}: probabilities must list exactly the labels {list(labels)} in that order")
    if labels != spec.labels or result.decision != spec.name or result.decision_type != spec.type:
        raise ValueError(f"{where}: result does not match the report decision")
    return result


def _outcome(value: Any, spec: DecisionSpec, tolerance: float, where: str) -> Outcome:
    if not isinstance(value, dict) or (value.get("result") is None) == (value.get("error") is None):
        raise ValueError(f"{where}: must have exactly one of 'result' or 'error'")
    if value.get("error") is not None:
        error = value["error"]
        if (
            not isinstance(error, dict)
            or not isinstance(error.get("kind"), str)
            or not isinstance(error.get("message"), str)
        ):
            raise ValueError(f"{where}.error: needs string 'kind' and 'message'")
        return CaseError(error["kind"], error["message"])
    return _result(value["result"], spec, tolerance, f"{where}.result")


def _input(value: Any, where: str) -> DecisionInput:
    if not isinstance(value, (str, dict)):
        raise ValueError(f"{where}.input: must be a string or an object")
    return value


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: must be a non-negative integer")
    return value


def _presentation_of(value: Any) -> tuple[tuple[str, str], ...] | None:
    return None if value is None else tuple((str(a), str(b)) for a, b in value)


def _first_difference(stored: Any, rebuilt: Any, path: str = "") -> str | None:
    if isinstance(stored, dict) and isinstance(rebuilt, dict):
        for key in rebuilt:
            if key not in stored:
                if key in EXTENSION_KEYS:
                    continue
                return f"{path}.{key}".lstrip(".") + " is missing"
            found = _first_difference(stored[key], rebuilt[key], f"{path}.{key}")
            if found:
                return found
        extra = [key for key in stored if key not in rebuilt]
        return f"{path}.{extra[0]}".lstrip(".") + " is not a report field" if extra else None
    if isinstance(stored, list) and isinstance(rebuilt, list):
        if len(stored) != len(rebuilt):
            return f"{path.lstrip('.')} has {len(stored)} entries, expected {len(rebuilt)}"
        for index, (a, b) in enumerate(zip(stored, rebuilt, strict=True)):
            found = _first_difference(a, b, f"{path}.{index}")
            if found:
                return found
        return None
    if stored != rebuilt or (
        type(stored) is not type(rebuilt)
        and not (isinstance(stored, (int, float)) and isinstance(rebuilt, (int, float)))
    ):
        return f"{path.lstrip('.')} does not match what the stored results give"
    return None


def verify(data: Any) -> StoredReport:
    """Rebuild the report from its stored results and settings; raise ValueError where they differ."""
    if not isinstance(data, dict):
        raise ValueError("a report must be a JSON object")
    if data.get("report_version") != REPORT_VERSION:
        raise ValueError(f"report_version must be {REPORT_VERSION!r}")
    if data.get("mode") not in ("test", "fuzz", "all"):
        raise ValueError("mode must be test, fuzz or all")
    contract = data.get("contract")
    if not isinstance(contract, dict):
        raise ValueError("contract must be an object")
    evaluation = _section(Evaluation, data.get("evaluation"), "evaluation")
    requirements = _section(Gates, data.get("requirements"), "requirements")
    warnings = _section(Gates, data.get("warnings"), "warnings")
    try:
        spec = DecisionSpec(str(contract["name"]), contract["type"], tuple(map(str, contract["labels"])))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"contract: {exc}") from exc
    if spec.type not in ("choice", "noul", "score") or len(set(spec.labels)) != len(spec.labels) or not spec.labels:
        raise ValueError("contract decision is invalid")
    tolerance = evaluation.probability_tolerance
    backend = data.get("backend")
    if not isinstance(backend, dict):
        raise ValueError("backend must be an object")
    results = data.get("results")
    if not isinstance(results, list) or not results:
        raise ValueError("report contains no case results")
    records: list[Record] = []
    seen: set[str] = set()
    for index, row in enumerate(results):
        where = f"results.{index}"
        if not isinstance(row, dict) or not isinstance(row.get("case_id"), str):
            raise ValueError(f"{where}: needs a string case_id")
        case_id = row["case_id"]
        if case_id in seen:
            raise ValueError(f"duplicate case id {case_id!r}")
        seen.add(case_id)
        expected = row.get("expected")
        if expected is not None and expected not in spec.labels:
            raise ValueError(f"case {case_id!r}: expected {expected!r} is not a report label")
        outcome = _outcome(row, spec, tolerance, where)
        if isinstance(outcome, Result):
            _check_context(outcome, case_id, backend, where)
        records.append(
            Record(Case(case_id, _input(row.get("input"), where), expected, row.get("metadata") or {}), outcome)
        )
    dataset = data.get("dataset")
    n_labeled = sum(r.case.expected is not None for r in records)
    if not isinstance(dataset, dict) or (dataset.get("n_cases"), dataset.get("n_labeled")) != (len(records), n_labeled):
        raise ValueError("dataset counts do not match stored case results")
    props = data.get("properties")
    run: PropertyRun | None = None
    rebuilt_props = None
    if (data["mode"] == "test") != (props is None):
        raise ValueError("'properties' must be present exactly in 'fuzz' and 'all' reports")
    if props is not None:
        run, rebuilt_props = _verify_properties(props, spec, tolerance, records, backend)
    rebuilt = assemble(
        data,
        spec,
        evaluation,
        requirements,
        warnings,
        records,
        data["mode"],
        rebuilt_props,
        run.config if run else None,
    )
    difference = _first_difference(data, rebuilt)
    if difference:
        raise ValueError(difference)
    return StoredReport(data, spec, records, run, evaluation, requirements, warnings)


def _check_context(result: Result, case_id: str, backend: Mapping[str, Any], where: str) -> None:
    if (result.case_id, result.backend, result.provider) != (case_id, backend.get("name"), backend.get("provider")):
        raise ValueError(f"{where}: result {result.case_id!r} does not match the report decision/backend context")


def _check_steps(
    name: str,
    prop: PropertyConfig,
    spec: DecisionSpec,
    fuzz: Fuzz,
    case: Case,
    row: Mapping[str, Any],
    where: str,
    transforms: dict[str, Transform],
) -> None:
    """The stored input and option presentation must be what the stored steps give: transformations
    are pure, so an edited transformed case cannot pass for what was sent."""
    steps = tuple(row.get("steps") or ())
    if not steps:
        expected: tuple[Any, Any] = (case.input, None)
    elif name == "paraphrase":
        expected = (set_text(case.input, fuzz.text_field, steps[0].get("text")), None)
    else:
        if name not in transforms:
            transforms[name] = make_transform(name, prop, spec, fuzz)
        try:
            mutation = transforms[name].apply(case.input, steps)
        except Exception as exc:  # malformed steps
            raise ValueError(f"{where}.steps cannot be applied: {exc!r}") from exc
        expected = (mutation.input, mutation.presentation)
    if (row.get("input"), _presentation_of(row.get("presentation"))) != expected:
        raise ValueError(f"{where}: input/presentation is not what its steps give")


def _verify_properties(
    props: Any, spec: DecisionSpec, tolerance: float, records: list[Record], backend: Mapping[str, Any]
) -> tuple[PropertyRun, dict[str, Any]]:
    if not isinstance(props, dict):
        raise ValueError("properties must be an object")
    fuzz = _section(Fuzz, props.get("fuzz"), "properties.fuzz")
    config = _section(Properties, props.get("config"), "properties.config")
    enabled = config.configured()
    by_id = {r.case.id: r for r in records}
    draws: dict[str, list[Outcome]] = {}
    for case_id, outcomes in (props.get("original_draws") or {}).items():
        if case_id not in by_id or not isinstance(outcomes, list):
            raise ValueError(f"properties.original_draws.{case_id}: unknown case")
        draws[case_id] = [_outcome(o, spec, tolerance, f"properties.original_draws.{case_id}") for o in outcomes]
    refs = references(records, draws)
    transforms: dict[str, Transform] = {}
    pairs: list[Pair] = []
    for index, row in enumerate(props.get("pairs") or []):
        where = f"properties.pairs.{index}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: must be an object")
        name, case_id, sample = row.get("property"), row.get("case_id"), row.get("sample")
        prop = enabled.get(str(name))
        if prop is None:
            raise ValueError(f"{where}: property {name!r} is not in properties.config")
        if case_id not in by_id or not isinstance(sample, int):
            raise ValueError(f"{where}: case {case_id!r} is not in results")
        pid = f"{name}/{case_id}/{sample}"
        outcome = _outcome(row, spec, tolerance, where)
        if isinstance(outcome, Result):
            _check_context(outcome, pid, backend, f"{where}.result")
        reference = refs[case_id]
        if isinstance(reference, CaseError) and not (isinstance(outcome, CaseError) and outcome.kind == ORIGINAL_ERROR):
            raise ValueError(f"{where}: the original case errored, so this one must too")
        _check_steps(str(name), prop, spec, fuzz, by_id[case_id].case, row, where, transforms)
        mutation = Mutation(
            tuple(row.get("steps") or ()),
            _input(row.get("input"), where),
            _presentation_of(row.get("presentation")),
            row.get("provenance") or {},
        )
        case = by_id[case_id].case
        pair = judge_pair(str(name), prop, case, sample, mutation, outcome, reference)
        reduced_row = row.get("reduced")
        if reduced_row is not None:
            if not isinstance(reduced_row, dict) or not pair.violations:
                raise ValueError(f"{where}: only failing transformed cases can have a reduced example")
            assert isinstance(reference, Result)
            _check_steps(str(name), prop, spec, fuzz, by_id[case_id].case, reduced_row, f"{where}.reduced", transforms)
            reduced_result = _result(reduced_row.get("result"), spec, tolerance, f"{where}.reduced.result")
            _check_context(reduced_result, pid, backend, f"{where}.reduced.result")
            comparison: Comparison = compare(reference, reduced_result, prop)
            reduced = Reduced(
                tuple(reduced_row.get("steps") or ()),
                _input(reduced_row.get("input"), f"{where}.reduced"),
                _presentation_of(reduced_row.get("presentation")),
                reduced_result,
                comparison,
                tuple(judge(prop, comparison)),
                _count(reduced_row.get("backend_calls"), f"{where}.reduced.backend_calls"),
            )
            pair = replace(pair, reduced=reduced)
        pairs.append(pair)
    ids = [pair.id for pair in pairs]
    if len(set(ids)) != len(ids):
        raise ValueError("properties.pairs: duplicate transformed case id")
    skipped = []
    for index, row in enumerate(props.get("skipped") or []):
        if not isinstance(row, dict) or row.get("property") not in enabled or row.get("case_id") not in by_id:
            raise ValueError(f"properties.skipped.{index}: unknown property or case")
        skipped.append(Skip(row["property"], row["case_id"], str(row.get("reason"))))
    seed = props.get("seed")
    if seed != fuzz.seed:
        raise ValueError("properties.seed does not match properties.fuzz.seed")
    run = PropertyRun(fuzz.seed, fuzz, config, pairs, skipped, draws)
    rebuilt = properties_json(run, len(records))
    # Summaries of properties the report did not run stay absent (a re-judged report).
    names = [s.get("property") for s in props.get("summaries") or [] if isinstance(s, dict)]
    rebuilt["summaries"] = [s for s in rebuilt["summaries"] if s["property"] in names]
    return run, rebuilt


def load_report(path: str | Path) -> StoredReport:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read report: {exc}") from exc
    try:
        with paused_gc():
            return verify(json.loads(text))
    except ValueError as exc:
        raise ReportError(f"{path}: not a valid DecGuard {REPORT_VERSION} report: {exc}") from exc


def rejudge(stored: StoredReport, loaded: LoadedContract) -> dict[str, Any]:
    """Re-apply a (possibly edited) contract's gates and property limits to a stored report,
    offline. Transformations are not regenerated: pairs of properties no longer enabled are
    dropped, and newly enabled properties have no pairs, so their checks fail."""
    spec = loaded.contract.spec()
    if (spec.name, spec.type, spec.labels) != (stored.spec.name, stored.spec.type, stored.spec.labels):
        raise ReportError(
            f"contract {loaded.path} describes {spec.name!r} ({spec.type}, {list(spec.labels)}) but the report is for "
            f"{stored.spec.name!r} ({stored.spec.type}, {list(stored.spec.labels)})"
        )
    contract = loaded.contract
    props = None
    run = stored.run
    if run is not None:
        enabled = contract.properties.configured()
        refs = references(stored.records, run.draws)
        by_id = stored.records_by_id()
        pairs = []
        for pair in run.pairs:
            prop = enabled.get(pair.property)
            if prop is None:
                continue
            mutation = Mutation(pair.steps, pair.input, pair.presentation, pair.provenance)
            new = judge_pair(
                pair.property, prop, by_id[pair.case_id].case, pair.sample, mutation, pair.outcome, refs[pair.case_id]
            )
            reduced = pair.reduced
            if reduced is not None and new.violations:
                reference = refs[pair.case_id]
                assert isinstance(reference, Result)
                c = compare(reference, reduced.result, prop)
                reduced = Reduced(
                    reduced.steps,
                    reduced.input,
                    reduced.presentation,
                    reduced.result,
                    c,
                    tuple(judge(prop, c)),
                    reduced.backend_calls,
                )
            else:
                reduced = None
            pairs.append(replace(new, reduced=reduced))
        ran = {s["property"] for s in stored.data["properties"]["summaries"]}
        new_run = PropertyRun(
            run.seed, run.fuzz, contract.properties, pairs, [s for s in run.skipped if s.property in enabled], run.draws
        )
        props = properties_json(new_run, len(stored.records))
        props["summaries"] = [s for s in props["summaries"] if s["property"] in ran]
    header = {
        **stored.data,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "contract": {**stored.data["contract"], "hash": loaded.hash, "path": str(loaded.path)},
    }
    return assemble(
        header,
        spec,
        contract.evaluation,
        contract.requirements,
        contract.warnings,
        stored.records,
        stored.mode,
        props,
        contract.properties if props is not None else None,
    )


__all__ = ["build_report", "flips_limited", "load_report", "rejudge", "write_report"]
