"""Compare a decision before and after a transformation and judge it against a property."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from otel_plumb.decision.contract import Monotonic, PropertyConfig
from otel_plumb.decision.model import Result
from otel_plumb.stats import distribution as dist


@dataclass(frozen=True, slots=True)
class Comparison:
    """For inversion the transformed distribution is compared with its two labels swapped, so
    every field measures the distance from the expected (inverted) answer."""

    tv_distance: float
    js_divergence: float
    max_abs_delta: float
    confidence_delta: float
    selected_before: str
    selected_after: str
    flipped: bool
    """The selected label changed (monotonic: moved against the direction)."""
    rank_changed: bool
    level_delta: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "tv_distance": self.tv_distance,
            "js_divergence": self.js_divergence,
            "max_abs_delta": self.max_abs_delta,
            "confidence_delta": self.confidence_delta,
            "selected_before": self.selected_before,
            "selected_after": self.selected_after,
            "flipped": self.flipped,
            "rank_changed": self.rank_changed,
            "level_delta": self.level_delta,
        }


def compare(before: Result, after: Result, config: PropertyConfig) -> Comparison:
    labels = before.labels
    p = before.probabilities
    if config.relation == "swapped":
        first, second = labels
        swap = {first: second, second: first}
        q = {label: after.probabilities[swap[label]] for label in labels}
    else:
        q = after.probabilities
    selected_after = dist.select_label(labels, q)
    level_delta = None
    if before.decision_type == "score":
        level_delta = dist.expected_level(q, labels) - dist.expected_level(p, labels)
    if isinstance(config, Monotonic):
        moved = labels.index(selected_after) - labels.index(before.selected)
        flipped = moved < 0 if config.direction == "increasing" else moved > 0
    else:
        flipped = selected_after != before.selected
    tv, js, max_abs = dist.distances(p, q, labels)
    return Comparison(
        tv_distance=tv,
        js_divergence=js,
        max_abs_delta=max_abs,
        confidence_delta=q[selected_after] - p[before.selected],
        selected_before=before.selected,
        selected_after=selected_after,
        flipped=flipped,
        rank_changed=dist.ranking(p, labels) != dist.ranking(q, labels),
        level_delta=level_delta,
    )


_VALUES: dict[str, tuple[str, Callable[[Comparison], float]]] = {
    "max_tv_distance": ("tv_distance", lambda c: c.tv_distance),
    "max_js_divergence": ("js_divergence", lambda c: c.js_divergence),
    "max_abs_delta": ("max_abs_delta", lambda c: c.max_abs_delta),
    "max_confidence_delta": ("confidence_delta", lambda c: abs(c.confidence_delta)),
}


def tolerance_violations(config: PropertyConfig, c: Comparison) -> list[str]:
    """Per-case limits this comparison breaks."""
    if isinstance(config, Monotonic):
        assert c.level_delta is not None
        sign = 1.0 if config.direction == "increasing" else -1.0
        if sign * c.level_delta < -config.max_level_decrease:
            return [
                f"expected level moved {c.level_delta:+.4g} against '{config.direction}' "
                f"(allowed {config.max_level_decrease:g})"
            ]
        return []
    out = []
    for key, limit in config.limits:
        metric, value_of = _VALUES[key]
        value = value_of(c)
        if value > limit:
            out.append(f"{metric} {value:.4g} > {limit:g}")
    return out


def flips_limited(config: PropertyConfig) -> bool:
    return config.max_flip_rate is not None or config.max_flip_rate_upper is not None


def judge(config: PropertyConfig, c: Comparison) -> list[str]:
    """Every violation: the broken per-case limits, then the flip when flips are limited."""
    violations = tolerance_violations(config, c)
    if flips_limited(config) and c.flipped:
        before, after = c.selected_before, c.selected_after
        if isinstance(config, Monotonic):
            violations.append(f"selected level moved against '{config.direction}': {before} -> {after}")
        elif config.relation == "swapped":
            violations.append(f"answer did not invert: {before!r} was selected before and after negation")
        else:
            violations.append(f"selected label changed: {before!r} -> {after!r}")
    return violations
