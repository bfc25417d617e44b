"""Text from traces made safe to print: names and values come from whoever sent the spans, and
a tool named ``"\\x1b]0;pwned\\x07"`` must not retitle, clear or recolour an operator's terminal,
nor a value with a newline forge a log line or a FAIL line of its own."""

from __future__ import annotations

import re

# C0 controls (newline and tab too: one field, one line), DEL, C1 controls, and the Unicode
# format characters that reorder or hide text (bidi embeddings, overrides and isolates, marks).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    code = ord(c)
    if c == "\n":
        return "\\n"
    if c == "\t":
        return "\\t"
    if c == "\r":
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(value: object) -> str:
    """``value`` as text with every control and text-reordering character escaped."""
    text = value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_escape, text)
