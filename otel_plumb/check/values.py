"""Argument paths and typed comparison (SPEC section 4).

Numbers compare numerically, as ``Decimal`` so ``0.1 + 0.2`` noise never decides a payment;
strings holding numbers count as numbers. Text compares after Unicode NFC, trimming,
whitespace collapsing and case folding, unless ``compare: exact``.

A stand-in (a placeholder or redaction marker) is no value: ``read_argument`` gives
``Unreadable`` for one on a path, and ``stand_in_read`` finds one a CEL expression may read
(the expression would otherwise decide on the stand-in's text: a false fail or a false pass).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Collection, Hashable
from decimal import Decimal, InvalidOperation
from typing import Any, Final, Literal

from otel_plumb.model.placeholders import stand_in
from otel_plumb.model.text import parse_json

CompareMode = Literal["normalised", "exact", "set"]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"


MISSING: Final[Any] = _Missing()

PathSegment = str | int
_SEGMENT: Final = re.compile(r"([^.\[\]]+)|\[(-?\d+)\]")


def parse_path(text: str) -> tuple[PathSegment, ...]:
    """``"lines[0].amount"`` or ``"lines.0.amount"`` -> ``("lines", 0, "amount")``.

    Raises ValueError for an empty path or stray brackets."""
    text = text.strip()
    segments: list[PathSegment] = []
    pos = 0
    while pos < len(text):
        if text[pos] == "." and segments:
            pos += 1
        m = _SEGMENT.match(text, pos)
        if m is None:
            raise ValueError(f"bad path {text!r} at character {pos + 1}")
        if m.group(2) is not None:
            segments.append(int(m.group(2)))
        else:
            name = m.group(1)
            segments.append(int(name) if name.lstrip("-").isdigit() else name)
        pos = m.end()
    if not segments:
        raise ValueError("empty path")
    return tuple(segments)


def lookup(value: Any, path: tuple[PathSegment, ...]) -> Any:
    """The value at ``path``, or ``MISSING``. A JSON string met on the way is decoded, since
    some conventions record structured results as JSON text."""
    cur = value
    for seg in path:
        if isinstance(cur, (str, bytes)):
            try:
                cur = parse_json(cur)  # what a verdict quotes must be valid text
            except (ValueError, RecursionError):
                return MISSING
        cur = _step(cur, seg)
        if cur is MISSING or cur is _NO_FIELDS:
            return MISSING
    return cur


# What ``_step`` gives for a value that has no fields or items to step into.
_NO_FIELDS: Final = object()


def _step(cur: Any, seg: PathSegment) -> Any:
    """The value at one segment of a path in ``cur``: a field of a mapping (an int segment also
    as its digits), an item of a list; ``MISSING`` when the mapping or list lacks it,
    ``_NO_FIELDS`` when ``cur`` is neither (or a list read by name)."""
    if isinstance(cur, dict):
        if seg in cur:
            return cur[seg]
        if isinstance(seg, int) and str(seg) in cur:
            return cur[str(seg)]
        return MISSING
    if isinstance(cur, (list, tuple)) and isinstance(seg, int):
        return cur[seg] if -len(cur) <= seg < len(cur) else MISSING
    return _NO_FIELDS


class Unreadable:
    """What ``read_argument`` gives when the data cannot say what the argument is: ``reason``
    says what could not be read."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<unreadable: {self.reason}>"


def read_argument(args: Any, path: tuple[PathSegment, ...]) -> Any:
    """The value at ``path`` in a call's arguments, as ``lookup`` reads it; ``MISSING`` when a
    mapping (or list) there lacks it, which is what the call sent. ``Unreadable`` when the
    arguments cannot say: they are not named arguments (text that is not JSON, such as a
    double-encoded object cut off inside, a number, a list read by name), a value on the way
    is a placeholder, redacted, or JSON text that does not decode, or the value (or a part of
    it) is a placeholder or redacted."""
    cur = args
    for depth, seg in enumerate(path):
        where, verb = ("the arguments", "are") if depth == 0 else (_path_text(path[:depth]), "is")
        if isinstance(cur, bytes):
            try:
                cur = cur.decode("utf-8")
            except UnicodeDecodeError:
                return Unreadable(f"{where} {verb} bytes that are not UTF-8")
        if isinstance(cur, str):
            try:
                cur = parse_json(cur)  # what a verdict quotes must be valid text
            except (ValueError, RecursionError):
                why = stand_in(cur)
                if why is not None:
                    return Unreadable(f"{where} {verb} {why}")
                if cur.lstrip()[:1] in ("{", "["):
                    return Unreadable(f"{where} {verb} JSON text that does not decode, cut off perhaps "
                                      f"({_excerpt(cur)})")  # fmt: skip
                if depth == 0:
                    return Unreadable(f"the arguments are text, not named arguments ({_excerpt(cur)})")
                return MISSING  # plain text: it has no fields
        found_at = _step(cur, seg)
        if found_at is _NO_FIELDS:
            return Unreadable(f"the arguments are {_kind(cur)}, not named arguments") if depth == 0 else MISSING
        if found_at is MISSING:
            return MISSING
        cur = found_at
    found = stand_in_within(cur)
    return cur if found is None else Unreadable(f"{_path_text(path)}{found[0]} is {found[1]}")


def stand_in_within(value: Any) -> tuple[str, str] | None:
    """Where in ``value`` a string is a stand-in (a placeholder, a redaction marker: see
    ``model.placeholders``) and what it is: ``("", why)`` for ``value`` itself, ``("[0].to",
    why)`` inside it; None when it holds none. Walks, not recursion, and works out where only
    once one is found, so a value with none costs one walk."""
    if isinstance(value, str):
        why = stand_in(value)
        return None if why is None else ("", why)
    return _where_stand_in(value) if _holds_stand_in(value) else None


def stand_in_read(value: Any, names: Collection[str], whole: bool) -> tuple[str, str] | None:
    """Where in ``value`` a stand-in is that an expression may read, and what it is (as
    ``stand_in_within``). ``names``: the expression's identifiers; one under a mapping key among
    them may be read (``args.to`` reads all of ``to``, ``to.cc`` included), as may any when
    ``whole`` (the expression reads ``value`` itself: ``args["to"]``, ``size(args)``), and
    ``value`` itself. A value holding no stand-in costs one walk."""
    if isinstance(value, str):
        why = stand_in(value)
        return None if why is None else ("", why)
    if not _holds_stand_in(value):
        return None
    trail: list[tuple[str, Any, bool]] = [("", value, whole)]
    while trail:
        at, v, read = trail.pop()
        if isinstance(v, str):
            why = stand_in(v) if read else None
            if why is not None:
                return at, why
        elif isinstance(v, dict):
            # reversed: the first stand-in in the value's own order is the one named
            trail.extend((f"{at}.{k}", x, read or k in names) for k, x in reversed(v.items()))
        elif isinstance(v, (list, tuple)):
            trail.extend((f"{at}[{i}]", v[i], read) for i in range(len(v) - 1, -1, -1))
    return None


def _holds_stand_in(value: Any) -> bool:
    """Whether a string anywhere in ``value`` is a stand-in."""
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if stand_in(v) is not None:
                return True
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return False


def _where_stand_in(value: Any) -> tuple[str, str] | None:
    trail: list[tuple[str, Any]] = [("", value)]
    while trail:
        at, v = trail.pop()
        if isinstance(v, str):
            why = stand_in(v)
            if why is not None:
                return at, why
        elif isinstance(v, dict):
            trail.extend((f"{at}.{k}", x) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            trail.extend((f"{at}[{i}]", x) for i, x in enumerate(v))
    return None


def _path_text(path: tuple[PathSegment, ...]) -> str:
    return "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in path).lstrip(".")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float, Decimal)):
        return "a number"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, str):
        return "text"
    return "null" if value is None else f"a {type(value).__name__}"


def _excerpt(text: str) -> str:
    return repr(text[:40] + "…") if len(text) > 40 else repr(text)


# Plain decimals, optionally signed, optionally with an exponent; and English thousands
# grouping ("4,820.00"), accepted only in its strict form (groups of exactly three digits).
_NUMBER: Final = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_GROUPED: Final = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")
_SPACE: Final = re.compile(r"\s+")


def as_number(value: Any, *, strings: bool = True) -> Decimal | None:
    """The numeric value of an int, float or (when ``strings``) numeric string; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        # 15 significant digits, what a double holds reliably: 0.1 + 0.2 reads as 0.3, not as
        # the binary expansion 0.3000000000000000444...
        return Decimal(format(value, ".15g")) if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return value
    if strings and isinstance(value, str):
        text = value.strip()
        if _NUMBER.fullmatch(text):
            try:
                return Decimal(text)
            except InvalidOperation:
                return None
        if _GROUPED.fullmatch(text):
            return Decimal(text.replace(",", ""))
    return None


def normalise_text(text: str) -> str:
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text).strip()).casefold()


def equal(a: Any, b: Any, mode: CompareMode = "normalised", tolerance: Decimal = Decimal(0)) -> bool:
    """Typed equality: see the module docstring. ``set`` compares lists without order and
    repeats (``_set_equal``), numbers within ``tolerance`` as elsewhere."""
    exact = mode == "exact"
    na, nb = as_number(a, strings=not exact), as_number(b, strings=not exact)
    if na is not None and nb is not None:
        return abs(na - nb) <= tolerance
    if isinstance(a, str) and isinstance(b, str):
        return a == b if exact else normalise_text(a) == normalise_text(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return _as_bool(a, exact) is not None and _as_bool(a, exact) == _as_bool(b, exact)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if mode == "set":
            return _set_equal(a, b, tolerance)
        return len(a) == len(b) and all(equal(x, y, mode, tolerance) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return False
        return all(equal(a[k], b[k], mode, tolerance) for k in a)
    if a is None or b is None:
        return a is None and b is None
    return bool(a == b)


def _set_equal(a: Collection[Any], b: Collection[Any], tolerance: Decimal) -> bool:
    """``compare: set``: the lists hold the same values, in any order, repeats ignored.

    Repeats are the values ``canonical`` keys as one (``10``, ``10.0`` and ``"10"``), with or
    without tolerance; each side's distinct values are then compared. With a tolerance the
    distinct numbers (as ``as_number`` reads them) pair one to one, each within the tolerance
    of its partner, so both sides need as many: ``[10, 10.004]`` is not ``[10]``, even with
    tolerance 0.01. Pairing the sorted numbers with the sorted numbers finds such a pairing
    when one exists. Other values (text, booleans, lists, maps) compare by ``canonical``,
    without tolerance."""
    if tolerance <= 0:
        return {canonical(x, "normalised") for x in a} == {canonical(x, "normalised") for x in b}
    nums_a, others_a = _split_numbers(a)
    nums_b, others_b = _split_numbers(b)
    if len(nums_a) != len(nums_b) or others_a != others_b:
        return False
    return all(abs(x - y) <= tolerance for x, y in zip(sorted(nums_a), sorted(nums_b), strict=True))


def _split_numbers(values: Collection[Any]) -> tuple[set[Decimal], set[Hashable]]:
    """The distinct numbers among ``values`` (as ``canonical`` reads them: equal ones are one),
    and the ``canonical`` keys of the rest."""
    nums: set[Decimal] = set()
    others: set[Hashable] = set()
    for x in values:
        n = as_number(x)
        if n is not None and n.is_finite():
            nums.add(n)
        else:
            others.add(canonical(x, "normalised"))
    return nums, others


def _as_bool(value: Any, exact: bool) -> bool | None:
    if isinstance(value, bool):
        return value
    if not exact and isinstance(value, str):
        folded = normalise_text(value)
        if folded in ("true", "false"):
            return folded == "true"
    return None


def canonical(value: Any, mode: CompareMode) -> Hashable:
    """A hashable key such that ``equal(a, b, mode)`` (without tolerance) iff keys are equal."""
    exact = mode == "exact"
    n = as_number(value, strings=not exact)
    if n is not None:
        return ("n", n.normalize())
    b = _as_bool(value, exact)
    if b is not None:
        return ("b", b)
    if isinstance(value, str):
        return ("s", value if exact else normalise_text(value))
    if isinstance(value, (list, tuple)):
        return ("l", tuple(canonical(x, mode) for x in value))
    if isinstance(value, dict):
        return ("d", frozenset((str(k), canonical(v, mode)) for k, v in value.items()))
    if value is None:
        return ("z",)
    return ("o", repr(value))


def plain(value: Any) -> Any:
    """A JSON-ready copy of a value for verdicts (``Decimal`` and ``MISSING`` do not serialise)."""
    if value is MISSING:
        return None
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value
