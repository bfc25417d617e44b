"""Offline post-deployment checks (DecGuard's ``check``): collected decisions, optional
baseline (records or a previous check report), drift, metadata segments and gates."""

from __future__ import annotations

import hashlib
import json
import math
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator

from otel_plumb.decision import DECGUARD_COMPAT_VERSION
from otel_plumb.decision.contract import (
    DecisionSpec,
    Evaluation,
    LoadedContract,
    PolicyAction,
    Production,
    ProductionGates,
    SegmentGates,
    dump_section,
    load_contract,
)
from otel_plumb.decision.dataset import read_data
from otel_plumb.decision.errors import DatasetError, InvalidResponse, ReportError
from otel_plumb.decision.model import DecisionInput, validate_probabilities
from otel_plumb.decision.render import check_lines, num
from otel_plumb.decision.report import STATUS_EXIT, make_check, overall_status
from otel_plumb.decision.validation import Strict, format_errors, unique_keys
from otel_plumb.stats import classification as cm
from otel_plumb.stats.distribution import select_label

NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class ProductionRecord(Strict):
    id: str = Field(min_length=1)
    timestamp: str | None = None
    decision: str
    input: DecisionInput | None = None
    probabilities: dict[str, float]
    selected: str
    confidence: Probability
    backend: str | None = None
    model: str | None = None
    model_version: str | None = None
    outcome: str | None = None
    outcome_correct: bool | None = None
    latency_ms: NonNegative | None = None
    cost: NonNegative | None = None
    action: PolicyAction | None = None
    fallback: bool | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("selected", "outcome", mode="before")
    @classmethod
    def _number_label(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("timestamp")
    @classmethod
    def _iso(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValueError("must be an ISO 8601 timestamp") from exc
        if parsed.tzinfo is None:
            raise ValueError("must include a timezone")
        return value


def normalize_record(
    record: ProductionRecord, spec: DecisionSpec, *, tolerance: float, source: str
) -> ProductionRecord:
    if record.decision != spec.name:
        raise DatasetError(f"{source}: decision {record.decision!r} does not match contract decision {spec.name!r}")
    try:
        probabilities = validate_probabilities(spec.labels, record.probabilities, tolerance=tolerance)
    except InvalidResponse as exc:
        raise DatasetError(f"{source}: {exc}") from exc
    selected = select_label(spec.labels, probabilities)
    if record.selected != selected:
        raise DatasetError(f"{source}: selected {record.selected!r} is not the most probable label {selected!r}")
    if record.confidence != probabilities[selected]:
        raise DatasetError(
            f"{source}: confidence {record.confidence!r} does not equal the probability of {selected!r} "
            f"({probabilities[selected]!r})"
        )
    if record.outcome is not None and record.outcome not in spec.labels:
        raise DatasetError(
            f"{source}: outcome {record.outcome!r} is not one of the contract labels {list(spec.labels)}"
        )
    derived = record.outcome == selected if record.outcome is not None else None
    if derived is not None and record.outcome_correct is not None and record.outcome_correct is not derived:
        raise DatasetError(f"{source}: outcome_correct {record.outcome_correct!r} disagrees with selected/outcome")
    if record.action == "fallback" and record.fallback is False:
        raise DatasetError(f"{source}: action 'fallback' conflicts with fallback=false")
    if record.action not in (None, "fallback") and record.fallback is True:
        raise DatasetError(f"{source}: fallback=true conflicts with action {record.action!r}")
    correct = derived if record.outcome_correct is None else record.outcome_correct
    return record.model_copy(update={"probabilities": probabilities, "outcome_correct": correct})


def load_records(path: Path, spec: DecisionSpec, *, tolerance: float) -> tuple[str, list[ProductionRecord]]:
    raw, text = read_data(path, "production dataset")
    suffix = path.suffix.lower()
    items: list[tuple[str, Any]] = []
    if suffix == ".jsonl":
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append((f"line {lineno}", json.loads(line, object_pairs_hook=unique_keys)))
                except ValueError as exc:
                    raise DatasetError(f"{path}: line {lineno}: invalid JSON: {exc}") from exc
    elif suffix == ".json":
        try:
            value = json.loads(text, object_pairs_hook=unique_keys)
        except ValueError as exc:
            raise DatasetError(f"{path}: invalid JSON: {exc}") from exc
        if not isinstance(value, list):
            raise DatasetError(f"{path}: a JSON production dataset must be a list of records")
        items = [(f"record {i}", item) for i, item in enumerate(value, 1)]
    else:
        raise DatasetError(f"{path}: unsupported production dataset format (use .jsonl or .json)")
    records: list[ProductionRecord] = []
    seen: dict[str, str] = {}
    for position, (location, item) in enumerate(items, 1):
        if isinstance(item, dict):
            item = {"id": f"record-{position}", **item}
            p, s = item.get("probabilities"), item.get("selected")
            if "confidence" not in item and isinstance(p, dict) and s in p:
                item["confidence"] = p[s]
        try:
            parsed = ProductionRecord.model_validate(item)
        except ValidationError as exc:
            raise DatasetError(f"{path}: {location}: invalid production record:\n{format_errors(exc)}") from exc
        record = normalize_record(parsed, spec, tolerance=tolerance, source=f"{path}: {location}")
        if record.id in seen:
            raise DatasetError(f"{path}: {location}: duplicate record id {record.id!r} (first at {seen[record.id]})")
        seen[record.id] = location
        records.append(record)
    if not records:
        raise DatasetError(f"{path}: production dataset contains no records")
    return "sha256:" + hashlib.sha256(raw).hexdigest(), records


def _histogram(values: Sequence[float], n_bins: int) -> list[int]:
    counts = [0] * n_bins
    edges = [(i + 1) / n_bins for i in range(n_bins)]
    for value in values:
        counts[min(bisect_left(edges, value), n_bins - 1)] += 1
    return counts


def _aggregate(values: list[float], *, total: bool = False) -> dict[str, Any]:
    return {
        "n": len(values),
        "mean": cm.mean(values),
        "p95": cm.percentile(values, 95),
        "total": math.fsum(values) if values and total else None,
    }


def compute_production_metrics(records: Sequence[ProductionRecord], evaluation: Evaluation) -> dict[str, Any]:
    known = [r for r in records if r.outcome_correct is not None]
    correct = [bool(r.outcome_correct) for r in known]
    with_outcome = [r for r in records if r.outcome is not None]
    confidences = [r.confidence for r in records]
    bins = cm.reliability_bins([r.confidence for r in known], correct, evaluation.calibration_bins)
    actions = [r.action for r in records if r.action is not None]
    fallback_known = [r for r in records if r.fallback is not None or r.action is not None]
    latencies = [r.latency_ms for r in records if r.latency_ms is not None]
    costs = [r.cost for r in records if r.cost is not None]
    accuracy = cm.mean([float(v) for v in correct])
    threshold = evaluation.confidence_threshold
    outcomes = [r.outcome for r in with_outcome if r.outcome is not None]
    return {
        "counts": {
            "total": len(records),
            "with_outcome": len(with_outcome),
            "with_correctness": len(known),
            "with_action": len(actions),
            "with_fallback": len(fallback_known),
            "with_latency": len(latencies),
            "with_cost": len(costs),
        },
        "outcomes": {"n": len(known), "accuracy": accuracy, "error_rate": None if accuracy is None else 1.0 - accuracy},
        "calibration": {
            "n": len(known),
            "ece": cm.expected_calibration_error(bins),
            "n_label_outcomes": len(with_outcome),
            "brier": cm.brier(outcomes, [r.probabilities for r in with_outcome]),
            "nll": cm.nll(outcomes, [r.probabilities for r in with_outcome]),
            "bins": evaluation.calibration_bins,
            "reliability": [b.as_dict() for b in bins],
        },
        "confidence": {
            "n": len(confidences),
            "mean": cm.mean(confidences),
            "p50": cm.percentile(confidences, 50),
            "p95": cm.percentile(confidences, 95),
            "histogram": _histogram(confidences, evaluation.calibration_bins),
        },
        "threshold": None
        if threshold is None
        else {
            "threshold": threshold,
            "n": len(records),
            "coverage": cm.mean([float(r.confidence >= threshold) for r in records]),
        },
        "routing": {
            "n_actions": len(actions),
            "abstention_rate": cm.mean([float(a == "abstain") for a in actions]),
            "human_review_rate": cm.mean([float(a == "human_review") for a in actions]),
            "n_fallback": len(fallback_known),
            "fallback_rate": cm.mean([float(r.fallback is True or r.action == "fallback") for r in fallback_known]),
        },
        "latency_ms": _aggregate(latencies),
        "cost": _aggregate(costs, total=True),
    }


GATES = {
    "min_accuracy": ("accuracy", ">="),
    "max_error_rate": ("error_rate", "<="),
    "max_ece": ("ece", "<="),
    "max_brier": ("brier", "<="),
    "max_nll": ("nll", "<="),
    "min_threshold_coverage": ("threshold_coverage", ">="),
    "max_abstention_rate": ("abstention_rate", "<="),
    "max_fallback_rate": ("fallback_rate", "<="),
    "max_confidence_tv_distance": ("confidence_tv_distance", "<="),
    "max_accuracy_drop": ("accuracy_drop", "<="),
    "max_ece_increase": ("ece_increase", "<="),
}
DRIFT_METRICS = ("confidence_tv_distance", "accuracy_drop", "ece_increase")


def _values(m: Mapping[str, Any], drift: Mapping[str, Any]) -> dict[str, float | None]:
    return {
        "accuracy": m["outcomes"]["accuracy"],
        "error_rate": m["outcomes"]["error_rate"],
        "ece": m["calibration"]["ece"],
        "brier": m["calibration"]["brier"],
        "nll": m["calibration"]["nll"],
        "threshold_coverage": m["threshold"]["coverage"] if m["threshold"] else None,
        "abstention_rate": m["routing"]["abstention_rate"],
        "fallback_rate": m["routing"]["fallback_rate"],
        **{k: drift[k] for k in DRIFT_METRICS},
    }


def compute_drift(current: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> dict[str, float | None]:
    if baseline is None:
        return {
            "confidence_mean_delta": None,
            "confidence_tv_distance": None,
            "accuracy_drop": None,
            "ece_increase": None,
        }
    left, right = current["confidence"]["histogram"], baseline["confidence"]["histogram"]
    if len(left) != len(right):
        raise ReportError("baseline and current confidence histograms use different bin counts")
    lt, rt = sum(left), sum(right)
    tv = 0.5 * math.fsum(abs(a / lt - b / rt) for a, b in zip(left, right, strict=True)) if lt and rt else None

    def minus(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a - b

    return {
        "confidence_mean_delta": minus(current["confidence"]["mean"], baseline["confidence"]["mean"]),
        "confidence_tv_distance": tv,
        "accuracy_drop": minus(baseline["outcomes"]["accuracy"], current["outcomes"]["accuracy"]),
        "ece_increase": minus(current["calibration"]["ece"], baseline["calibration"]["ece"]),
    }


def _section_checks(
    settings: ProductionGates | SegmentGates,
    metrics: Mapping[str, Any],
    drift: Mapping[str, Any],
    *,
    level: str,
    prefix: str = "",
) -> list[dict[str, Any]]:
    values = _values(metrics, drift)
    checks = []
    for gate, threshold in settings.configured().items():
        metric, comparison = GATES[gate]
        missing = (
            "no baseline was provided or the metric is unavailable"
            if metric in DRIFT_METRICS
            else "no eligible production records"
        )
        checks.append(
            make_check(
                prefix + gate, prefix + metric, comparison, threshold, values[metric], level=level, missing=missing
            )
        )
    return checks


def _segment_value(record: ProductionRecord, key: str) -> Any:
    value = record.metadata.get(key)
    if isinstance(value, float) and not math.isfinite(value):
        raise DatasetError(f"record {record.id!r}: metadata.{key} must be finite")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise DatasetError(
        f"record {record.id!r}: metadata.{key} must be a string, number, boolean or null when used as a segment"
    )


def build_segments(
    records: Sequence[ProductionRecord], config: Production, evaluation: Evaluation
) -> list[dict[str, Any]]:
    out = []
    no_drift = compute_drift({}, None)
    for key in config.segments:
        groups: dict[tuple[str, str], list[ProductionRecord]] = defaultdict(list)
        values: dict[tuple[str, str], Any] = {}
        for record in records:
            value = _segment_value(record, key)
            identity = (type(value).__name__, repr(value))
            values[identity] = value
            groups[identity].append(record)
        for identity, members in sorted(groups.items()):
            value = values[identity]
            metrics = compute_production_metrics(members, evaluation)
            prefix = f"segment[{key}={'<missing>' if value is None else value}]."
            checks = _section_checks(config.segment_requirements, metrics, no_drift, level="requirement", prefix=prefix)
            checks += _section_checks(config.segment_warnings, metrics, no_drift, level="warning", prefix=prefix)
            out.append(
                {"key": key, "value": value, "metrics": metrics, "checks": checks, "status": overall_status(checks)}
            )
    return out


def _baseline(loaded: LoadedContract, path: Path) -> dict[str, Any]:
    contract, spec = loaded.contract, loaded.contract.spec()
    tolerance = contract.evaluation.probability_tolerance
    if path.suffix.lower() == ".json":
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            value = None
        if isinstance(value, dict) and "check_version" in value:
            info = value.get("contract") or {}
            if (info.get("name"), info.get("type"), tuple(info.get("labels") or ())) != (
                spec.name,
                spec.type,
                spec.labels,
            ):
                raise ReportError(f"baseline report {path} is for {info.get('name')!r}, not {spec.name!r}")
            try:
                records = [
                    normalize_record(
                        ProductionRecord.model_validate(r), spec, tolerance=tolerance, source=f"{path}: records[{i}]"
                    )
                    for i, r in enumerate(value["records"])
                ]
            except (ValidationError, KeyError, TypeError) as exc:
                raise ReportError(f"{path}: not a valid production report: {exc}") from exc
            return {
                "source": "report",
                "path": str(path),
                "hash": "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest(),
                "n_records": len(records),
                "metrics": compute_production_metrics(records, contract.evaluation),
            }
    digest, records = load_records(path, spec, tolerance=tolerance)
    return {
        "source": "dataset",
        "path": str(path),
        "hash": digest,
        "n_records": len(records),
        "metrics": compute_production_metrics(records, contract.evaluation),
    }


def run_check(contract: str | Path, *, dataset: str | Path, baseline: str | Path | None = None) -> dict[str, Any]:
    """Analyse production records without calling any backend or service."""
    loaded = load_contract(contract)
    c, spec = loaded.contract, loaded.contract.spec()
    digest, records = load_records(Path(dataset), spec, tolerance=c.evaluation.probability_tolerance)
    base = _baseline(loaded, Path(baseline)) if baseline is not None else None
    metrics = compute_production_metrics(records, c.evaluation)
    drift = compute_drift(metrics, base["metrics"] if base else None)
    segments = build_segments(records, c.production, c.evaluation)
    checks = _section_checks(c.production.requirements, metrics, drift, level="requirement")
    checks += _section_checks(c.production.warnings, metrics, drift, level="warning")
    checks += [check for segment in segments for check in segment["checks"]]
    status = overall_status(checks)
    return {
        "check_version": "0.1",
        "decguard_version": DECGUARD_COMPAT_VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "status": status,
        "exit_code": STATUS_EXIT[status],
        "contract": {
            "name": spec.name,
            "type": spec.type,
            "labels": list(spec.labels),
            "schema_version": c.schema_version,
            "hash": loaded.hash,
            "path": str(loaded.path),
        },
        "evaluation": dump_section(c.evaluation),
        "config": dump_section(c.production),
        "dataset": {
            "path": str(dataset),
            "hash": digest,
            "n_records": len(records),
            "n_outcomes": sum(r.outcome is not None for r in records),
            "n_correctness": sum(r.outcome_correct is not None for r in records),
        },
        "baseline": base,
        "metrics": metrics,
        "drift": drift,
        "segments": segments,
        "checks": checks,
        "records": [r.model_dump(mode="json") for r in records],
    }


def render_production(report: Mapping[str, Any]) -> str:
    m = report["metrics"]
    lines = [
        f"otel-plumb decision · {report['contract']['name']} ({report['contract']['type']})"
        f" · {report['status'].upper()}",
        "",
        f"  Records       {m['counts']['total']} total · {m['counts']['with_correctness']} with correctness · "
        f"{m['counts']['with_outcome']} with label outcome",
        f"  Outcomes      accuracy {num(m['outcomes']['accuracy'])} · error {num(m['outcomes']['error_rate'])}",
        f"  Calibration   ECE {num(m['calibration']['ece'])} · Brier {num(m['calibration']['brier'])} · "
        f"NLL {num(m['calibration']['nll'])}",
        f"  Confidence    mean {num(m['confidence']['mean'])} · p50 {num(m['confidence']['p50'])} · "
        f"p95 {num(m['confidence']['p95'])}",
    ]
    if m["threshold"] is not None:
        lines.append(
            f"  Threshold     confidence >= {m['threshold']['threshold']:g}: coverage {num(m['threshold']['coverage'])}"
        )
    r = m["routing"]
    lines.append(
        f"  Routing       abstain {num(r['abstention_rate'])} · fallback {num(r['fallback_rate'])} · "
        f"review {num(r['human_review_rate'])}"
    )
    if report["baseline"] is not None:
        d = report["drift"]
        lines += [
            "",
            f"  Baseline      {report['baseline']['source']} · {report['baseline']['n_records']} records",
            f"  Drift         confidence TV {num(d['confidence_tv_distance'])} · accuracy drop "
            f"{num(d['accuracy_drop'])} · ECE increase {num(d['ece_increase'])}",
        ]
    if report["segments"]:
        lines += ["", "  Segments"]
    for s in report["segments"]:
        lines.append(
            f"    {s['status'].upper():<4} {s['key']}={'<missing>' if s['value'] is None else s['value']} · "
            f"{s['metrics']['counts']['total']} records · accuracy {num(s['metrics']['outcomes']['accuracy'])}"
        )
    if report["checks"]:
        lines += ["", "  Checks", *check_lines(report["checks"], 48)]
    verdict = {
        "pass": "PASS: all post-deployment gates hold",
        "warn": "WARN: requirements hold, some warning gates do not",
        "fail": "FAIL: at least one post-deployment requirement does not hold",
    }[report["status"]]
    return "\n".join([*lines, "", verdict])
