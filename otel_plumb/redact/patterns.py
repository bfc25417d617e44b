"""Built-in secret patterns (RE2 syntax): each a regex and, where a regex alone would catch too
much, a check of the match (a card number passes the Luhn check)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import re2


def compile_regex(pattern: str) -> Any:
    """An RE2 regex: linear time in the text, whatever the pattern."""
    options = re2.Options()
    options.log_errors = False
    return re2.compile(pattern, options)


def luhn_ok(text: str) -> bool:
    digits = [int(c) for c in text if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


class BuiltinPattern(NamedTuple):
    regex: str
    valid: Callable[[str], bool] | None = None


BUILTIN_PATTERNS: dict[str, BuiltinPattern] = {
    "email": BuiltinPattern(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
    # 13 to 19 digits, optionally grouped by spaces or dashes.
    "card_number": BuiltinPattern(r"\b\d(?:[ -]?\d){12,18}\b", luhn_ok),
    "bearer_token": BuiltinPattern(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"),
    # Provider API keys: OpenAI/Stripe-style sk-/pk-/rk- keys, AWS access key ids, GitHub,
    # Slack and Google tokens.
    "api_key": BuiltinPattern(
        r"\b(?:(?:sk|pk|rk)[-_][A-Za-z0-9_-]{8,}"
        r"|AKIA[0-9A-Z]{16}"
        r"|gh[pousr]_[A-Za-z0-9]{20,}"
        r"|xox[abposr]-[A-Za-z0-9-]{10,}"
        r"|AIza[0-9A-Za-z_-]{35})"
    ),
    "jwt": BuiltinPattern(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}"),
    "us_ssn": BuiltinPattern(r"\b\d{3}-\d{2}-\d{4}\b"),
}
