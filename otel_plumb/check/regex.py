"""Regular expressions from policies (``arg_matches``, ``applies_to`` globs) over text from the
agent under test: RE2, so matching takes time linear in the text, whatever the pattern."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import re2

_UNANCHORED: Final = re2._Anchor.UNANCHORED
_NO_MATCH: Final[tuple[int, ...]] = (-1, -1)


class Regex:
    """``found(text)``: whether the pattern matches anywhere in ``text``. It asks RE2 for the
    match alone: the library's ``search`` then maps byte offsets back to characters and builds a
    match object in Python, six times the time of the match on a short argument."""

    __slots__ = ("_match", "_search", "pattern")

    def __init__(self, pattern: str) -> None:
        """Raises ``re2.error`` for what RE2 does not have (backreferences, lookaround) or a
        pattern too large to compile."""
        options = re2.Options()
        options.log_errors = False
        compiled = re2.compile(pattern, options)
        self.pattern = pattern
        self._search: Callable[[str], Any] = compiled.search
        # The binding under ``search`` (google-re2's own): the (start, end) byte spans of the
        # match and its groups, (-1, -1) when nothing matched. Without it, ``search`` does.
        self._match: Callable[[Any, bytes, int, int], Any] | None = getattr(
            getattr(compiled, "_regexp", None), "Match", None
        )

    def found(self, text: str) -> bool:
        if self._match is None:
            return self._search(text) is not None
        data = text.encode()
        return bool(self._match(_UNANCHORED, data, 0, len(data))[0] != _NO_MATCH)
