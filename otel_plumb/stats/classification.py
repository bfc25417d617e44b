"""Golden-set metrics for classification decisions: accuracy, per-label F1, NLL, Brier,
calibration (ECE with a reliability table), percentiles and ordinal error.

Conventions: undefined precision/recall count as 0 (scikit-learn), NLL is natural-log with
probabilities floored at 1e-15, ECE uses equal-width bins over top-label confidence where bin
i covers (i/n, (i+1)/n] and the first bin also holds 0, percentiles interpolate linearly
between closest ranks (NumPy's default).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NLL_EPSILON = 1e-15


def mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def accuracy(expected: Sequence[str], predicted: Sequence[str]) -> float | None:
    return mean([float(e == p) for e, p in zip(expected, predicted, strict=True)])


@dataclass(frozen=True, slots=True)
class LabelScores:
    precision: float
    recall: float
    f1: float
    support: int


def per_label_scores(
    expected: Sequence[str], predicted: Sequence[str], labels: Sequence[str]
) -> dict[str, LabelScores]:
    tp: dict[str, int] = dict.fromkeys(labels, 0)
    n_pred: dict[str, int] = dict.fromkeys(labels, 0)
    support: dict[str, int] = dict.fromkeys(labels, 0)
    for e, p in zip(expected, predicted, strict=True):
        if p in n_pred:
            n_pred[p] += 1
        if e in support:
            support[e] += 1
            if e == p:
                tp[e] += 1
    scores = {}
    for label in labels:
        precision = tp[label] / n_pred[label] if n_pred[label] else 0.0
        recall = tp[label] / support[label] if support[label] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        scores[label] = LabelScores(precision, recall, f1, support[label])
    return scores


def macro_f1(expected: Sequence[str], predicted: Sequence[str], labels: Sequence[str]) -> float | None:
    """Unweighted mean F1 over the labels occurring in ``expected`` or ``predicted``."""
    seen = set(expected) | set(predicted)
    present = [label for label in labels if label in seen]
    if not present:
        return None
    scores = per_label_scores(expected, predicted, present)
    return math.fsum(scores[label].f1 for label in present) / len(present)


def nll(expected: Sequence[str], probabilities: Sequence[Mapping[str, float]]) -> float | None:
    return mean([-math.log(max(p[e], NLL_EPSILON)) for e, p in zip(expected, probabilities, strict=True)])


def brier(expected: Sequence[str], probabilities: Sequence[Mapping[str, float]]) -> float | None:
    """Multi-class Brier score in [0, 2]."""
    return mean(
        [
            math.fsum((value - (label == e)) ** 2 for label, value in p.items())
            for e, p in zip(expected, probabilities, strict=True)
        ]
    )


@dataclass(frozen=True, slots=True)
class CalibrationBin:
    lower: float
    upper: float
    count: int
    mean_confidence: float | None
    accuracy: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "lower": self.lower,
            "upper": self.upper,
            "count": self.count,
            "mean_confidence": self.mean_confidence,
            "accuracy": self.accuracy,
        }


def reliability_bins(confidences: Sequence[float], correct: Sequence[bool], n_bins: int) -> list[CalibrationBin]:
    edges = [(i + 1) / n_bins for i in range(n_bins)]
    members: list[list[int]] = [[] for _ in range(n_bins)]
    for index, confidence in enumerate(confidences):
        members[min(bisect_left(edges, confidence), n_bins - 1)].append(index)
    return [
        CalibrationBin(
            lower=i / n_bins,
            upper=edges[i],
            count=len(indices),
            mean_confidence=mean([confidences[j] for j in indices]),
            accuracy=mean([float(correct[j]) for j in indices]),
        )
        for i, indices in enumerate(members)
    ]


def expected_calibration_error(bins: Sequence[CalibrationBin]) -> float | None:
    total = sum(b.count for b in bins)
    if total == 0:
        return None
    return math.fsum(
        b.count / total * abs(b.accuracy - b.mean_confidence)
        for b in bins
        if b.count and b.accuracy is not None and b.mean_confidence is not None
    )


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def ordinal_mae(expected: Sequence[str], predicted: Sequence[str], levels: Sequence[str]) -> float | None:
    rank = {level: i for i, level in enumerate(levels)}
    return mean([float(abs(rank[p] - rank[e])) for e, p in zip(expected, predicted, strict=True)])
