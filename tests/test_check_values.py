"""Typed comparison and argument paths."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_plumb.check.values import MISSING, as_number, canonical, equal, lookup, parse_path


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("INV-1029", "inv-1029 ", True),
        (4820.00, 48200.00, False),
        (4820, "4820.00", True),
        ("4,820.00", 4820, True),  # English thousands grouping is read as a number
        ("4,82", 4.82, False),  # decimal comma is not: it stays text
        (0.1 + 0.2, 0.3, True),  # floats read to 15 significant digits: no float noise
        ("Stra\u00dfe", "STRASSE", True),  # case folding
        ("e\u0301", "\u00e9", True),  # NFC
        ("a  b\tc", "a b c", True),
        (True, "true", True),
        (True, 1, False),
        (None, None, True),
        (None, "", False),
        ([1, "a"], ["1", "A"], True),
        ({"x": 1, "y": ["b"]}, {"y": ["B"], "x": "1.0"}, True),
        ({"x": 1}, {"x": 1, "y": 2}, False),
    ],
)
def test_typed_equality(a, b, same):
    assert equal(a, b) is same
    assert equal(b, a) is same


def test_tolerance_exact_and_set():
    assert equal(100.004, 100, tolerance=Decimal("0.01"))
    assert not equal(100.02, 100, tolerance=Decimal("0.01"))
    assert not equal("INV-1029", "inv-1029", "exact")
    assert not equal("007", 7, "exact")  # exact keeps identifiers as text
    assert equal(7.0, 7, "exact")
    assert equal(["b", "a", "a"], ["A", "B"], "set")
    assert not equal(["a", "c"], ["a", "b"], "set")


def test_numbers():
    assert as_number("  -1.5e3 ") == Decimal("-1500")
    assert as_number("1,234,567.5") == Decimal("1234567.5")
    assert as_number("12,34") is None and as_number("abc") is None and as_number(True) is None
    assert as_number(float("nan")) is None


def test_paths():
    assert parse_path("a.b[2].c") == ("a", "b", 2, "c")
    assert parse_path("lines.0") == ("lines", 0)
    for bad in ("", "a[", "a..b", "[x]"):
        with pytest.raises(ValueError):
            parse_path(bad)
    assert lookup({"a": [{"b": 1}]}, ("a", 0, "b")) == 1
    assert lookup({"a": '{"b": 2}'}, ("a", "b")) == 2  # JSON text met on the way is decoded
    assert lookup({"a": [1]}, ("a", 3)) is MISSING
    assert lookup({"a": 1}, ("a", "b")) is MISSING


keys = st.text(alphabet=st.characters(blacklist_characters=".[]", blacklist_categories=("Cs",)), min_size=1)


@given(st.lists(st.one_of(keys.filter(lambda k: not k.strip("-").isdigit() and k == k.strip()),
                          st.integers(0, 99)), min_size=1, max_size=5))  # fmt: skip
def test_path_round_trip(segments):
    text = "".join(f"[{s}]" if isinstance(s, int) else (("." if i else "") + s) for i, s in enumerate(segments))
    assert parse_path(text) == tuple(segments)


@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)),
                    lambda inner: st.lists(inner, max_size=3), max_leaves=8))  # fmt: skip
def test_canonical_agrees_with_equal(value):
    assert equal(value, value)
    assert canonical(value, "normalised") == canonical(value, "normalised")


def test_stand_ins_are_recognised_and_markers_are_the_redactors():
    """``model.placeholders`` recognises the placeholders (whole values only) and what
    ``redact`` writes (anywhere in a value)."""
    from otel_plumb.model import placeholders
    from otel_plumb.redact import Redactor, Truncate
    from otel_plumb.redact.redactor import TOO_DEEP

    for text in [*placeholders.PLACEHOLDERS, " <REDACTED> ", "***", "********"]:
        assert placeholders.is_placeholder(text) and placeholders.stand_in(text) is not None, text
    for text in ["bob", "[x]", "<b>", "", "**", "redacted by the court"]:
        assert not placeholders.is_placeholder(text) and placeholders.stand_in(text) is None, text
    r = Redactor([], b"key")
    for action in ("mask", "hash", Truncate(truncate=3)):
        written = r.replacement(action, "bob@example.com", "email")
        assert written is not None and placeholders.stand_in(f"to {written}!") is not None, written
    assert placeholders.stand_in(TOO_DEEP) is not None
    assert placeholders.stand_in("bob@example.com [see notes]") is None
