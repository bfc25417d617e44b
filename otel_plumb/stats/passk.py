"""pass^k: the chance that k independent trials of a case all succeed, averaged over cases."""

from __future__ import annotations

from collections.abc import Iterable
from math import comb


def pass_hat_k(counts: Iterable[tuple[int, int]], k: int) -> float | None:
    """Mean over cases of C(c, k) / C(n, k), for cases given as (successes c, trials n).

    Cases with fewer than k trials cannot say anything about k and are left out; None when
    no case has k trials.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    terms = [comb(c, k) / comb(n, k) for c, n in counts if n >= k]
    return sum(terms) / len(terms) if terms else None


def pass_hat_k_table(counts: Iterable[tuple[int, int]]) -> dict[str, float]:
    """pass^k for k = 1..(the largest n over cases), keyed by str(k) as in reports."""
    cases = list(counts)
    top = max((n for _, n in cases), default=0)
    out: dict[str, float] = {}
    for k in range(1, top + 1):
        value = pass_hat_k(cases, k)
        if value is not None:
            out[str(k)] = value
    return out
