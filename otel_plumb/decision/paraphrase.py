"""Paraphrase providers: identity, file (curated JSONL), openai (any OpenAI-compatible
chat-completions server), and plugins: a ``Paraphraser`` subclass under the
``otel_plumb.decision_paraphrasers`` entry-point group, or one written for DecGuard under
``decguard.paraphrasers``."""

from __future__ import annotations

import asyncio
import hashlib
import json
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationError, field_validator

from otel_plumb.decision.contract import ParaphraseSource
from otel_plumb.decision.errors import BackendTimeout, BackendUnavailable, ContractError, ParaphraseError
from otel_plumb.decision.httpclient import ChatClient, check_url, redact_url
from otel_plumb.decision.validation import Strict, format_errors, unique_keys

ENTRY_POINT_GROUP = "otel_plumb.decision_paraphrasers"
DECGUARD_GROUP = "decguard.paraphrasers"


class Paraphraser:
    provider: ClassVar[str] = ""
    deterministic: ClassVar[bool] = True
    """False when the same request may give other text (replay then uses the stored text)."""

    @classmethod
    def from_config(cls, source: ParaphraseSource, *, base_dir: Path) -> Paraphraser:
        raise ContractError(f"paraphraser {cls.provider!r} cannot be configured from a contract")

    async def paraphrase(self, text: str, *, case_id: str, n: int, seed: int) -> list[str]:
        raise NotImplementedError

    def provenance(self) -> dict[str, Any]:
        return {"provider": self.provider}

    async def aclose(self) -> None:
        return None


def _settings(model: type[Strict], source: ParaphraseSource) -> Any:
    try:
        return model.model_validate(source.settings)
    except ValidationError as exc:
        raise ContractError(
            f"invalid settings for paraphraser {source.provider!r}:\n"
            + format_errors(exc, prefix="properties.paraphrase.source")
        ) from exc


class _NoSettings(Strict):
    pass


class IdentityParaphraser(Paraphraser):
    provider = "identity"

    @classmethod
    def from_config(cls, source: ParaphraseSource, *, base_dir: Path) -> Paraphraser:
        _settings(_NoSettings, source)
        return cls()

    async def paraphrase(self, text: str, *, case_id: str, n: int, seed: int) -> list[str]:
        return [text]


class FileSettings(Strict):
    path: str = Field(min_length=1)


class FileParaphraser(Paraphraser):
    """Rows ``{"id": <case id>, "paraphrases": [...]}`` or ``{"input": <text>, ...}``; ids first."""

    provider = "file"

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ContractError(f"{path}: cannot read paraphrases: {exc.strerror or exc}") from exc
        self.hash = "sha256:" + hashlib.sha256(raw).hexdigest()
        self.by_id: dict[str, list[str]] = {}
        self.by_text: dict[str, list[str]] = {}
        for lineno, line in enumerate(raw.decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line, object_pairs_hook=unique_keys)
            except ValueError as exc:
                raise ContractError(f"{path}: line {lineno}: invalid JSON: {exc}") from exc
            found = row.get("paraphrases") if isinstance(row, dict) else None
            if not isinstance(found, list) or not all(isinstance(p, str) and p for p in found):
                raise ContractError(f"{path}: line {lineno}: 'paraphrases' must be a list of non-empty strings")
            if isinstance(row.get("id"), str):
                self.by_id[row["id"]] = found
            elif isinstance(row.get("input"), str):
                self.by_text[row["input"]] = found
            else:
                raise ContractError(f"{path}: line {lineno}: needs a string 'id' or 'input'")

    @classmethod
    def from_config(cls, source: ParaphraseSource, *, base_dir: Path) -> Paraphraser:
        return cls(base_dir / _settings(FileSettings, source).path)

    async def paraphrase(self, text: str, *, case_id: str, n: int, seed: int) -> list[str]:
        return self.by_id.get(case_id, self.by_text.get(text, []))[:n]

    def provenance(self) -> dict[str, Any]:
        return {"provider": self.provider, "path": str(self.path), "hash": self.hash}


DEFAULT_INSTRUCTIONS = (
    "Paraphrase the user's text {n} times. Keep every fact, name, number, negation and the "
    "meaning exactly the same; change only the wording. Answer with a JSON array of {n} "
    "strings and nothing else."
)


class OpenAIParaphraseSettings(Strict):
    model: str = Field(min_length=1)
    url: str = "https://api.openai.com/v1"
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout_s: float = Field(default=60.0, gt=0.0, le=600.0)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    instructions: str = DEFAULT_INSTRUCTIONS
    _u = field_validator("url")(check_url)


class OpenAIParaphraser(Paraphraser):
    provider = "openai"
    deterministic = False

    def __init__(self, settings: OpenAIParaphraseSettings) -> None:
        self.settings = settings
        self.client = ChatClient(
            settings.url,
            api_key_env=settings.api_key_env,
            timeout_s=settings.timeout_s,
            max_retries=0,
            retry_backoff_s=0.0,
            who="paraphraser",
        )
        self._seen: dict[str, Any] = {}

    @classmethod
    def from_config(cls, source: ParaphraseSource, *, base_dir: Path) -> Paraphraser:
        return cls(_settings(OpenAIParaphraseSettings, source))

    async def paraphrase(self, text: str, *, case_id: str, n: int, seed: int) -> list[str]:
        payload = {
            "model": self.settings.model,
            "temperature": self.settings.temperature,
            "seed": seed,
            "messages": [
                {"role": "system", "content": self.settings.instructions.format(n=n)},
                {"role": "user", "content": text},
            ],
        }
        try:
            body = await self.client.complete(payload)
        except (BackendTimeout, BackendUnavailable):
            raise
        except Exception as exc:
            raise ParaphraseError(str(exc)) from exc
        try:
            content = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise ParaphraseError("paraphraser response has no message content") from exc
        self._seen = {k: body[k] for k in ("model", "system_fingerprint") if isinstance(body.get(k), str)}
        return parse_list(content)[:n]

    def provenance(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.settings.model,
            "url": redact_url(self.settings.url),
            "temperature": self.settings.temperature,
            **{f"response_{key}": value for key, value in self._seen.items()},
        }

    async def aclose(self) -> None:
        await self.client.aclose()


def parse_list(content: Any) -> list[str]:
    if not isinstance(content, str):
        raise ParaphraseError("paraphraser message content is not text")
    text = content.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise ParaphraseError("paraphraser did not answer with a JSON array") from exc
    if not isinstance(items, list) or not all(isinstance(i, str) and i.strip() for i in items):
        raise ParaphraseError("paraphraser did not answer with a JSON array of strings")
    return [item.strip() for item in items]


BUILTIN: dict[str, type[Paraphraser]] = {
    p.provider: p for p in (IdentityParaphraser, FileParaphraser, OpenAIParaphraser)
}


class DecGuardParaphraser(Paraphraser):
    """A paraphraser written for DecGuard (``decguard.paraphrasers``), run in a worker thread."""

    deterministic = False

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def paraphrase(self, text: str, *, case_id: str, n: int, seed: int) -> list[str]:
        from decguard.errors import BackendError as TheirBackendError

        try:
            found = await asyncio.to_thread(self.inner.paraphrase, text, case_id=case_id, n=n, seed=seed)
        except TheirBackendError as exc:
            raise ParaphraseError(str(exc)) from exc
        return list(found)

    def provenance(self) -> dict[str, Any]:
        return dict(self.inner.provenance())

    async def aclose(self) -> None:
        await asyncio.to_thread(self.inner.close)


def _decguard_paraphraser(source: ParaphraseSource, base_dir: Path) -> Paraphraser | None:
    matches = tuple(entry_points(group=DECGUARD_GROUP, name=source.provider))
    if not matches:
        return None
    from decguard.contracts.properties import ParaphraseSource as TheirSource
    from decguard.errors import DecGuardError
    from decguard.fuzz.paraphrase import Paraphraser as TheirParaphraser

    try:
        loaded = matches[0].load()
        if not (isinstance(loaded, type) and issubclass(loaded, TheirParaphraser)):
            raise ContractError(f"paraphraser {source.provider!r} ({matches[0].value}) is not a Paraphraser")
        return DecGuardParaphraser(
            loaded.from_config(TheirSource.model_validate(source.model_dump()), base_dir=base_dir)
        )
    except DecGuardError as exc:
        raise ContractError(str(exc)) from exc


def create_paraphraser(source: ParaphraseSource, *, base_dir: Path) -> Paraphraser:
    cls = BUILTIN.get(source.provider)
    if cls is None:
        matches = tuple(entry_points(group=ENTRY_POINT_GROUP, name=source.provider))
        if not matches:
            adapted = _decguard_paraphraser(source, base_dir)
            if adapted is not None:
                return adapted
            groups = (ENTRY_POINT_GROUP, DECGUARD_GROUP)
            available = sorted(set(BUILTIN) | {ep.name for g in groups for ep in entry_points(group=g)})
            raise ContractError(f"unknown paraphrase provider {source.provider!r}; available: {', '.join(available)}")
        try:
            loaded = matches[0].load()
        except Exception as exc:
            raise ContractError(f"cannot load paraphraser {source.provider!r}: {exc}") from exc
        if not (isinstance(loaded, type) and issubclass(loaded, Paraphraser)):
            raise ContractError(f"paraphraser {source.provider!r} ({matches[0].value}) is not a Paraphraser")
        cls = loaded
    return cls.from_config(source, base_dir=base_dir)
