"""Permutation test for a difference in success rates between two groups of trials."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 20_000


@dataclass(frozen=True, slots=True)
class PermutationResult:
    difference: float  # rate(a) - rate(b)
    p_value: float
    resamples: int


def permutation_test(
    successes_a: int, n_a: int, successes_b: int, n_b: int, *, seed: int, resamples: int = DEFAULT_RESAMPLES
) -> PermutationResult:
    """Two-sided test of rate(a) == rate(b) on per-trial success (0/1).

    Shuffling the arm labels of 0/1 outcomes puts a hypergeometric number of the pooled
    successes into group a, so each resample is drawn from that distribution directly: the
    same test as shuffling trial by trial, in O(resamples) instead of O(resamples * n).
    The p-value has add-one smoothing, (1 + extreme) / (1 + resamples), so it is never 0.
    """
    if n_a <= 0 or n_b <= 0:
        raise ValueError("both groups need at least one trial")
    if resamples < 1:
        raise ValueError("resamples must be positive")
    observed = successes_a / n_a - successes_b / n_b
    pooled = successes_a + successes_b
    total = n_a + n_b
    rng = np.random.default_rng(seed)
    in_a = rng.hypergeometric(pooled, total - pooled, n_a, size=resamples)
    diffs = in_a / n_a - (pooled - in_a) / n_b
    # A small tolerance so ties with the observed difference count as extreme (float noise).
    extreme = int(np.count_nonzero(np.abs(diffs) >= abs(observed) - 1e-12))
    return PermutationResult(observed, (1 + extreme) / (1 + resamples), resamples)
