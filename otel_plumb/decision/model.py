"""Hot-path data: cases, requests, predictions, validated results and per-case records.

Plain slotted dataclasses; ``to_json`` gives DecGuard's report field names and order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_plumb.decision.contract import DecisionSpec
from otel_plumb.decision.errors import InvalidResponse
from otel_plumb.decision.validation import redact
from otel_plumb.stats.distribution import select_label

DecisionInput = str | dict[str, Any]
DEFAULT_TOLERANCE = 1e-3


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    input: DecisionInput
    expected: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Request:
    case_id: str
    decision: DecisionSpec
    input: DecisionInput


@dataclass(frozen=True, slots=True)
class Prediction:
    """Raw backend output, keyed by the labels as shown, before validation."""

    probabilities: Mapping[str, Any]
    model: str | None = None
    model_version: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Result:
    case_id: str
    decision: str
    decision_type: str
    labels: tuple[str, ...]
    probabilities: dict[str, float]
    selected: str
    confidence: float
    backend: str
    provider: str
    model: str | None
    model_version: str | None
    latency_ms: float
    metadata: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "decision": self.decision,
            "decision_type": self.decision_type,
            "labels": list(self.labels),
            "probabilities": self.probabilities,
            "selected": self.selected,
            "confidence": self.confidence,
            "backend": self.backend,
            "provider": self.provider,
            "model": self.model,
            "model_version": self.model_version,
            "latency_ms": self.latency_ms,
            "metadata": self.metadata,
        }

    def relabel(self, case_id: str, labels: tuple[str, ...], probabilities: dict[str, float], name: str) -> Result:
        selected = select_label(labels, probabilities)
        return Result(
            case_id,
            name,
            self.decision_type,
            labels,
            probabilities,
            selected,
            probabilities[selected],
            self.backend,
            self.provider,
            self.model,
            self.model_version,
            self.latency_ms,
            self.metadata,
        )


@dataclass(frozen=True, slots=True)
class CaseError:
    kind: str
    """timeout, unavailable, invalid_response, backend_error, paraphrase_error, exception, original_error"""
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message}


Outcome = Result | CaseError


@dataclass(frozen=True, slots=True)
class Record:
    """One dataset case and what the backend made of it: a result or an error."""

    case: Case
    outcome: Outcome

    @property
    def result(self) -> Result | None:
        return self.outcome if isinstance(self.outcome, Result) else None

    @property
    def error(self) -> CaseError | None:
        return self.outcome if isinstance(self.outcome, CaseError) else None

    def to_json(self) -> dict[str, Any]:
        result, error = self.result, self.error
        return {
            "case_id": self.case.id,
            "input": self.case.input,
            "expected": self.case.expected,
            "metadata": self.case.metadata,
            "result": result.to_json() if result else None,
            "error": error.to_json() if error else None,
        }


def validate_probabilities(
    labels: tuple[str, ...], raw: Mapping[str, Any], *, tolerance: float = DEFAULT_TOLERANCE
) -> dict[str, float]:
    """``raw`` as a distribution over exactly ``labels`` in that order. Never rescaled or clipped."""
    # Fast path for the common well-formed answer; anything unusual takes the checks below.
    if type(raw) is dict and len(raw) == len(labels):
        try:
            quick: dict[str, float] = {label: raw[label] for label in labels}
        except KeyError:
            quick = {}
        in_range = quick and all(type(v) is float and 0.0 <= v <= 1.0 for v in quick.values())
        if in_range and abs(math.fsum(quick.values()) - 1.0) <= tolerance:
            return quick
    if not isinstance(raw, Mapping):
        raise InvalidResponse(f"probabilities must be an object, got {type(raw).__name__}")
    missing = [label for label in labels if label not in raw]
    extra = sorted(str(key) for key in raw if key not in labels)
    if missing or extra:
        parts = [f"missing labels {missing}"] if missing else []
        parts += [f"unknown labels {extra}"] if extra else []
        raise InvalidResponse("probabilities do not match the contract labels: " + "; ".join(parts))
    ordered: dict[str, float] = {}
    for label in labels:
        value = raw[label]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidResponse(f"probability for {label!r} is not a number: {value!r}")
        number = float(value)
        if not math.isfinite(number):
            raise InvalidResponse(f"probability for {label!r} is not finite: {number!r}")
        if number < 0.0:
            raise InvalidResponse(f"probability for {label!r} is negative: {number!r}")
        # Over 1 no distribution sums to 1 (and a sum of huge floats would overflow).
        if number > 1.0 + tolerance:
            raise InvalidResponse(f"probability for {label!r} is over 1: {number!r}")
        ordered[label] = number
    total = math.fsum(ordered.values())
    if abs(total - 1.0) > tolerance:
        raise InvalidResponse(f"probabilities sum to {total:.6g}, outside 1 ± {tolerance:g}")
    return ordered


def build_result(
    request: Request,
    prediction: Prediction,
    *,
    backend: str,
    provider: str,
    model: str | None,
    latency_ms: float,
    tolerance: float,
) -> Result:
    spec = request.decision
    probabilities = validate_probabilities(spec.labels, prediction.probabilities, tolerance=tolerance)
    selected = select_label(spec.labels, probabilities)
    return Result(
        request.case_id,
        spec.name,
        spec.type,
        spec.labels,
        probabilities,
        selected,
        probabilities[selected],
        backend,
        provider,
        prediction.model or model,
        prediction.model_version,
        latency_ms,
        redact(dict(prediction.metadata)) if prediction.metadata else {},
    )
