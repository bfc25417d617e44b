"""Text that stands in for a value: placeholders instrumentations and redacting processors
write instead of content (``"<REDACTED>"``), and otel-plumb's own redaction markers, which
spans forwarded with ``redact_forwarded`` (or files written from them) carry back in.

A check that reads such text is reading the stand-in, not the value: it cannot say what the
value was. The normaliser marks a whole attribute that is a placeholder as redacted
(``normalise.values``); ``check`` recognises one inside captured arguments too.
``tests/test_check_values.py`` keeps the markers the ones ``redact`` writes.
"""

from __future__ import annotations

import re
from typing import Final

# Compared lowercased and stripped.
PLACEHOLDERS: Final = frozenset(
    {
        "<redacted>",
        "[redacted]",
        "redacted",
        "(redacted)",
        "{redacted}",
        "__redacted__",
        "<hidden>",
        "[hidden]",
        "<masked>",
        "[masked]",
        "<filtered>",
        "[filtered]",
        "<omitted>",
        "[omitted]",
        "<not recorded>",
        "<replaced>",
        "<not serializable>",
        "<scrubbed>",
        "[scrubbed]",
    }
)

# First characters of every placeholder: most data strings are ruled out by their first one.
_PLACEHOLDER_STARTS: Final = frozenset("<[({_*rR")


def is_placeholder(text: str) -> bool:
    """Whether ``text`` as a whole is a placeholder (``"<REDACTED>"``, ``"***"``)."""
    s = text.strip()
    if not s or s[0] not in _PLACEHOLDER_STARTS:
        return False
    if len(s) >= 3 and s.strip("*") == "":
        return True  # "***", "********"
    return s.lower() in PLACEHOLDERS


# What otel-plumb's redaction writes (redact/redactor.py): mask "[redacted:LABEL]" (and
# "[redacted: nested too deep]"), hash "[hmac:<16 hex>]", truncate "TEXT… [N characters
# redacted]". A pattern rule replaces matches inside a longer string, so they are looked for
# anywhere in it.
_MARKER: Final = re.compile(r"\[redacted:[^\]\n]*\]|\[hmac:[0-9a-f]{16}\]|… \[\d+ characters redacted\]")


def stand_in(text: str) -> str | None:
    """Why ``text`` is not (all of) the value it stands for, or None when it is plain text."""
    if is_placeholder(text):
        return "a redaction placeholder"
    m = _MARKER.search(text)
    if m is not None:
        return f"redacted ({m.group()[:40]})"
    return None
