"""Any OpenAI-compatible chat-completions server as a decision backend.

The options are listed in the order shown (lettered A, B, C... or by label); the model is asked
for one token with ``logprobs`` and ``top_logprobs``. A label's probability is the probability
mass of the tokens naming it, conditioned on the answer naming an option:
p(label) = mass(label) / mass(all options). The unconditioned mass is recorded as
``option_mass`` so a model that mostly answers something else is visible. An option missing
from the top logprobs gets 0 (listed under ``options_missing``); no option at all is an
invalid response. Model, seed and system fingerprint are recorded with every result.
"""

from __future__ import annotations

import json
import math
import string
from typing import Any, Literal

from pydantic import Field, field_validator

from otel_plumb.decision.backends.base import Backend, BackendInfo, Health, validate_settings
from otel_plumb.decision.contract import BackendConfig, DecisionSpec
from otel_plumb.decision.errors import BackendError, ContractError, InvalidResponse
from otel_plumb.decision.httpclient import ChatClient, check_url, redact_url
from otel_plumb.decision.model import Prediction, Request
from otel_plumb.decision.validation import Strict

LETTERS = string.ascii_uppercase


class OpenAISettings(Strict):
    url: str
    """Base URL of the API, e.g. http://127.0.0.1:8080/v1 (``/chat/completions`` is appended)."""
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout_s: float = Field(default=60.0, gt=0.0, le=600.0)
    max_retries: int = Field(default=0, ge=0, le=5)
    retry_backoff_s: float = Field(default=0.5, ge=0.0, le=60.0)
    instructions: str | None = None
    """System message; defaults to decision.description."""
    options: Literal["letters", "labels"] = "letters"
    top_logprobs: int = Field(default=20, ge=1, le=20)
    seed: int | None = 0
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)

    _u = field_validator("url")(check_url)


def _token_key(token: str) -> str:
    return token.strip().strip("()[].:*\"'").strip().casefold()


class OpenAIBackend(Backend):
    provider = "openai"
    concurrent = True

    def __init__(
        self, settings: OpenAISettings, *, decision: DecisionSpec, name: str = "default", model: str | None = None
    ) -> None:
        super().__init__(name=name, model=model)
        self.settings = settings
        self.instructions = (
            settings.instructions
            or decision.description
            or (f"Decide '{decision.name}' for the user's input by choosing exactly one of the options.")
        )
        self.client = ChatClient(
            settings.url,
            api_key_env=settings.api_key_env,
            timeout_s=settings.timeout_s,
            max_retries=settings.max_retries,
            retry_backoff_s=settings.retry_backoff_s,
            who=f"backend {name!r}",
        )

    @classmethod
    def from_config(cls, config: BackendConfig, *, name: str, decision: DecisionSpec) -> Backend:
        if len(decision.labels) > len(LETTERS):
            raise ContractError(f"openai backend {name!r}: at most {len(LETTERS)} options can be lettered")
        return cls(
            validate_settings(OpenAISettings, config, name=name), decision=decision, name=name, model=config.model
        )

    def prompt(self, request: Request) -> str:
        value = request.input
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
        labels = request.decision.labels
        if self.settings.options == "letters":
            listed = "\n".join(f"{LETTERS[i]}) {label}" for i, label in enumerate(labels))
            ask = "Answer with the letter of one option only."
        else:
            listed = "\n".join(f"- {label}" for label in labels)
            ask = "Answer with one option only."
        return f"{text}\n\nOptions:\n{listed}\n\n{ask}"

    def _label_of(self, token: str, labels: tuple[str, ...]) -> str | None:
        """The option a token names: a letter, or the start of exactly one label (models often
        answer with the first sub-word token of a label)."""
        key = _token_key(token)
        if not key:
            return None
        if self.settings.options == "letters":
            index = LETTERS.find(key.upper()) if len(key) == 1 else -1
            return labels[index] if 0 <= index < len(labels) else None
        named = [label for label in labels if _token_key(label).startswith(key)]
        return named[0] if len(named) == 1 else None

    async def predict(self, request: Request) -> Prediction:
        payload: dict[str, Any] = {
            "model": self.model or "default",
            "messages": [
                {"role": "system", "content": self.instructions},
                {"role": "user", "content": self.prompt(request)},
            ],
            "max_tokens": 1,
            "temperature": self.settings.temperature,
            "logprobs": True,
            "top_logprobs": self.settings.top_logprobs,
        }
        if self.settings.seed is not None:
            payload["seed"] = self.settings.seed
        body = await self.client.complete(payload)
        return self._parse(body, request.decision.labels)

    def _parse(self, body: Any, labels: tuple[str, ...]) -> Prediction:
        try:
            choice = body["choices"][0]
            top = choice["logprobs"]["content"][0]["top_logprobs"]
        except (KeyError, IndexError, TypeError) as exc:
            raise InvalidResponse(
                f"backend {self.name!r} returned no top logprobs (does the server support them?)"
            ) from exc
        mass = dict.fromkeys(labels, 0.0)
        for item in top:
            if not isinstance(item, dict) or not isinstance(item.get("token"), str):
                raise InvalidResponse(f"backend {self.name!r} returned a malformed top_logprobs entry")
            logprob = item.get("logprob")
            if isinstance(logprob, bool) or not isinstance(logprob, (int, float)) or math.isnan(logprob) or logprob > 0:
                raise InvalidResponse(f"backend {self.name!r} returned logprob {logprob!r}")
            label = self._label_of(item["token"], labels)
            if label is not None:
                mass[label] += math.exp(logprob)
        total = math.fsum(mass.values())
        if total <= 0.0:
            raise InvalidResponse(f"backend {self.name!r}: no option among the top {len(top)} tokens")
        message = choice.get("message") or {}
        metadata = {
            "seed": self.settings.seed,
            "system_fingerprint": body.get("system_fingerprint"),
            "option_mass": total,
            "options_missing": [label for label in labels if mass[label] == 0.0],
            "answer": message.get("content") if isinstance(message, dict) else None,
        }
        model = body.get("model") if isinstance(body.get("model"), str) else None
        return Prediction({label: m / total for label, m in mass.items()}, model=model, metadata=metadata)

    async def healthcheck(self) -> Health:
        base = self.client.url.removesuffix("/chat/completions")
        try:
            status, _, _ = await self.client.send("GET", base + "/models")
        except BackendError as exc:
            return Health("unhealthy", str(exc))
        return Health("ok" if 200 <= status < 300 else "unhealthy", f"HTTP {status}")

    def info(self) -> BackendInfo:
        details = {"url": redact_url(self.settings.url), "options": self.settings.options, "seed": self.settings.seed}
        return BackendInfo(self.name, self.provider, self.model, details=details)

    async def aclose(self) -> None:
        await self.client.aclose()
