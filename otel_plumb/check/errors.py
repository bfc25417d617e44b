"""The one error a policy can raise: where (file and line) and what is wrong."""

from __future__ import annotations

from collections.abc import Sequence


class PolicyError(Exception):
    """A policy that cannot be used. ``str()`` is ``path:line: message`` (``path: message``
    when no line is known). ``problems`` holds every problem found in the file, this one first."""

    def __init__(self, path: str, line: int | None, message: str, more: Sequence[PolicyError] = ()) -> None:
        self.path = path
        self.line = line
        self.message = message
        self.problems: list[PolicyError] = [self, *more]
        super().__init__(self.location_text())

    def location_text(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"

    def __str__(self) -> str:
        return self.location_text()
