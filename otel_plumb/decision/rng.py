"""The fuzzing random stream: integers from ``sha256(key || counter)``.

``random.Random`` only promises reproducible ``random()`` across Python versions, not
``shuffle``/``sample``. This stream is keyed by (seed, property, case id), the same bytes as
DecGuard's, so a seed gives the same transformations in both and on any Python.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


class Rng:
    __slots__ = ("_counter", "_key")

    def __init__(self, *parts: object) -> None:
        self._key = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
        self._counter = 0

    def below(self, n: int) -> int:
        """An integer in [0, n) from a 128-bit draw (negligible modulo bias)."""
        if n <= 0:
            raise ValueError("n must be positive")
        block = hashlib.sha256(self._key + self._counter.to_bytes(8, "big")).digest()
        self._counter += 1
        return int.from_bytes(block[:16], "big") % n

    def choice(self, items: Sequence[T]) -> T:
        return items[self.below(len(items))]

    def sample(self, items: Sequence[T], k: int) -> list[T]:
        """``k`` distinct items in draw order (partial Fisher-Yates)."""
        pool = list(items)
        k = min(k, len(pool))
        for i in range(k):
            j = i + self.below(len(pool) - i)
            pool[i], pool[j] = pool[j], pool[i]
        return pool[:k]

    def shuffled(self, items: Sequence[T]) -> list[T]:
        return self.sample(items, len(items))


def case_rng(seed: int, prop: str, case_id: str) -> Rng:
    """Each (property, case) has its own stream: adding cases or properties changes no other."""
    return Rng(seed, prop, case_id)
