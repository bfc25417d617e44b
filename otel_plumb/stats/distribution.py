"""Distances between two probability distributions over the same ordered labels.

Pure functions over ``{label: probability}`` mappings, iterated in the given label order and
summed with ``math.fsum`` so the same inputs always give bit-identical results.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def tv_distance(p: Mapping[str, float], q: Mapping[str, float], labels: Sequence[str]) -> float:
    """Total variation distance, half the L1 distance, in [0, 1]."""
    return min(1.0, 0.5 * math.fsum(abs(p[label] - q[label]) for label in labels))


def max_abs_delta(p: Mapping[str, float], q: Mapping[str, float], labels: Sequence[str]) -> float:
    """Largest change of any single label's probability."""
    return max(abs(p[label] - q[label]) for label in labels)


def js_divergence(p: Mapping[str, float], q: Mapping[str, float], labels: Sequence[str]) -> float:
    """Jensen-Shannon divergence in bits, in [0, 1]: symmetric and finite for any inputs."""
    terms: list[float] = []
    for label in labels:
        a, b = p[label], q[label]
        m = (a + b) / 2.0
        if a > 0.0:
            terms.append(0.5 * a * math.log2(a / m))
        if b > 0.0:
            terms.append(0.5 * b * math.log2(b / m))
    return min(1.0, max(0.0, math.fsum(terms)))


def expected_level(p: Mapping[str, float], labels: Sequence[str]) -> float:
    """Sum of index times probability over an ordered scale (lowest label is 0)."""
    return math.fsum(index * p[label] for index, label in enumerate(labels))


def ranking(p: Mapping[str, float], labels: Sequence[str]) -> tuple[str, ...]:
    """Labels from most to least probable; ties keep the given order."""
    position = {label: index for index, label in enumerate(labels)}
    return tuple(sorted(labels, key=lambda label: (-p[label], position[label])))


def select_label(labels: Sequence[str], p: Mapping[str, float]) -> str:
    """The most probable label; ties go to the label listed first."""
    selected = labels[0]
    for label in labels:
        if p[label] > p[selected]:
            selected = label
    return selected
