"""Rate-limited log lines: a flood of the same failure logs one line per interval, not one each.

Each kind of failure has a name; its first occurrence is logged at once, later ones within
``interval`` seconds are only counted, and the next line logged for that kind says how many
were left out. Callers pass a short reason rather than a traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

# Distinct kinds remembered; past it the table is cleared (a kind then logs again at once).
_MAX_KEYS = 1_000


class RateLimitedLog:
    __slots__ = ("_clock", "_interval", "_logger", "_state")

    def __init__(
        self, logger: logging.Logger, interval: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        # kind -> [time of the last line logged, occurrences left out since]
        self._state: dict[str, list[float]] = {}

    def log(self, kind: str, level: int, message: str, *args: Any, exc_info: bool = False) -> bool:
        """Log ``message % args`` unless a line of this ``kind`` was logged within the interval;
        True if it was logged."""
        now = self._clock()
        state = self._state.get(kind)
        if state is not None and now - state[0] < self._interval:
            state[1] += 1
            return False
        if state is None and len(self._state) >= _MAX_KEYS:
            self._state.clear()
        self._state[kind] = [now, 0]
        if state is not None and state[1]:
            message += " (%d more like this in the last %.0fs)"
            args = (*args, int(state[1]), now - state[0])
        self._logger.log(level, message, *args, exc_info=exc_info)
        return True

    def warning(self, kind: str, message: str, *args: Any) -> bool:
        return self.log(kind, logging.WARNING, message, *args)

    def error(self, kind: str, message: str, *args: Any) -> bool:
        return self.log(kind, logging.ERROR, message, *args)

    def info(self, kind: str, message: str, *args: Any) -> bool:
        return self.log(kind, logging.INFO, message, *args)
