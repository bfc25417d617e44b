"""A Python function as a backend: ``fn(request) -> {label: probability}`` or a ``Prediction``
(sync or async). For the CLI, package a ``Backend`` subclass under the entry-point group."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from otel_plumb.decision.backends.base import Backend
from otel_plumb.decision.model import Prediction, Request

DecideFn = Callable[[Request], Mapping[str, float] | Prediction | Awaitable[Mapping[str, float] | Prediction]]


class CallableBackend(Backend):
    provider = "python"

    def __init__(self, fn: DecideFn, *, name: str = "python", model: str | None = None) -> None:
        super().__init__(name=name, model=model)
        self._fn = fn

    async def predict(self, request: Request) -> Prediction:
        answer: Any = self._fn(request)
        if inspect.isawaitable(answer):
            answer = await answer
        return answer if isinstance(answer, Prediction) else Prediction(answer)
