"""Paraphrase providers and the equivalence guard, independent of each other.

Providers: ``file`` (one row per case), ``openai`` (any OpenAI-compatible chat server; the
model and its system_fingerprint are recorded on each variant), or a plugin registered in
the entry-point group ``otel_plumb.paraphrase`` as ``fn(case_input, n, seed, options) ->
list[str]``. Guards: ``embedding`` (cosine similarity of all-MiniLM-L6-v2 embeddings),
``judge`` (a second model asked whether the meaning is the same), ``none``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from otel_plumb.campaign.config import CampaignError, Case, Guard, LoadedCampaign, Paraphrase, jsonl_rows
from otel_plumb.campaign.perturb import GuardFn, Paraphraser, Stream

ENTRY_POINT_GROUP = "otel_plumb.paraphrase"


def load_paraphrase_file(path: Path) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Rows ``{"id": case id, "paraphrases": [...]}`` or ``{"input": text, "paraphrases": [...]}``."""
    by_id: dict[str, list[str]] = {}
    by_input: dict[str, list[str]] = {}
    for n, row in jsonl_rows(path):
        texts = row.get("paraphrases") if isinstance(row, dict) else None
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise CampaignError(path, n, 'a row is {"id": ..., "paraphrases": ["...", ...]}')
        if "id" in row:
            by_id.setdefault(str(row["id"]), []).extend(texts)
        elif isinstance(row.get("input"), str):
            by_input.setdefault(" ".join(row["input"].split()), []).extend(texts)
        else:
            raise CampaignError(path, n, 'a row needs "id" (a case id) or "input" (the case text)')
    return by_id, by_input


def _chat(base_url: str, model: str, api_key_env: str | None, messages: list[dict[str, str]],
          **params: Any) -> dict[str, Any]:
    body = json.dumps({"model": model, "messages": messages, **params}).encode()
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
        raise RuntimeError(f"{base_url}: {e}") from e


def make_paraphraser(campaign: LoadedCampaign, spec: Paraphrase) -> Paraphraser:
    source = spec.source
    if source.provider == "file":
        assert source.path is not None
        by_id, by_input = load_paraphrase_file(campaign.resolve(source.path))

        def from_file(case: Case, _spec: Paraphrase, _stream: Stream) -> tuple[list[str], dict[str, Any]]:
            texts = by_id.get(case.id) or by_input.get(" ".join(case.input.split())) or []
            return list(texts), {"source": "file"}

        return from_file
    if source.provider == "openai":
        assert source.base_url is not None and source.model is not None
        base_url, model = source.base_url, source.model

        def from_model(case: Case, _spec: Paraphrase, stream: Stream) -> tuple[list[str], dict[str, Any]]:
            texts: list[str] = []
            provenance: dict[str, Any] = {"source": "openai", "model": model}
            for _ in range(source.candidates):
                answer = _chat(base_url, model, source.api_key_env, [
                    {"role": "system", "content": "Rewrite the user's request in different words. Keep every "
                     "fact, name, number and identifier exactly. Reply with the rewritten request only."},
                    {"role": "user", "content": case.input},
                ], temperature=source.temperature, seed=stream.seed32(), max_tokens=400)
                provenance["model"] = answer.get("model", model)
                provenance["system_fingerprint"] = answer.get("system_fingerprint")
                choices = answer.get("choices") or []
                text = (choices[0].get("message") or {}).get("content") if choices else None
                if isinstance(text, str) and text.strip():
                    texts.append(text.strip())
            return texts, provenance

        return from_model
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == source.provider]
    if not found:
        raise CampaignError(campaign.path, None, f"unknown paraphrase provider {source.provider!r} (not file, openai, "
                            f"nor a plugin in entry-point group {ENTRY_POINT_GROUP})")
    plugin = found[0].load()

    def from_plugin(case: Case, _spec: Paraphrase, stream: Stream) -> tuple[list[str], dict[str, Any]]:
        texts = plugin(case.input, source.candidates, stream.seed32(), dict(source.options))
        return [t for t in texts if isinstance(t, str)], {"source": f"plugin:{source.provider}"}

    return from_plugin


def make_guard(campaign: LoadedCampaign, spec: Guard) -> GuardFn:
    if spec.provider == "none":
        return lambda _a, _b: (True, None, "")
    if spec.provider == "embedding":
        from otel_plumb.campaign.embedding import EmbeddingUnavailable, default_model

        try:
            model = default_model()
        except EmbeddingUnavailable as e:
            raise CampaignError(campaign.path, None, f"paraphrase guard: {e}") from None
        floor = spec.min_similarity

        def by_embedding(original: str, candidate: str) -> tuple[bool, float | None, str]:
            score = round(model.similarity(original, candidate), 4)
            if score < floor:
                return False, score, f"embedding similarity {score:.3f} below {floor}"
            return True, score, ""

        return by_embedding
    assert spec.base_url is not None and spec.model is not None
    base_url, model_name = spec.base_url, spec.model

    def by_judge(original: str, candidate: str) -> tuple[bool, float | None, str]:
        answer = _chat(base_url, model_name, spec.api_key_env, [
            {"role": "system", "content": "You decide whether two requests ask for exactly the same thing, with the "
             "same facts, names, numbers and identifiers. Answer yes or no."},
            {"role": "user", "content": f"A: {original}\nB: {candidate}\nSame meaning?"},
        ], temperature=0, max_tokens=3)
        choices = answer.get("choices") or []
        text = str((choices[0].get("message") or {}).get("content", "")) if choices else ""
        if text.strip().lower().startswith("yes"):
            return True, 1.0, ""
        return False, 0.0, f"judge {model_name} said the meaning differs ({text.strip()[:40]!r})"

    return by_judge
