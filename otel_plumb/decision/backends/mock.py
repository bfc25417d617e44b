"""Deterministic offline backend, answering exactly as DecGuard's ``mock`` provider does:
substring rules, then ``default``, else a seeded hash of the input; ``position_bias`` moves that
share of probability mass to whichever option is shown first."""

from __future__ import annotations

import hashlib
import json
import math
import re
from functools import lru_cache

from pydantic import Field

from otel_plumb.decision.backends.base import Backend, BackendInfo, Health, validate_settings
from otel_plumb.decision.contract import BackendConfig, DecisionSpec
from otel_plumb.decision.errors import ContractError, InvalidResponse
from otel_plumb.decision.model import DecisionInput, Prediction, Request, validate_probabilities
from otel_plumb.decision.validation import Strict


class MockRule(Strict):
    contains: str = Field(min_length=1)
    """Substring of the input, ignoring case and whitespace (objects match on their JSON)."""
    probabilities: dict[str, float]


class MockSettings(Strict):
    rules: tuple[MockRule, ...] = ()
    default: dict[str, float] | None = None
    seed: int = 0
    model_version: str | None = None
    position_bias: float = Field(default=0.0, ge=0.0, le=1.0)


def input_text(value: DecisionInput) -> str:
    return (
        value
        if isinstance(value, str)
        else json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    )


@lru_cache(maxsize=16384)
def _normalize(text: str) -> str:
    return " ".join(text.split()).casefold()


_ENUMERATOR = re.compile(r"^(?:[A-Za-z]|\d{1,3})[).:]\s+")


@lru_cache(maxsize=4096)
def semantic_label(shown: str) -> str:
    """``"B) Refund"``, ``'"refund"'``, ``"REFUND"`` and ``"[refund]"`` all mean ``refund``."""
    return _ENUMERATOR.sub("", shown.strip()).strip("\"'[]").strip().casefold()


@lru_cache(maxsize=16384)
def hashed_distribution(text: str, labels: frozenset[str], seed: int) -> dict[str, float]:
    """A fixed pseudo-random distribution per (seed, input, label). Cached by label set: ``fsum`` is
    exact, so the values do not depend on the order the options are shown in."""
    weights = {
        label: int.from_bytes(hashlib.sha256(f"{seed}\x1f{text}\x1f{label}".encode()).digest()[:8], "big") / 2**64
        + 1e-3
        for label in labels
    }
    total = math.fsum(weights.values())
    return {label: weight / total for label, weight in weights.items()}


class MockBackend(Backend):
    provider = "mock"

    def __init__(self, settings: MockSettings | None = None, *, name: str = "default", model: str | None = "mock"):
        super().__init__(name=name, model=model)
        self.settings = settings or MockSettings()
        self._rules = [(_normalize(rule.contains), rule.probabilities) for rule in self.settings.rules]
        self._default = self.settings.default
        self._seed = self.settings.seed
        self._position_bias = self.settings.position_bias

    @classmethod
    def from_config(cls, config: BackendConfig, *, name: str, decision: DecisionSpec) -> Backend:
        settings = validate_settings(MockSettings, config, name=name)
        answers = [(f"rules[{i}]", rule.probabilities) for i, rule in enumerate(settings.rules)]
        if settings.default is not None:
            answers.append(("default", settings.default))
        for where, probabilities in answers:
            try:
                validate_probabilities(decision.labels, probabilities)
            except InvalidResponse as exc:
                raise ContractError(f"mock backend {name!r}: {where}: {exc}") from exc
        return cls(settings, name=name, model=config.model or "mock")

    async def predict(self, request: Request) -> Prediction:
        return self.answer(request)

    def answer(self, request: Request) -> Prediction:
        text = input_text(request.input)
        shown = request.decision.labels
        answer = self._default
        if self._rules:
            normalized = _normalize(text)
            answer = next((p for needle, p in self._rules if needle in normalized), answer)
        if answer is None:
            # Hash each label's meaning, so reformatted options get the same answer.
            meanings = tuple(map(semantic_label, shown))
            unique = frozenset(meanings)
            if len(unique) != len(meanings):
                meanings, unique = shown, frozenset(shown)
            hashed = hashed_distribution(text, unique, self._seed)
            probabilities = {label: hashed[m] for label, m in zip(shown, meanings, strict=True)}
        else:
            probabilities = _map_labels(answer, shown)
        return Prediction(self._bias(probabilities, shown), model_version=self.settings.model_version)

    def _bias(self, probabilities: dict[str, float], shown: tuple[str, ...]) -> dict[str, float]:
        bias = self._position_bias
        if not bias or not shown or shown[0] not in probabilities:
            return probabilities
        first = shown[0]
        return {label: (1.0 - bias) * p + (bias if label == first else 0.0) for label, p in probabilities.items()}

    def info(self) -> BackendInfo:
        details: dict[str, object] = {"rules": len(self.settings.rules), "seed": self.settings.seed}
        if self.settings.position_bias:
            details["position_bias"] = self.settings.position_bias
        return BackendInfo(self.name, self.provider, self.model, self.settings.model_version, details)

    async def healthcheck(self) -> Health:
        return Health("ok", "mock backend")


def _map_labels(answer: dict[str, float], shown: tuple[str, ...]) -> dict[str, float]:
    """Key a configured answer by the labels as shown; unmappable answers go out as configured
    and fail validation, as in DecGuard."""
    if set(answer) == set(shown):
        return dict(answer)
    by_meaning: dict[str, str] = {}
    for label in answer:
        by_meaning.setdefault(semantic_label(label), label)
    mapped: dict[str, float] = {}
    used: set[str] = set()
    for label in shown:
        source = label if label in answer else by_meaning.get(semantic_label(label))
        if source is None or source in used:
            return dict(answer)
        used.add(source)
        mapped[label] = answer[source]
    return mapped
