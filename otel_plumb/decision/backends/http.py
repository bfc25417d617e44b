"""Generic HTTP backend speaking ``decguard.http/0.1``::

POST <url>  {"protocol": "decguard.http/0.1", "case_id": ..., "model": ... | null,
             "decision": {"name": ..., "type": ..., "labels": [labels as shown]}, "input": ...}
200 OK      {"probabilities": {"<label>": p, ...}, "model"?, "model_version"?, "metadata"?}
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator
from yarl import URL

from otel_plumb.decision.backends.base import Backend, BackendInfo, Health, validate_settings
from otel_plumb.decision.contract import BackendConfig, DecisionSpec
from otel_plumb.decision.errors import BackendError, ContractError, InvalidResponse
from otel_plumb.decision.httpclient import RETRYABLE_STATUS, HttpClient, check_url, env_value, redact_url
from otel_plumb.decision.model import Prediction, Request
from otel_plumb.decision.validation import Strict

PROTOCOL = "decguard.http/0.1"
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key"})


class HttpSettings(Strict):
    url: str
    health_url: str | None = None
    timeout_s: float = Field(default=30.0, gt=0.0, le=600.0)
    max_retries: int = Field(default=0, ge=0, le=5)
    retry_backoff_s: float = Field(default=0.5, ge=0.0, le=60.0)
    headers: dict[str, str] = Field(default_factory=dict)
    headers_from_env: dict[str, str] = Field(default_factory=dict)
    bearer_token_env: str | None = None
    label_map: dict[str, str] = Field(default_factory=dict)
    """Backend label -> contract label."""

    _u = field_validator("url", "health_url")(check_url)

    @field_validator("headers")
    @classmethod
    def _no_literal_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        for header in value:
            if header.lower() in SECRET_HEADERS:
                raise ValueError(
                    f"{header!r} looks like a credential; put it in an environment variable "
                    "and use headers_from_env or bearer_token_env"
                )
        return value

    @model_validator(mode="after")
    def _one_authorization_source(self) -> HttpSettings:
        if self.bearer_token_env and "authorization" in {h.lower() for h in self.headers_from_env}:
            raise ValueError("set either bearer_token_env or an Authorization header, not both")
        if self.health_url is not None and (self.bearer_token_env or self.headers_from_env):
            target, health = URL(self.url), URL(self.health_url)
            if (target.scheme, target.host, target.port) != (health.scheme, health.host, health.port):
                raise ValueError("health_url must use the backend URL's origin when environment headers are configured")
        return self


class HttpBackend(Backend):
    provider = "http"
    concurrent = True
    protocol: ClassVar[str] = PROTOCOL
    retryable_status: ClassVar[frozenset[int]] = RETRYABLE_STATUS

    def __init__(self, settings: HttpSettings, *, name: str = "default", model: str | None = None) -> None:
        super().__init__(name=name, model=model)
        self.settings = settings
        self._reverse = {v: k for k, v in settings.label_map.items()}
        self.client = HttpClient(
            headers=self._headers,
            timeout_s=settings.timeout_s,
            max_retries=settings.max_retries,
            retry_backoff_s=settings.retry_backoff_s,
            who=f"backend {name!r}",
            retryable=self.retryable_status,
        )

    @classmethod
    def from_config(cls, config: BackendConfig, *, name: str, decision: DecisionSpec) -> Backend:
        settings = validate_settings(HttpSettings, config, name=name)
        cls.check_label_map(settings, decision, name=name)
        return cls(settings, name=name, model=config.model)

    @classmethod
    def check_label_map(cls, settings: HttpSettings, decision: DecisionSpec, *, name: str) -> None:
        targets = list(settings.label_map.values())
        unknown = sorted(set(targets) - set(decision.labels))
        if unknown:
            raise ContractError(f"{cls.provider} backend {name!r}: label_map targets {unknown} are not contract labels")
        if len(set(targets)) != len(targets):
            raise ContractError(f"{cls.provider} backend {name!r}: label_map maps two labels to one")

    def _headers(self) -> dict[str, str]:
        headers = dict(self.settings.headers)
        for header, variable in self.settings.headers_from_env.items():
            headers[header] = env_value(variable, f"http backend {self.name!r}")
        if self.settings.bearer_token_env:
            headers["Authorization"] = "Bearer " + env_value(
                self.settings.bearer_token_env, f"http backend {self.name!r}"
            )
        return headers

    async def predict(self, request: Request) -> Prediction:
        payload = {
            "protocol": PROTOCOL,
            "case_id": request.case_id,
            "model": self.model,
            "decision": {
                "name": request.decision.name,
                "type": request.decision.type,
                "labels": [self._reverse.get(label, label) for label in request.decision.labels],
            },
            "input": request.input,
        }
        return self._parse(await self.client.post_json(self.settings.url, payload))

    def _parse(self, body: Any) -> Prediction:
        if not isinstance(body, dict) or not isinstance(body.get("probabilities"), dict):
            raise InvalidResponse(f"backend {self.name!r} response has no 'probabilities' object")
        probabilities: dict[str, Any] = {}
        for label, value in body["probabilities"].items():
            mapped = self.settings.label_map.get(label, label)
            if mapped in probabilities:
                raise InvalidResponse(f"backend {self.name!r} returned label {mapped!r} twice")
            probabilities[mapped] = value
        model, version, metadata = body.get("model"), body.get("model_version"), body.get("metadata")
        if model is not None and not isinstance(model, str):
            raise InvalidResponse("'model' must be a string")
        if version is not None and not isinstance(version, str):
            raise InvalidResponse("'model_version' must be a string")
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidResponse("'metadata' must be an object")
        return Prediction(probabilities, model, version, metadata or {})

    async def healthcheck(self) -> Health:
        if self.settings.health_url is None:
            return Health("unknown", "no health_url configured")
        try:
            status, _, _ = await self.client.send("GET", self.settings.health_url)
        except BackendError as exc:
            return Health("unhealthy", str(exc))
        return Health("ok" if 200 <= status < 300 else "unhealthy", f"HTTP {status}")

    def info(self) -> BackendInfo:
        return BackendInfo(
            self.name,
            self.provider,
            self.model,
            details={"url": redact_url(self.settings.url), "protocol": self.protocol},
        )

    async def aclose(self) -> None:
        await self.client.aclose()
