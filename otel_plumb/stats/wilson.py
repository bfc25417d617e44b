"""Wilson score interval: honest bounds for a success rate, including at 0 and n."""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval; (0.0, 1.0) when n is 0 (nothing is known)."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..{n}, got {successes}")
    p = successes / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # At 0 and n the bound is exactly 0 or 1; elsewhere clamp float noise.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


@dataclass(frozen=True, slots=True)
class Rate:
    successes: int
    n: int
    rate: float | None
    lo: float
    hi: float

    def as_dict(self) -> dict[str, float | int | None]:
        return {"successes": self.successes, "n": self.n, "rate": self.rate, "lo": self.lo, "hi": self.hi}


def rate(successes: int, n: int) -> Rate:
    lo, hi = wilson_interval(successes, n)
    return Rate(successes, n, successes / n if n else None, lo, hi)
