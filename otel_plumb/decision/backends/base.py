"""The backend interface: ``predict`` returns raw label probabilities for the labels as shown;
``decide`` times it and validates the answer the same way for every backend."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ValidationError

from otel_plumb.decision.contract import BackendConfig, DecisionSpec
from otel_plumb.decision.errors import ContractError
from otel_plumb.decision.model import DEFAULT_TOLERANCE, Prediction, Request, Result, build_result
from otel_plumb.decision.validation import format_errors, redact

SettingsT = TypeVar("SettingsT", bound=BaseModel)


@dataclass(frozen=True)
class Health:
    status: str
    """ok, unhealthy or unknown"""
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        return {"status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class BackendInfo:
    """Provenance recorded in every report; never holds secrets."""

    name: str
    provider: str
    model: str | None = None
    model_version: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "provider": self.provider,
            "model": self.model,
            "model_version": self.model_version,
            "details": redact(self.details),
        }


class Backend:
    """Subclasses set ``provider`` and implement ``predict``; plugins register a subclass under the
    ``otel_plumb.decision_backends`` entry-point group and build it in ``from_config``."""

    provider: ClassVar[str] = ""
    concurrent: ClassVar[bool] = False
    """True when calls wait on I/O, so the runner overlaps up to evaluation.max_concurrency of them."""

    def __init__(self, *, name: str = "default", model: str | None = None) -> None:
        self.name = name
        self.model = model

    @classmethod
    def from_config(cls, config: BackendConfig, *, name: str, decision: DecisionSpec) -> Backend:
        """Validate settings without network I/O (``decision validate`` runs offline)."""
        raise ContractError(f"provider {cls.provider!r} cannot be configured from a contract")

    async def predict(self, request: Request) -> Prediction:
        raise NotImplementedError

    async def decide(self, request: Request, *, tolerance: float = DEFAULT_TOLERANCE) -> Result:
        start = time.perf_counter()
        prediction = await self.predict(request)
        latency_ms = (time.perf_counter() - start) * 1000.0
        return build_result(
            request,
            prediction,
            backend=self.name,
            provider=self.provider,
            model=self.model,
            latency_ms=latency_ms,
            tolerance=tolerance,
        )

    def info(self) -> BackendInfo:
        return BackendInfo(self.name, self.provider, self.model)

    async def healthcheck(self) -> Health:
        return Health("unknown", "healthcheck not implemented")

    async def aclose(self) -> None:
        return None


def validate_settings(model: type[SettingsT], config: BackendConfig, *, name: str) -> SettingsT:
    prefix = "backend" if name == "default" else f"backends.{name}"
    try:
        return model.model_validate(config.settings)
    except ValidationError as exc:
        raise ContractError(
            f"invalid settings for provider {config.provider!r}:\n" + format_errors(exc, prefix=prefix)
        ) from exc
