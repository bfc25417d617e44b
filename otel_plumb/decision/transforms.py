"""Controlled, replayable transformations.

A transformation is a list of JSON-serialisable steps applied to an original case:
``apply(original, steps)`` is pure, so a stored failure regenerates from its seed, replays, and
shrinks by trying smaller step lists (``reductions``). Option presentation is kept apart from
the input: ``presentation`` lists (shown label, contract label) pairs in the order the backend
sees them; ``None`` means the contract labels in canonical order.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_plumb.decision.contract import (
    DecisionSpec,
    Fuzz,
    Inversion,
    IrrelevantContext,
    LabelFormat,
    Monotonic,
    OptionOrder,
    Paraphrase,
    PropertyConfig,
    RepeatedContext,
    Whitespace,
)
from otel_plumb.decision.model import Case, DecisionInput
from otel_plumb.decision.paraphrase import Paraphraser
from otel_plumb.decision.rng import Rng

Step = dict[str, Any]
Steps = tuple[Step, ...]
Presentation = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Mutation:
    steps: Steps
    input: DecisionInput
    presentation: Presentation | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    def is_no_op(self, original: DecisionInput) -> bool:
        return self.input == original and self.presentation is None


class NotApplicable(Exception):
    """The property cannot transform this case; the message says why."""


def get_text(value: DecisionInput, text_field: str | None) -> str:
    if isinstance(value, str):
        return value
    if text_field is None:
        raise NotApplicable("object input has no text to transform (set fuzz.text_field)")
    text = value.get(text_field)
    if not isinstance(text, str):
        raise NotApplicable(f"input field {text_field!r} is missing or not a string")
    return text


def set_text(value: DecisionInput, text_field: str | None, text: str) -> DecisionInput:
    if isinstance(value, str) or text_field is None:
        return text
    return {**value, text_field: text}


_SENTENCE_BREAK = re.compile(r"(?<=[.!?])(\s+)")
_WHITESPACE = re.compile(r"\s+")
_RUN_VARIANTS = ("  ", "\n", "\t", " \n")
_EDGE_VARIANTS = {"start": (" ", "\n"), "end": (" ", "\n", "  \n")}


def insert_fragments(text: str, steps: Sequence[Step]) -> str:
    """Insert each step's text before sentence ``at`` (at the end when ``at`` is the count)."""
    parts = _SENTENCE_BREAK.split(text)
    sentences, separators = parts[0::2], parts[1::2]
    out: list[str] = []
    for index, sentence in enumerate(sentences):
        out.extend(step["text"] + " " for step in steps if step["at"] == index)
        out.append(sentence)
        if index < len(separators):
            out.append(separators[index])
    out.extend(" " + step["text"] for step in steps if step["at"] == len(sentences))
    return "".join(out)


def replace_whitespace(text: str, steps: Sequence[Step]) -> str:
    """Replace whitespace run ``at`` (or add at "start"/"end") with ``ws``."""
    replacements: dict[int | str, str] = {step["at"]: step["ws"] for step in steps}
    pieces, position = [], 0
    for index, match in enumerate(_WHITESPACE.finditer(text)):
        pieces.append(text[position : match.start()])
        pieces.append(replacements.get(index, match.group()))
        position = match.end()
    pieces.append(text[position:])
    return replacements.get("start", "") + "".join(pieces) + replacements.get("end", "")


def format_label(label: str, style: str, index: int) -> str:
    if style == "upper":
        return label.upper()
    if style == "lower":
        return label.lower()
    if style == "capitalized":
        return label[:1].upper() + label[1:]
    if style == "lettered":
        return f"{chr(ord('A') + index) if index < 26 else index + 1}) {label}"
    if style == "numbered":
        return f"{index + 1}. {label}"
    if style == "quoted":
        return f'"{label}"'
    return f"[{label}]"


def _canonical(presentation: Presentation, labels: Sequence[str]) -> Presentation | None:
    return None if presentation == tuple((label, label) for label in labels) else presentation


def _drop_one(steps: Steps) -> Iterator[Steps]:
    if len(steps) > 1:
        for index in range(len(steps)):
            yield steps[:index] + steps[index + 1 :]


class Transform:
    """Generates step lists for a case and applies them. Subclasses set ``name``."""

    name: str = ""
    keeps_no_ops = False
    """Identity paraphrases test determinism, so they are kept although they change nothing."""

    def __init__(self, config: Any, spec: DecisionSpec, fuzz: Fuzz) -> None:
        self.config = config
        self.spec = spec
        self.fuzz = fuzz

    async def candidates(self, case: Case, rng: Rng) -> list[Steps]:
        raise NotImplementedError

    def apply(self, original: DecisionInput, steps: Steps) -> Mutation:
        raise NotImplementedError

    def reductions(self, steps: Steps) -> Iterator[Steps]:
        """Smaller step lists to try while minimising."""
        return iter(())

    async def generate(self, case: Case, rng: Rng) -> list[Mutation]:
        """Distinct transformations of ``case``, leaving out ones that change nothing."""
        mutations: list[Mutation] = []
        for steps in await self.candidates(case, rng):
            mutation = self.apply(case.input, steps)
            if not self.keeps_no_ops and mutation.is_no_op(case.input):
                continue
            if all((m.input, m.presentation) != (mutation.input, mutation.presentation) for m in mutations):
                mutations.append(mutation)
        if not mutations:
            raise NotApplicable("no transformation changes this case")
        return mutations

    def _text(self, value: DecisionInput) -> str:
        return get_text(value, self.fuzz.text_field)

    def _with_text(self, value: DecisionInput, text: str) -> DecisionInput:
        return set_text(value, self.fuzz.text_field, text)


class OptionOrderTransform(Transform):
    name = "option_order"
    config: OptionOrder
    _ENUMERATE_UP_TO = 6

    async def candidates(self, case: Case, rng: Rng) -> list[Steps]:
        n = len(self.spec.labels)
        identity = tuple(range(n))
        if n <= self._ENUMERATE_UP_TO:
            orders = [p for p in itertools.permutations(identity) if p != identity]
            chosen = rng.sample(orders, self.config.samples)
        else:
            chosen, attempts = [], 0
            while len(chosen) < self.config.samples and attempts < 1000:
                attempts += 1
                order = tuple(rng.shuffled(identity))
                if order != identity and order not in chosen:
                    chosen.append(order)
        return [({"order": list(order)},) for order in chosen]

    def apply(self, original: DecisionInput, steps: Steps) -> Mutation:
        labels = self.spec.labels
        presentation = tuple((labels[i], labels[i]) for i in steps[0]["order"])
        return Mutation(steps, original, _canonical(presentation, labels))

    def reductions(self, steps: Steps) -> Iterator[Steps]:
        """Undo one adjacent inversion at a time: orders closer to the original."""
        order = list(steps[0]["order"])
        for j in range(len(order) - 1):
            if order[j] > order[j + 1]:
                smaller = order.copy()
                smaller[j], smaller[j + 1] = smaller[j + 1], smaller[j]
                if smaller != sorted(smaller):
                    yield ({"order": smaller},)


class LabelFormatTransform(Transform):
    name = "label_format"
    config: LabelFormat

    def _variants(self) -> list[Steps]:
        labels = self.spec.labels
        variants: list[Steps] = []
        for style in self.config.styles:
            steps = tuple(
                {"label": label, "style": style}
                for index, label in enumerate(labels)
                if format_label(label, style, index) != label
            )
            if steps:
                variants.append(steps)
        aliases = self.config.aliases
        for k in range(max((len(forms) for forms in aliases.values()), default=0)):
            variants.append(
                tuple(
                    {"label": label, "alias": aliases[label][k]}
                    for label in labels
                    if label in aliases and len(aliases[label]) > k
                )
            )
        return [steps for steps in variants if self._distinct(steps)]

    def _shown(self, steps: Steps) -> dict[str, str]:
        labels = self.spec.labels
        shown = {label: label for label in labels}
        for step in steps:
            label = step["label"]
            shown[label] = step["alias"] if "alias" in step else format_label(label, step["style"], labels.index(label))
        return shown

    def _distinct(self, steps: Steps) -> bool:
        values = list(self._shown(steps).values())
        return len(set(values)) == len(values)

    async def candidates(self, case: Case, rng: Rng) -> list[Steps]:
        return rng.sample(self._variants(), self.config.samples)

    def apply(self, original: DecisionInput, steps: Steps) -> Mutation:
        shown = self._shown(steps)
        presentation = tuple((shown[label], label) for label in self.spec.labels)
        return Mutation(steps, original, _canonical(presentation, self.spec.labels))

    def reductions(self, steps: Steps) -> Iterator[Steps]:
        return (smaller for smaller in _drop_one(steps) if self._distinct(smaller))


class _InsertionTransform(Transform):
    """Sentences inserted at sentence boundaries; each insertion is one removable step."""

    config: IrrelevantContext | RepeatedContext

    def _fragments(self, rng: Rng) -> list[str]:
        raise NotImplementedError

    async def candidates(self, case: Case, rng: Rng) -> list[Steps]:
        text = self._text(case.input)
        if not text.strip():
            raise NotApplicable("text is empty")
        boundaries = len(_SENTENCE_BREAK.split(text)[0::2]) + 1
        chosen: list[Steps] = []
        for _ in range(self.config.samples):
            steps = [{"at": rng.below(boundaries), "text": fragment} for fragment in self._fragments(rng)]
            chosen.append(tuple(sorted(steps, key=lambda step: step["at"])))
        return chosen

    def apply(self, original: DecisionInput, steps: Steps) -> Mutation:
        return Mutation(steps, self._with_text(original, insert_fragments(self._text(original), steps)))

    def reductions(self, steps: Steps) -> Iterator[Steps]:
        return _drop_one(steps)


class IrrelevantContextTransform(_InsertionTransform):
    name = "irrelevant_context"
    config: IrrelevantContext

    def _fragments(self, rng: Rng) -> list[str]:
        return [rng.choice(self.config.fragments) for _ in range(self.config.insertions)]


class RepeatedContextTransform(_InsertionTransform):
    name = "repeated_context"
    config: RepeatedContext

    def _fragments(self, rng: Rng) -> list[str]:
        return [rng.choice(self.config.fragments)] * self.config.repeats


def _whitespace_order(step: Step) -> tuple[int, int]:
    at = step["at"]
    return (0, 0) if at == "start" else (2, 0) if at == "end" else (1, at)


class WhitespaceTransform(Transform):
    name = "whitespace"
    config: Whitespace

    async def candidates(self, case: Case, rng: Rng) -> list[Steps]:
        text = self._text(case.input)
        runs = [match.group() for match in _WHITESPACE.finditer(text)]
        targets: list[int | str] = ["start", *range(len(runs)), "end"]
        chosen: list[Steps] = []
        for _ in range(self.config.samples):
            steps = []
            for target in rng.sample(targets, self.config.edits):
                variants: Sequence[str] = (
                    _EDGE_VARIANTS[target]
                    if isinstance(target, str)
                    else [v for v in _RUN_VARIANTS if v != runs[target]]
                )
                steps.append({"at": target, "ws": rng.choice(variants)})
            chosen.append(tuple(sorted(steps, key=_whitespace_order)))
        return chosen

    def apply(self, original: DecisionInput, steps: Steps) -> Mutation:
        return Mutation(steps, self._with_text(original, replace_whitespace(self._text(original), steps)))

    def reductions(self, steps: Steps) -> Iterator[Steps]:
        return _drop_one(steps)


class ParaphraseTransform(Transform):
    name = "paraphrase"
    config: Paraphrase
    keeps_no_ops = True

    def __init__(self, config: Paraphrase, spec: DecisionSpec, fuzz: Fuzz, paraphraser: Paraphraser) -> None:
        super().__init__(config, spec, fuzz)
        self.paraphraser = paraphraser

    async def candidates(self, case: Case, rng: Rng) -> list[Steps]:
        text = self._text(case.input)
        found = await self.paraphraser.paraphrase(text, case_id=case.id, n=self.config.samples, seed=self.fuzz.seed)
        if not found:
            raise NotApplicable(f"paraphrase provider {self.paraphraser.provider!r} gave none")
        return [({"text": paraphrase},) for paraphrase in found[: self.config.samples]]

    def apply(self, original: DecisionInput, steps: Steps) -> Mutation:
        return Mutation(steps, self._with_text(original, steps[0]["text"]), provenance=self.paraphraser.provenance())


class InversionTransform(Transform):
    name = "inversion"
    config: Inversion

    async def candidates(self, case: Case, rng: Rng) -> list[Steps]:
        text = self._text(case.input)
        applicable = [r for r in self.config.rewrites if r.find in text]
        if not applicable:
            raise NotApplicable("no rewrite matches the text")
        return [({"find": r.find, "replace": r.replace},) for r in applicable[: self.config.samples]]

    def apply(self, original: DecisionInput, steps: Steps) -> Mutation:
        step = steps[0]
        return Mutation(
            steps, self._with_text(original, self._text(original).replace(step["find"], step["replace"], 1))
        )


class MonotonicTransform(Transform):
    name = "monotonic"
    config: Monotonic

    def _value(self, original: DecisionInput) -> float:
        name = self.config.field
        value = original.get(name) if isinstance(original, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise NotApplicable(f"input field {name!r} is missing or not a number")
        if not math.isfinite(value):
            raise NotApplicable(f"input field {name!r} is not finite")
        return value

    async def candidates(self, case: Case, rng: Rng) -> list[Steps]:
        self._value(case.input)
        return [({"field": self.config.field, "delta": delta},) for delta in self.config.deltas]

    def apply(self, original: DecisionInput, steps: Steps) -> Mutation:
        value = self._value(original)
        delta = steps[0]["delta"]
        changed = value + delta
        if isinstance(value, int) and float(delta).is_integer():
            changed = int(changed)
        assert isinstance(original, dict)
        return Mutation(steps, {**original, self.config.field: changed})

    def reductions(self, steps: Steps) -> Iterator[Steps]:
        """Half the increase: the smallest change that still moves the score the wrong way."""
        delta = float(steps[0]["delta"])
        smaller = math.floor(delta / 2) if delta.is_integer() else delta / 2
        if smaller >= (1 if delta.is_integer() else 1e-6):
            yield ({**steps[0], "delta": float(smaller)},)


TRANSFORMS: dict[str, type[Transform]] = {
    t.name: t
    for t in (
        OptionOrderTransform,
        LabelFormatTransform,
        IrrelevantContextTransform,
        RepeatedContextTransform,
        WhitespaceTransform,
        InversionTransform,
        MonotonicTransform,
    )
}


def make_transform(
    name: str, config: PropertyConfig, spec: DecisionSpec, fuzz: Fuzz, paraphraser: Paraphraser | None = None
) -> Transform:
    if isinstance(config, Paraphrase):
        if paraphraser is None:
            raise ValueError("the paraphrase property needs a paraphraser")
        return ParaphraseTransform(config, spec, fuzz, paraphraser)
    return TRANSFORMS[name](config, spec, fuzz)
