"""DecGuard backend plugins (``decguard.backends`` entry points) used unchanged: a DecGuard
contract naming such a provider runs here too. The plugin's synchronous ``predict`` runs in a
worker thread; its answers and errors are mapped to ours. Needs the ``decguard`` package, which
any such plugin depends on anyway."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from otel_plumb.decision.backends.base import Backend, BackendInfo, Health
from otel_plumb.decision.contract import BackendConfig, DecisionSpec
from otel_plumb.decision.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    ContractError,
    InvalidResponse,
    ParaphraseError,
)
from otel_plumb.decision.model import Prediction, Request

ENTRY_POINT_GROUP = "decguard.backends"
_ERRORS: dict[str, type[BackendError]] = {
    e.kind: e for e in (BackendTimeout, BackendUnavailable, InvalidResponse, ParaphraseError)
}


def _their_spec(spec: DecisionSpec) -> Any:
    from decguard.decisions import DecisionSpec as TheirSpec
    from decguard.decisions import DecisionType

    return TheirSpec(name=spec.name, type=DecisionType(spec.type), labels=spec.labels, description=spec.description)


class DecGuardPlugin(Backend):
    """Subclassed per plugin so that ``provider`` is the plugin's name."""

    concurrent: ClassVar[bool] = True
    plugin: ClassVar[Any] = None

    def __init__(self, inner: Any) -> None:
        super().__init__(name=inner.name, model=inner.model)
        self.inner = inner

    @classmethod
    def wrap(cls, provider: str, plugin: Any) -> type[Backend]:
        return type(f"DecGuardPlugin_{provider}", (cls,), {"provider": provider, "plugin": plugin})

    @classmethod
    def from_config(cls, config: BackendConfig, *, name: str, decision: DecisionSpec) -> Backend:
        from decguard.contracts.models import BackendConfig as TheirConfig
        from decguard.errors import DecGuardError

        try:
            inner = cls.plugin.from_config(
                TheirConfig.model_validate(config.model_dump()),
                name=name,
                decision=_their_spec(decision),
            )
        except DecGuardError as exc:
            raise ContractError(str(exc)) from exc
        return cls(inner)

    async def predict(self, request: Request) -> Prediction:
        from decguard.decisions import DecisionRequest
        from decguard.errors import BackendError as TheirBackendError
        from decguard.errors import DecGuardError

        theirs = DecisionRequest(
            case_id=request.case_id,
            decision=_their_spec(request.decision),
            input=request.input,
        )
        try:
            answer = await asyncio.to_thread(self.inner.predict, theirs)
        except TheirBackendError as exc:
            raise _ERRORS.get(exc.kind, BackendError)(str(exc)) from exc
        except DecGuardError as exc:
            raise ContractError(str(exc)) from exc
        return Prediction(dict(answer.probabilities), answer.model, answer.model_version, dict(answer.metadata))

    async def healthcheck(self) -> Health:
        health = await asyncio.to_thread(self.inner.healthcheck)
        return Health(health.status, health.detail)

    def info(self) -> BackendInfo:
        meta = self.inner.metadata()
        return BackendInfo(meta.name, meta.provider, meta.model, meta.model_version, dict(meta.details))

    async def aclose(self) -> None:
        await asyncio.to_thread(self.inner.close)
