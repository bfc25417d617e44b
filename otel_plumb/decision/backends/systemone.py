"""System One decision APIs (TypeSafe's Jev, directly or through OpenRouter's Decisions API, and
self-hosted Kev servers), as DecGuard's ``systemone`` provider speaks to them::

    POST <url>  {"model": ..., "state": <input>,
                 "questions": {"<decision>": {"type": ..., "instructions": ..., "criteria": ...}}}
    200 OK      {"model": "<model that answered>", "answers": {"<decision>": {...}}, "usage"?: {...}}

choice: options as ``criteria`` keys, answered ``probabilities`` by option (``choice`` must be the
most probable); noul: no labels sent, ``noul`` is the positive label's probability; score: levels
as a ``criteria`` list, ``probabilities`` keyed by level index. Checked, never repaired.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, TypeGuard

from otel_plumb.decision.backends.base import Backend, BackendInfo, validate_settings
from otel_plumb.decision.backends.http import HttpBackend, HttpSettings
from otel_plumb.decision.contract import BackendConfig, DecisionSpec
from otel_plumb.decision.errors import ContractError, InvalidResponse
from otel_plumb.decision.httpclient import RETRYABLE_STATUS
from otel_plumb.decision.model import Prediction, Request

USAGE_KEYS = ("input_tokens", "output_tokens", "cost")


class SystemOneSettings(HttpSettings):
    instructions: str | None = None
    """The question asked about every input; defaults to decision.description."""


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class SystemOneBackend(HttpBackend):
    provider = "systemone"
    protocol: ClassVar[str] = "typesafe.systemone/v1"
    # TypeSafe and OpenRouter ask clients to retry rate limits (429) and overload (529) too.
    retryable_status: ClassVar[frozenset[int]] = RETRYABLE_STATUS | {429, 529}

    def __init__(self, settings: SystemOneSettings, *, decision: DecisionSpec, name: str, model: str) -> None:
        super().__init__(settings, name=name, model=model)
        instructions = settings.instructions or decision.description
        if not instructions:
            raise ContractError(
                f"systemone backend {name!r}: set decision.description or the backend's 'instructions' "
                "(the question asked about every input)"
            )
        self.instructions = instructions
        self.decision = decision
        self.served: set[str] = set()
        self.upstream: set[str] = set()

    @classmethod
    def from_config(cls, config: BackendConfig, *, name: str, decision: DecisionSpec) -> Backend:
        settings = validate_settings(SystemOneSettings, config, name=name)
        if not config.model:
            raise ContractError(f"systemone backend {name!r}: 'model' is required")
        if settings.label_map and decision.type == "noul":
            raise ContractError(
                f"systemone backend {name!r}: label_map does not apply to noul decisions (no labels are sent)"
            )
        cls.check_label_map(settings, decision, name=name)
        return cls(settings, decision=decision, name=name, model=config.model)

    async def predict(self, request: Request) -> Prediction:
        spec = request.decision
        sent = [self._reverse.get(label, label) for label in spec.labels]
        question: dict[str, Any] = {"type": spec.type, "instructions": self.instructions}
        if spec.type == "choice":
            question["criteria"] = dict.fromkeys(sent)
        elif spec.type == "score":
            question["criteria"] = sent
        payload = {"model": self.model, "state": request.input, "questions": {spec.name: question}}
        body, headers = await self.client.post(self.settings.url, payload)
        if not isinstance(body, dict) or not isinstance(body.get("answers"), dict):
            raise InvalidResponse(f"backend {self.name!r} response has no 'answers' object")
        if set(body["answers"]) != {spec.name}:
            raise InvalidResponse(
                f"backend {self.name!r} must answer exactly the question {spec.name!r}, "
                f"got {sorted(map(str, body['answers']))}"
            )
        answer = body["answers"][spec.name]
        if not isinstance(answer, dict) or answer.get("type") != spec.type:
            got = answer.get("type") if isinstance(answer, dict) else type(answer).__name__
            raise InvalidResponse(f"expected a {spec.type} answer, got {got!r}")
        served = body.get("model")
        if not isinstance(served, str) or not served:
            raise InvalidResponse("'model' must be a non-empty string")
        if spec.type == "choice":
            probabilities = self._choice(answer, sent)
        elif spec.type == "noul":
            probabilities = self._noul(answer, spec.labels)
        else:
            probabilities = self._score(answer, spec.labels, sent)
        return Prediction(probabilities, model_version=served, metadata=self._provenance(body, headers, served))

    def _choice(self, answer: dict[str, Any], sent: list[str]) -> dict[str, Any]:
        raw = answer.get("probabilities")
        if not isinstance(raw, dict):
            raise InvalidResponse("choice answer has no 'probabilities' object")
        choice = answer.get("choice")
        if not isinstance(choice, str) or choice not in sent or choice not in raw:
            raise InvalidResponse(f"choice {choice!r} is not one of the options sent")
        if all(map(_number, raw.values())) and raw[choice] < max(raw.values()):
            raise InvalidResponse(f"choice {choice!r} is not the most probable option")
        probabilities: dict[str, Any] = {}
        for option, value in raw.items():
            label = self.settings.label_map.get(str(option), str(option))
            if label in probabilities:
                raise InvalidResponse(f"backend {self.name!r} returned label {label!r} twice")
            probabilities[label] = value
        return probabilities

    def _noul(self, answer: dict[str, Any], shown: tuple[str, ...]) -> dict[str, Any]:
        value = answer.get("noul")
        if not _number(value) or not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise InvalidResponse(f"noul answer must be a probability in [0, 1], got {value!r}")
        positive, negative = self.decision.labels
        if set(shown) != {positive, negative}:
            positive, negative = shown  # reformatted labels keep the contract order: positive first
        return {positive: float(value), negative: 1.0 - float(value)}

    def _score(self, answer: dict[str, Any], shown: tuple[str, ...], sent: list[str]) -> dict[str, Any]:
        raw = answer.get("probabilities")
        if not isinstance(raw, dict):
            raise InvalidResponse("score answer has no 'probabilities' object")
        legend = answer.get("legend")
        if legend is not None and legend != {str(i): level for i, level in enumerate(sent)}:
            raise InvalidResponse("score legend does not match the levels sent")
        probabilities: dict[str, Any] = {}
        for key, value in raw.items():
            index = int(key) if isinstance(key, str) and key.isdecimal() else -1
            if str(index) != key or index >= len(shown):
                raise InvalidResponse(f"score probabilities key {key!r} is not a level index")
            probabilities[shown[index]] = value
        return probabilities

    def _provenance(self, body: dict[str, Any], headers: dict[str, str], served: str) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        request_id = body.get("id") or headers.get("x-typesafe-request-id") or headers.get("X-Typesafe-Request-Id")
        if isinstance(request_id, str):
            metadata["request_id"] = request_id
        upstream = body.get("provider")
        if isinstance(upstream, str):
            metadata["upstream_provider"] = upstream
            self.upstream.add(upstream)
        usage = body.get("usage")
        if isinstance(usage, dict):
            metadata["usage"] = {k: usage[k] for k in USAGE_KEYS if _number(usage.get(k))}
        self.served.add(served)
        return metadata

    def info(self) -> BackendInfo:
        """Provenance, including the models that actually answered during the run."""
        base = super().info()
        details = dict(base.details)
        served, upstream = sorted(self.served), sorted(self.upstream)
        if served:
            details["served_models"] = served
        if upstream:
            details["upstream_providers"] = upstream
        return BackendInfo(base.name, base.provider, base.model, served[0] if len(served) == 1 else None, details)
