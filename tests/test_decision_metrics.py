"""Golden metrics and distribution distances on hand-computed values."""

from __future__ import annotations

import math

import pytest

from otel_plumb.stats import classification as cm
from otel_plumb.stats import distribution as dist


def test_distances_by_hand() -> None:
    labels = ("a", "b")
    tv, js, max_abs = dist.distances({"a": 0.5, "b": 0.5}, {"a": 1.0, "b": 0.0}, labels)
    # JS = ½·KL(p‖m) + ½·KL(q‖m), m = (0.75, 0.25), in bits.
    expected = 0.5 * (0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(0.5 / 0.25)) + 0.5 * math.log2(1 / 0.75)
    assert (tv, max_abs) == (0.5, 0.5) and js == pytest.approx(expected) and js == pytest.approx(0.3112781)
    assert dist.distances({"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}, labels)[:2] == (1.0, 1.0)
    assert dist.expected_level({"1": 0.2, "2": 0.3, "3": 0.5}, ("1", "2", "3")) == pytest.approx(1.3)
    assert dist.ranking({"a": 0.4, "b": 0.4, "c": 0.2}, ("c", "b", "a")) == ("b", "a", "c")
    assert dist.select_label(("x", "y"), {"x": 0.5, "y": 0.5}) == "x"


def test_classification_metrics_by_hand() -> None:
    expected = ["a", "a", "b", "c"]
    predicted = ["a", "b", "b", "b"]
    scores = cm.per_label_scores(expected, predicted, ("a", "b", "c"))
    assert (scores["a"].precision, scores["a"].recall) == (1.0, 0.5)
    assert scores["b"].precision == pytest.approx(1 / 3) and scores["b"].recall == 1.0
    assert scores["c"].f1 == 0.0 and scores["c"].support == 1
    assert cm.macro_f1(expected, predicted, ("a", "b", "c", "d")) == pytest.approx((2 / 3 + 0.5 + 0.0) / 3)
    assert cm.accuracy(expected, predicted) == 0.5
    probs = [{"a": 0.9, "b": 0.1}, {"a": 0.0, "b": 1.0}]
    assert cm.nll(["a", "a"], probs) == pytest.approx((-math.log(0.9) - math.log(1e-15)) / 2)
    assert cm.brier(["a", "b"], probs) == pytest.approx((0.01 + 0.01 + 0.0) / 2)
    assert cm.ordinal_mae(["1", "3"], ["2", "1"], ("1", "2", "3")) == 1.5


def test_calibration_and_percentiles_by_hand() -> None:
    bins = cm.reliability_bins([0.05, 0.3, 0.35, 0.9, 1.0], [True, False, True, True, False], 4)
    assert [b.count for b in bins] == [1, 2, 0, 2]
    assert (bins[0].lower, bins[0].upper, bins[1].mean_confidence) == (0.0, 0.25, pytest.approx(0.325))
    # ECE: Σ n_b/N · |acc_b − conf_b| = 1/5·0.95 + 2/5·|0.5−0.325| + 2/5·|0.5−0.95|
    assert cm.expected_calibration_error(bins) == pytest.approx(0.19 + 0.07 + 0.18)
    assert cm.expected_calibration_error(cm.reliability_bins([], [], 3)) is None
    assert cm.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and cm.percentile([5.0], 95) == 5.0
    assert cm.percentile([10.0, 20.0, 30.0], 95) == pytest.approx(29.0) and cm.percentile([], 50) is None
