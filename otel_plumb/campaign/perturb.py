"""Perturbations: meaning-preserving changes to a case, as replayable lists of steps.

Every variant is generated once per case, deterministically from (seed, perturbation, case
id) with a SHA-256 stream, and is a list of steps (``repeat``, ``replace_input``,
``insert_text``, ``add_tool``, ``fault``, ``temperature``). Steps are stored with the run, so
a variant can be replayed exactly and minimised by removing steps.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from otel_plumb.campaign.config import Case, LoadedCampaign, Paraphrase, Perturbations

T = TypeVar("T")
PERTURBATIONS = ("baseline", "paraphrase", "distractor", "decoy_tools", "tool_fault", "sampling")


class Stream:
    """A deterministic random stream: SHA-256 over (seed, labels, block counter)."""

    def __init__(self, seed: int, *labels: str) -> None:
        self._key = json.dumps([seed, *labels]).encode()
        self._counter = 0
        self._buf = b""

    def _bytes(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._buf += hashlib.sha256(self._key + self._counter.to_bytes(8, "big")).digest()
            self._counter += 1
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def below(self, n: int) -> int:
        """Uniform integer in [0, n), by rejection so there is no modulo bias."""
        if n <= 0:
            raise ValueError("n must be positive")
        limit = (1 << 64) - (1 << 64) % n
        while True:
            x = int.from_bytes(self._bytes(8), "big")
            if x < limit:
                return x % n

    def choice(self, items: Sequence[T]) -> T:
        return items[self.below(len(items))]

    def shuffled(self, items: Sequence[T]) -> list[T]:
        out = list(items)
        for i in range(len(out) - 1, 0, -1):
            j = self.below(i + 1)
            out[i], out[j] = out[j], out[i]
        return out

    def seed32(self) -> int:
        return self.below(1 << 31)


@dataclass(slots=True)
class Variant:
    variant_id: str
    case_id: str
    perturbation: str
    steps: list[dict[str, Any]]


@dataclass(slots=True)
class Discard:
    case_id: str
    perturbation: str
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class AgentInput:
    """What a variant changes in the request an agent receives."""

    input: str
    extra_tools: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    temperature: float | None = None


def apply_steps(case: Case, steps: Sequence[dict[str, Any]]) -> AgentInput:
    """Apply a variant's steps to a case. Insertions carry offsets into the case's original
    input, so any subset of the steps (minimisation) is still well defined."""
    text = case.input
    out = AgentInput(text)
    inserts: list[tuple[int, int, str]] = []
    for n, step in enumerate(steps):
        op = step["op"]
        if op == "replace_input":
            text = step["text"]
        elif op == "insert_text":
            inserts.append((int(step["at"]), n, str(step["text"])))
        elif op == "add_tool":
            out.extra_tools.append(step["tool"])
        elif op == "fault":
            out.faults.append({"tool": step["tool"], "error": step["error"], "times": int(step.get("times", 1))})
        elif op == "temperature":
            out.temperature = float(step["value"])
        elif op != "repeat":
            raise ValueError(f"unknown step op {op!r}")
    for at, _, fragment in sorted(inserts, reverse=True):
        at = min(at, len(text))
        text = text[:at] + fragment + text[at:]
    out.input = text
    return out


_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def sentence_boundaries(text: str) -> list[int]:
    """Offsets where a sentence may be inserted: the start, after each sentence end, the end."""
    points = {0, len(text)}
    for m in _SENTENCE_END.finditer(text):
        points.add(m.end())
    return sorted(points)


def _fragment_at(text: str, at: int, fragment: str) -> str:
    """The inserted text, spaced so it reads as a sentence of its own."""
    sentence = fragment.strip()
    if sentence and sentence[-1] not in ".!?":
        sentence += "."
    if at == 0:
        return sentence + " "
    return " " + sentence


# Paraphrase generators: (case, spec, stream) -> (candidates, provenance recorded on each step)
Paraphraser = Callable[[Case, Paraphrase, Stream], tuple[list[str], dict[str, Any]]]
# Equivalence guards: (original, candidate) -> (accepted, score or None, reason)
GuardFn = Callable[[str, str], tuple[bool, float | None, str]]


def generate_variants(
    campaign: LoadedCampaign,
    cases: Sequence[Case],
    paraphraser: Paraphraser | None = None,
    guard: GuardFn | None = None,
) -> tuple[list[Variant], list[Discard]]:
    spec: Perturbations = campaign.spec.perturbations
    seed = campaign.spec.seed
    variants: list[Variant] = []
    discards: list[Discard] = []
    for case in cases:
        def add(name: str, n: int, steps: list[dict[str, Any]], case: Case = case) -> None:
            variants.append(Variant(f"{case.id}/{name}-{n}", case.id, name, steps))

        if spec.baseline:
            for n in range(spec.baseline.repeats):
                add("baseline", n, [{"op": "repeat", "n": n}])
        if spec.paraphrase:
            if paraphraser is None or guard is None:
                raise ValueError("paraphrase needs a paraphraser and a guard")
            accepted, rejected = _paraphrases(case, spec.paraphrase, Stream(seed, "paraphrase", case.id), paraphraser,
                                              guard)
            for n, step in enumerate(accepted):
                add("paraphrase", n, [step])
            discards.extend(rejected)
        if spec.distractor:
            d = spec.distractor
            for n in range(d.samples):
                stream = Stream(seed, "distractor", case.id, str(n))
                points = sentence_boundaries(case.input)
                steps = []
                for _ in range(d.insertions):
                    at = stream.choice(points)
                    steps.append({"op": "insert_text", "at": at,
                                  "text": _fragment_at(case.input, at, stream.choice(d.fragments))})
                add("distractor", n, steps)
        if spec.decoy_tools:
            # Distinct tools across a case's variants until they run out, then round again.
            dt = spec.decoy_tools
            order = Stream(seed, "decoy_tools", case.id).shuffled(dt.tools)
            for n in range(dt.samples):
                picked = [order[(n * dt.per_variant + j) % len(order)] for j in range(min(dt.per_variant, len(order)))]
                add("decoy_tools", n, [{"op": "add_tool", "tool": t.model_dump()} for t in picked])
        if spec.tool_fault:
            # Distinct (tool, error) pairs across a case's variants until they run out.
            tf = spec.tool_fault
            pairs = Stream(seed, "tool_fault", case.id).shuffled([(t, e) for t in tf.targets for e in tf.errors])
            for n in range(tf.samples):
                tool, error = pairs[n % len(pairs)]
                add("tool_fault", n, [{"op": "fault", "tool": tool, "error": error, "times": tf.times}])
        if spec.sampling:
            for n in range(spec.sampling.samples):
                temperature = {"op": "temperature", "value": spec.sampling.temperature}
                add("sampling", n, [temperature, {"op": "repeat", "n": n}])
    return variants, discards


def _paraphrases(
    case: Case, spec: Paraphrase, stream: Stream, paraphraser: Paraphraser, guard: GuardFn
) -> tuple[list[dict[str, Any]], list[Discard]]:
    """Every candidate goes through the guard (so discards are counted even when enough
    survive); ``samples`` of the survivors are drawn from the stream."""
    candidates, provenance = paraphraser(case, spec, stream)
    survivors: list[dict[str, Any]] = []
    rejected: list[Discard] = []
    seen = {" ".join(case.input.split()).casefold()}
    for text in candidates:
        norm = " ".join(text.split()).casefold()
        if not norm or norm in seen:
            rejected.append(Discard(case.id, "paraphrase", "not a paraphrase (empty, duplicate or unchanged)",
                                    {"text": text}))
            continue
        seen.add(norm)
        ok, score, reason = guard(case.input, text)
        if not ok:
            rejected.append(Discard(case.id, "paraphrase", reason, {"text": text, "score": score}))
            continue
        survivors.append({"op": "replace_input", "text": text, "guard_score": score, **provenance})
    if not candidates:
        rejected.append(Discard(case.id, "paraphrase", "the provider returned no paraphrase", provenance))
    return stream.shuffled(survivors)[: spec.samples], rejected
