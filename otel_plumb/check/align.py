"""Needleman-Wunsch alignment of two tool paths, so a divergence is reported where it happens.

Positional comparison turns one omitted step into a cascade of mismatches at every later
index. Global alignment with match +2, mismatch -1, gap -2 resolves one omission as one gap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

MATCH, MISMATCH, GAP = 2, -1, -2

T = TypeVar("T")
OpKind = Literal["match", "substitute", "skipped", "extra"]


@dataclass(frozen=True, slots=True)
class AlignedPair:
    """One column of the alignment: ``expected`` and/or ``got`` positions (None for a gap).

    ``skipped``: the expected step is missing; ``extra``: a step the expected path does not
    have; ``substitute``: a different step in its place; ``match``: the same step.
    """

    kind: OpKind
    expected: int | None
    got: int | None


def align(
    expected: Sequence[T],
    got: Sequence[T],
    same: Callable[[T, T], bool] = lambda a, b: a == b,
    score_pair: Callable[[T, T], int] | None = None,
) -> list[AlignedPair]:
    """``score_pair`` (optional) scores a column instead of ``same`` (positive: a match, e.g. +1
    for the same tool that failed on one side only); the default is +2 / -1."""
    pair = score_pair or (lambda a, b: MATCH if same(a, b) else MISMATCH)
    n, m = len(expected), len(got)
    # score[i][j]: best score aligning expected[:i] with got[:j]
    score = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        score[i][0] = i * GAP
    for j in range(1, m + 1):
        score[0][j] = j * GAP
    for i in range(1, n + 1):
        row, prev = score[i], score[i - 1]
        e = expected[i - 1]
        for j in range(1, m + 1):
            diag = prev[j - 1] + pair(e, got[j - 1])
            up = prev[j] + GAP
            left = row[j - 1] + GAP
            row[j] = max(diag, up, left)
    out: list[AlignedPair] = []
    i, j = n, m
    while i > 0 or j > 0:
        if i > 0 and j > 0:
            column = pair(expected[i - 1], got[j - 1])
            if score[i][j] == score[i - 1][j - 1] + column:
                out.append(AlignedPair("match" if column > 0 else "substitute", i - 1, j - 1))
                i, j = i - 1, j - 1
                continue
        if i > 0 and score[i][j] == score[i - 1][j] + GAP:
            out.append(AlignedPair("skipped", i - 1, None))
            i -= 1
        else:
            out.append(AlignedPair("extra", None, j - 1))
            j -= 1
    out.reverse()
    return out
