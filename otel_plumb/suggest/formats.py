"""Argument formats: observed strings generalised into one anchored, linear-time (RE2) regex.

A value is cut into maximal runs of one character class (ASCII upper case, lower case, digits,
whitespace, other letters) and single other characters: ``"INV-1001"`` is ``A - 9``, its
*shape*. Each shape keeps, per run, the shortest and longest run seen and the run's text while
it has been the same in every value. A regex for a set of shapes is the alternation of one
pattern per shape: a run whose text never varied (over at least ``LITERAL_AFTER`` distinct
values) is written literally, any other as its class with the lengths seen, so
``INV-1001, INV-1002, INV-1003`` give ``^INV-[0-9]{4}$``. Memory per argument is bounded by
the number of shapes kept (``max_shapes``); free text, with many shapes or runs, gets no format.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# Maximal runs of one class; any other character is a run of its own.
_RUN = re.compile(r"[A-Z]+|[a-z]+|[0-9]+|\s+|[^\W\d_a-zA-Z]+|.", re.S)
# Disjoint classes, so a value of another shape does not match: "other letters" are non-ASCII.
_CLASS_REGEX = {"A": "[A-Z]", "a": "[a-z]", "9": "[0-9]", "s": r"\s", "L": r"[^\x00-\x7f]"}
# A shape with more runs than this is free text, not a format.
MAX_RUNS = 12
# Longer values are not formats (free text, payloads).
MAX_TEXT = 200
# A run's constant text is written literally only once this many distinct values agreed on it:
# two values that happen to share a word say little.
LITERAL_AFTER = 3
# RE2 refuses repetition counts over 1,000.
_MAX_REPEAT = 1_000
# Shapes that never match: values that are not text, too long, or have too many runs.
NOT_TEXT, UNSHAPED = ("<not text>",), ("<no shape>",)

Shape = tuple[str, ...]


def _class(run: str) -> str:
    c = run[0]
    if "A" <= c <= "Z":
        return "A"
    if "a" <= c <= "z":
        return "a"
    if "0" <= c <= "9":
        return "9"
    if c.isspace():
        return "s"
    if len(run) > 1 or c.isalpha():
        return "L"
    return "=" + c


def runs(text: str) -> list[str] | None:
    """The runs of ``text``, or None when it is too long or has too many runs to be a format."""
    if not text or len(text) > MAX_TEXT:
        return None
    found = _RUN.findall(text)
    return found if len(found) <= MAX_RUNS else None


class ShapeStats:
    """What the values of one shape had in common."""

    __slots__ = ("high", "low", "text")

    def __init__(self, parts: Sequence[str]) -> None:
        self.low = [len(p) for p in parts]
        self.high = list(self.low)
        self.text: list[str | None] = list(parts)

    def add(self, parts: Sequence[str]) -> None:
        for i, p in enumerate(parts):
            n = len(p)
            if n < self.low[i]:
                self.low[i] = n
            elif n > self.high[i]:
                self.high[i] = n
            if self.text[i] is not None and self.text[i] != p:
                self.text[i] = None

    def pattern(self, shape: Shape, literal: bool) -> str:
        out = []
        for i, cls in enumerate(shape):
            text = self.text[i]
            if cls.startswith("="):
                out.append(escape(cls[1:]))
            elif literal and text is not None:
                out.append(escape(text))
            else:
                out.append(_CLASS_REGEX[cls] + _repeat(self.low[i], self.high[i]))
        return "".join(out)


def _repeat(low: int, high: int) -> str:
    if high > _MAX_REPEAT:
        return "+" if low <= 1 else f"{{{min(low, _MAX_REPEAT)},}}"
    if low == high:
        return "" if low == 1 else f"{{{low}}}"
    return f"{{{low},{high}}}"


def escape(text: str) -> str:
    """``text`` as a literal in RE2 syntax: ASCII punctuation escaped, everything else as is."""
    return "".join("\\" + c if c.isascii() and not c.isalnum() and c != " " else c for c in text)


def shape_of(text: str) -> tuple[Shape, list[str] | None]:
    parts = runs(text)
    if parts is None:
        return UNSHAPED, None
    return tuple(_class(p) for p in parts), parts


def regex(shapes: Sequence[Shape], stats: dict[Shape, ShapeStats], literal: bool) -> str:
    """One anchored regex matching every value seen with one of ``shapes``."""
    patterns = [stats[s].pattern(s, literal) for s in shapes]
    body = patterns[0] if len(patterns) == 1 else "(?:" + "|".join(patterns) + ")"
    return f"^{body}$"
