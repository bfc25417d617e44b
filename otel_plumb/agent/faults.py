"""Injected transient tool faults: ``[{"tool": name, "error": message, "times": n}]``."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class InjectedFault(RuntimeError):
    """The error a campaign asked a tool to raise (e.g. ``503 upstream temporarily unavailable``)."""

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(message)
        self.tool = tool


class Faults:
    """Counts calls per tool and raises the injected error for the first ``times`` calls."""

    def __init__(self, faults: Iterable[Mapping[str, Any]] | None = None) -> None:
        self._left: dict[str, list[list[Any]]] = {}
        for f in faults or ():
            self._left.setdefault(str(f["tool"]), []).append([str(f["error"]), int(f.get("times", 1))])
        self._lock = threading.Lock()

    @classmethod
    def from_request(cls, request: Mapping[str, Any]) -> Faults:
        return cls(request.get("faults") or ())

    def check(self, tool: str) -> None:
        """Raise the pending fault for ``tool``, if any (call at the start of the tool)."""
        with self._lock:
            for pending in self._left.get(tool, ()):
                if pending[1] > 0:
                    pending[1] -= 1
                    raise InjectedFault(tool, pending[0])

    def wrap(self, tool: str, fn: F) -> F:
        """``fn`` that fails as injected before running for real."""
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                self.check(tool)
                return await fn(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.check(tool)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
