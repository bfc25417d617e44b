"""Distances between two probability distributions over the same ordered labels.

Pure functions over ``{label: probability}`` mappings, iterated in the given label order and
summed with ``math.fsum`` so the same inputs always give bit-identical results.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def distances(p: Mapping[str, float], q: Mapping[str, float], labels: Sequence[str]) -> tuple[float, float, float]:
    """(total variation distance, Jensen-Shannon divergence in bits, largest single-label change).

    TV is half the L1 distance, in [0, 1]. JS is symmetric, finite for any inputs and in [0, 1].
    One pass over the labels: this runs for every transformed case.
    """
    deltas: list[float] = []
    terms: list[float] = []
    for label in labels:
        a, b = p[label], q[label]
        deltas.append(abs(a - b))
        m = (a + b) / 2.0
        if a > 0.0:
            terms.append(0.5 * a * math.log2(a / m))
        if b > 0.0:
            terms.append(0.5 * b * math.log2(b / m))
    return min(1.0, 0.5 * math.fsum(deltas)), min(1.0, max(0.0, math.fsum(terms))), max(deltas)


def expected_level(p: Mapping[str, float], labels: Sequence[str]) -> float:
    """Sum of index times probability over an ordered scale (lowest label is 0)."""
    return math.fsum(index * p[label] for index, label in enumerate(labels))


def ranking(p: Mapping[str, float], labels: Sequence[str]) -> tuple[str, ...]:
    """Labels from most to least probable; ties keep the given order."""
    # A stable sort keeps ties in the given order, also with reverse=True.
    return tuple(sorted(labels, key=p.__getitem__, reverse=True))


def select_label(labels: Sequence[str], p: Mapping[str, float]) -> str:
    """The most probable label; ties go to the label listed first."""
    selected = labels[0]
    for label in labels:
        if p[label] > p[selected]:
            selected = label
    return selected
