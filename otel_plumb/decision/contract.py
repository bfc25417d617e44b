"""Decision contracts, schema "0.1" (DecGuard's format).

Field names, defaults and types mirror DecGuard so that a DecGuard contract loads unchanged and
its normalised hash is the same. Two additions are ours: ``properties.<p>.max_flip_rate_upper``
(a gate on the Wilson 95% upper bound of the flip rate) and ``fuzz.original_samples`` (k draws
of the original for stochastic backends). They are left out of the hash while unset, so a
DecGuard contract hashes identically.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from otel_plumb import yamlfile
from otel_plumb.decision.errors import ContractError
from otel_plumb.decision.validation import Strict, format_errors, unique_keys

SCHEMA_VERSION = "0.1"
DEFAULT_BACKEND = "default"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
MAX_CONTRACT_BYTES = 1_000_000

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
NonNegative = Annotated[float, Field(ge=0.0)]
BrierValue = Annotated[float, Field(ge=0.0, le=2.0)]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Level = Literal["requirement", "warning"]
DecisionType = Literal["choice", "noul", "score"]


# --- decision ------------------------------------------------------------------------------


def _check_labels(labels: tuple[str, ...]) -> tuple[str, ...]:
    for label in labels:
        if not label or label != label.strip():
            raise ValueError(f"labels must be non-empty and have no surrounding spaces: {label!r}")
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ValueError(f"duplicate labels: {duplicates}")
    return labels


def _numbers_to_str(value: Any) -> Any:
    # Score levels are often written as bare numbers (1..5) in YAML.
    if isinstance(value, (list, tuple)):
        return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
    return value


@dataclass(frozen=True, slots=True)
class DecisionSpec:
    """What is asked: ``labels`` is the canonical order every probability follows."""

    name: str
    type: DecisionType
    labels: tuple[str, ...]
    description: str | None = None

    def shown(self, labels: tuple[str, ...]) -> DecisionSpec:
        return DecisionSpec(self.name, self.type, labels, self.description)


class _Decision(Strict):
    type: DecisionType
    name: Name
    description: str | None = None

    def labels(self) -> tuple[str, ...]:
        raise NotImplementedError

    def spec(self) -> DecisionSpec:
        return DecisionSpec(self.name, self.type, self.labels(), self.description)


class ChoiceDecision(_Decision):
    type: Literal["choice"]
    options: tuple[str, ...] = Field(min_length=2)
    _v = field_validator("options")(_check_labels)

    def labels(self) -> tuple[str, ...]:
        return self.options


class NoulDecision(_Decision):
    type: Literal["noul"]
    labels_: tuple[str, str] = Field(default=("yes", "no"), alias="labels")
    """Positive label first."""
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    _v = field_validator("labels_")(_check_labels)

    def labels(self) -> tuple[str, ...]:
        return self.labels_


class ScoreDecision(_Decision):
    type: Literal["score"]
    levels: tuple[str, ...] = Field(min_length=2)
    """Lowest first."""
    _c = field_validator("levels", mode="before")(_numbers_to_str)
    _v = field_validator("levels")(_check_labels)

    def labels(self) -> tuple[str, ...]:
        return self.levels


Decision = Annotated[ChoiceDecision | NoulDecision | ScoreDecision, Field(discriminator="type")]


class BackendConfig(BaseModel):
    """``provider`` and ``model``; any other key is a provider setting the provider validates."""

    model_config = ConfigDict(extra="allow", frozen=True)
    provider: Name
    model: str | None = None

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# --- gates -------------------------------------------------------------------------------------


class Evaluation(Strict):
    confidence_threshold: Probability | None = None
    calibration_bins: int = Field(default=10, ge=1, le=1000)
    probability_tolerance: float = Field(default=1e-3, gt=0.0, le=0.1)
    max_concurrency: int = Field(default=4, ge=1, le=256)


class _Configured(Strict):
    def configured(self) -> dict[str, float]:
        return {key: value for key, value in self.model_dump().items() if isinstance(value, float)}


class Gates(_Configured):
    min_accuracy: Probability | None = None
    min_macro_f1: Probability | None = None
    max_nll: NonNegative | None = None
    max_brier: BrierValue | None = None
    max_ece: Probability | None = None
    min_coverage: Probability | None = None
    max_abstention_rate: Probability | None = None
    min_selective_accuracy: Probability | None = None
    max_error_rate: Probability | None = None
    max_latency_p95_ms: NonNegative | None = None
    max_ordinal_mae: NonNegative | None = None


# --- properties --------------------------------------------------------------------------------

TOLERANCES = ("max_tv_distance", "max_js_divergence", "max_abs_delta", "max_confidence_delta")
LabelStyle = Literal["upper", "lower", "capitalized", "lettered", "numbered", "quoted", "bracketed"]
LABEL_STYLES: tuple[LabelStyle, ...] = ("upper", "lower", "capitalized", "lettered", "numbered", "quoted", "bracketed")
DEFAULT_FRAGMENTS: tuple[str, ...] = (
    "The weather was mild that day.",
    "This note was written on a Tuesday.",
    "The office is on the third floor.",
    "The meeting room has a large window.",
    "There is a small plant on the desk.",
    "The train was on time this morning.",
    "The corridor lights were repainted last year.",
    "A colleague brought biscuits to share.",
)
Fragment = Annotated[str, Field(min_length=1)]
Relation = Literal["invariant", "swapped", "monotonic"]


class _Property(Strict):
    relation: ClassVar[Relation] = "invariant"
    types: ClassVar[tuple[str, ...]] = ("choice", "noul", "score")

    enabled: bool = True
    level: Level = "requirement"
    max_flip_rate: Probability | None = None
    max_violation_rate: Probability = 0.0
    max_flip_rate_upper: Probability | None = None
    """Ours: limit on the Wilson 95% upper bound of the flip rate."""

    def tolerances(self) -> dict[str, float]:
        return {}

    @cached_property
    def limits(self) -> tuple[tuple[str, float], ...]:
        """``tolerances()`` computed once: it is consulted for every transformed case."""
        return tuple(self.tolerances().items())


class _Distribution(_Property):
    max_tv_distance: Probability | None = None
    max_js_divergence: Probability | None = None
    max_abs_delta: Probability | None = None
    max_confidence_delta: Probability | None = None

    @model_validator(mode="after")
    def _needs_a_limit(self) -> _Distribution:
        if self.max_flip_rate is None and self.max_flip_rate_upper is None and not self.tolerances():
            raise ValueError(f"set at least one of {', '.join(TOLERANCES)} or max_flip_rate")
        return self

    def tolerances(self) -> dict[str, float]:
        return {key: value for key in TOLERANCES if (value := getattr(self, key)) is not None}


class OptionOrder(_Distribution):
    types: ClassVar[tuple[str, ...]] = ("choice", "noul")
    samples: int = Field(default=3, ge=1, le=100)


class LabelFormat(_Distribution):
    styles: tuple[LabelStyle, ...] = LABEL_STYLES
    aliases: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    samples: int = Field(default=2, ge=1, le=100)

    @field_validator("aliases")
    @classmethod
    def _trimmed(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for label, forms in value.items():
            if not forms or any(not form or form != form.strip() for form in forms):
                raise ValueError(f"aliases for {label!r} must be non-empty, trimmed strings")
        return value


class IrrelevantContext(_Distribution):
    fragments: tuple[Fragment, ...] = Field(default=DEFAULT_FRAGMENTS, min_length=1)
    insertions: int = Field(default=1, ge=1, le=10)
    samples: int = Field(default=2, ge=1, le=100)


class RepeatedContext(_Distribution):
    fragments: tuple[Fragment, ...] = Field(default=DEFAULT_FRAGMENTS, min_length=1)
    repeats: int = Field(default=3, ge=2, le=20)
    samples: int = Field(default=1, ge=1, le=100)


class Whitespace(_Distribution):
    edits: int = Field(default=3, ge=1, le=20)
    samples: int = Field(default=2, ge=1, le=100)


class ParaphraseSource(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    provider: Name = "identity"

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Paraphrase(_Distribution):
    source: ParaphraseSource = ParaphraseSource()
    samples: int = Field(default=1, ge=1, le=20)


class Rewrite(Strict):
    find: str = Field(min_length=1)
    replace: str


class Inversion(_Distribution):
    relation: ClassVar[Relation] = "swapped"
    types: ClassVar[tuple[str, ...]] = ("noul",)
    rewrites: tuple[Rewrite, ...] = Field(min_length=1)
    samples: int = Field(default=1, ge=1, le=20)


class Monotonic(_Property):
    relation: ClassVar[Relation] = "monotonic"
    types: ClassVar[tuple[str, ...]] = ("score",)
    field: str = Field(min_length=1)
    direction: Literal["increasing", "decreasing"] = "increasing"
    deltas: tuple[Annotated[float, Field(gt=0.0)], ...] = Field(default=(1.0,), min_length=1)
    max_level_decrease: NonNegative = 0.0

    def tolerances(self) -> dict[str, float]:
        return {"max_level_decrease": self.max_level_decrease}


PropertyConfig = (
    OptionOrder | LabelFormat | IrrelevantContext | RepeatedContext | Whitespace | Paraphrase | Inversion | Monotonic
)
PROPERTY_NAMES = (
    "option_order",
    "label_format",
    "irrelevant_context",
    "repeated_context",
    "whitespace",
    "paraphrase",
    "inversion",
    "monotonic",
)


class Properties(Strict):
    option_order: OptionOrder | None = None
    label_format: LabelFormat | None = None
    irrelevant_context: IrrelevantContext | None = None
    repeated_context: RepeatedContext | None = None
    whitespace: Whitespace | None = None
    paraphrase: Paraphrase | None = None
    inversion: Inversion | None = None
    monotonic: Monotonic | None = None

    def configured(self) -> dict[str, PropertyConfig]:
        """Enabled properties in the fixed catalogue order."""
        return {
            name: config for name in PROPERTY_NAMES if (config := getattr(self, name)) is not None and config.enabled
        }


class Fuzz(Strict):
    seed: int = Field(default=0, ge=0, lt=2**63)
    text_field: str | None = None
    minimize: bool = True
    max_minimize_calls: int = Field(default=32, ge=0, le=1000)
    original_samples: int = Field(default=1, ge=1, le=50)
    """Ours: decide each original k times and compare against the mean of the draws."""


class RegressionGates(_Configured):
    max_answer_flip_rate: Probability | None = None
    max_accuracy_drop: Probability | None = None
    max_macro_f1_drop: Probability | None = None
    max_ece_increase: Probability | None = None
    max_brier_increase: BrierValue | None = None
    max_nll_increase: NonNegative | None = None
    max_mean_tv_distance: Probability | None = None
    max_mean_confidence_shift: Probability | None = None
    max_error_rate_increase: Probability | None = None
    max_latency_p95_increase_ms: NonNegative | None = None
    max_segment_accuracy_drop: Probability | None = None

    def configured(self) -> dict[str, float]:
        return {key: v for key in RegressionGates.model_fields if (v := getattr(self, key)) is not None}


class Regression(RegressionGates):
    warnings: RegressionGates = RegressionGates()
    segment_by: tuple[Fragment, ...] = ()
    min_segment_size: int = Field(default=5, ge=1)

    @model_validator(mode="after")
    def _segments_for_segment_gate(self) -> Regression:
        wanted = "max_segment_accuracy_drop"
        if wanted in {**self.configured(), **self.warnings.configured()} and not self.segment_by:
            raise ValueError(f"{wanted} needs segment_by (case metadata keys)")
        return self


# --- production and policy -------------------------------------------------------------------


class SegmentGates(_Configured):
    min_accuracy: Probability | None = None
    max_error_rate: Probability | None = None
    max_ece: Probability | None = None
    max_brier: BrierValue | None = None
    max_nll: NonNegative | None = None
    min_threshold_coverage: Probability | None = None
    max_abstention_rate: Probability | None = None
    max_fallback_rate: Probability | None = None


class ProductionGates(SegmentGates):
    """The segment gates plus drift against a baseline, which only whole traffic has."""

    max_confidence_tv_distance: Probability | None = None
    max_accuracy_drop: Probability | None = None
    max_ece_increase: Probability | None = None


class Production(Strict):
    segments: tuple[str, ...] = ()
    requirements: ProductionGates = ProductionGates()
    warnings: ProductionGates = ProductionGates()
    segment_requirements: SegmentGates = SegmentGates()
    segment_warnings: SegmentGates = SegmentGates()

    @field_validator("segments")
    @classmethod
    def _check_segments(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not key or key != key.strip() for key in value):
            raise ValueError("segment keys must be non-empty and have no surrounding spaces")
        if len(set(value)) != len(value):
            raise ValueError("segment keys must be unique")
        return value


PolicyAction = Literal["accept", "abstain", "fallback", "human_review"]


class PolicyCondition(Strict):
    confidence_gte: Probability


class PolicyRoute(Strict):
    when: PolicyCondition | None = None
    action: PolicyAction
    backend: Name | None = None

    @model_validator(mode="after")
    def _check_backend(self) -> PolicyRoute:
        if self.action == "fallback" and self.backend is None:
            raise ValueError("fallback routes require 'backend'")
        if self.action != "fallback" and self.backend is not None:
            raise ValueError("'backend' is only valid for fallback routes")
        return self


class Policy(Strict):
    routes: tuple[PolicyRoute, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_order(self) -> Policy:
        if self.routes[-1].when is not None:
            raise ValueError("the final route must be unconditional")
        if any(route.when is None for route in self.routes[:-1]):
            raise ValueError("only the final route may be unconditional")
        thresholds = [route.when.confidence_gte for route in self.routes[:-1] if route.when is not None]
        if any(left <= right for left, right in pairwise(thresholds)):
            raise ValueError("confidence_gte thresholds must be strictly descending")
        return self


# --- the contract --------------------------------------------------------------------------------

_NEEDS_THRESHOLD = ("min_coverage", "max_abstention_rate", "min_selective_accuracy")


class Contract(Strict):
    schema_version: str
    decision: Decision
    backend: BackendConfig
    backends: dict[Name, BackendConfig] = Field(default_factory=dict)
    dataset: str | None = None
    evaluation: Evaluation = Evaluation()
    requirements: Gates = Gates()
    warnings: Gates = Gates()
    properties: Properties = Properties()
    fuzz: Fuzz = Fuzz()
    regression: Regression = Regression()
    production: Production = Production()
    policy: Policy | None = None

    @field_validator("schema_version", mode="before")
    @classmethod
    def _schema(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f'must be a string such as "{SCHEMA_VERSION}" (quote it in YAML), got {value!r}')
        if value != SCHEMA_VERSION:
            raise ValueError(f"unsupported schema_version {value!r}; supported: {SCHEMA_VERSION!r}")
        return value

    @field_validator("backends")
    @classmethod
    def _reserved(cls, value: dict[str, BackendConfig]) -> dict[str, BackendConfig]:
        if DEFAULT_BACKEND in value:
            raise ValueError(f"{DEFAULT_BACKEND!r} is reserved for the top-level 'backend'")
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> Contract:
        for section in ("requirements", "warnings"):
            configured = getattr(self, section).configured()
            if self.evaluation.confidence_threshold is None:
                needing = [key for key in _NEEDS_THRESHOLD if key in configured]
                if needing:
                    raise ValueError(f"{section}.{needing[0]} needs evaluation.confidence_threshold to be set")
            if "max_ordinal_mae" in configured and self.decision.type != "score":
                raise ValueError(f"{section}.max_ordinal_mae only applies to score decisions")
        for name, config in self.properties.configured().items():
            if self.decision.type not in config.types:
                raise ValueError(
                    f"properties.{name} applies to {' and '.join(config.types)} decisions, not {self.decision.type}"
                )
        label_format = self.properties.label_format
        if label_format is not None:
            unknown = sorted(set(label_format.aliases) - set(self.decision.labels()))
            if unknown:
                raise ValueError(f"properties.label_format.aliases: unknown labels {unknown}")
        sections = (
            self.production.requirements,
            self.production.warnings,
            self.production.segment_requirements,
            self.production.segment_warnings,
        )
        if self.evaluation.confidence_threshold is None and any(
            "min_threshold_coverage" in s.configured() for s in sections
        ):
            raise ValueError("production min_threshold_coverage needs evaluation.confidence_threshold to be set")
        if self.policy is not None:
            known = self.backend_names()
            for index, route in enumerate(self.policy.routes):
                if route.backend is not None and route.backend not in known:
                    raise ValueError(
                        f"policy.routes.{index}.backend: unknown backend {route.backend!r}; "
                        f"the contract defines: {', '.join(known)}"
                    )
        return self

    def spec(self) -> DecisionSpec:
        return self.decision.spec()

    def backend_names(self) -> list[str]:
        return [DEFAULT_BACKEND, *self.backends]

    def backend_config(self, name: str | None = None) -> BackendConfig:
        if name is None or name == DEFAULT_BACKEND:
            return self.backend
        if name not in self.backends:
            raise ContractError(f"unknown backend {name!r}; the contract defines: {', '.join(self.backend_names())}")
        return self.backends[name]


# Our additions, dropped from the hash while at their defaults so DecGuard contracts hash alike.
_EXTENSION_DEFAULTS: dict[str, Any] = {"max_flip_rate_upper": None, "original_samples": 1}


def _without_extensions(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _without_extensions(v)
            for k, v in value.items()
            if not (k in _EXTENSION_DEFAULTS and v == _EXTENSION_DEFAULTS[k])
        }
    if isinstance(value, list):
        return [_without_extensions(v) for v in value]
    return value


def contract_hash(contract: Contract) -> str:
    data = _without_extensions(contract.model_dump(mode="json", by_alias=True))
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def dump_section(model: BaseModel) -> Any:
    """A contract section as stored in reports (JSON types, aliases as written)."""
    return model.model_dump(mode="json", by_alias=True)


@dataclass(frozen=True)
class LoadedContract:
    contract: Contract
    path: Path
    hash: str

    def resolve(self, relative: str) -> Path:
        return self.path.parent / relative


def parse_contract(data: Any, *, source: str = "<contract>", text: str | None = None) -> Contract:
    if not isinstance(data, dict):
        raise ContractError(f"{source}: a contract must be a mapping at the top level")
    try:
        return Contract.model_validate(data)
    except ValidationError as exc:
        raise ContractError(f"{source}: invalid contract:\n{format_errors(exc, text=text)}") from exc


def load_contract(path: str | Path) -> LoadedContract:
    """Read a contract through the one YAML loader (``otel_plumb.yamlfile``: duplicate keys
    refused, aliases bounded, dates as text), at most ``MAX_CONTRACT_BYTES``; a ``.json`` file
    must be JSON."""
    path = Path(path)
    try:
        text = yamlfile.read_text(path, MAX_CONTRACT_BYTES)
    except yamlfile.YamlError as exc:
        where = f" (line {exc.line})" if exc.line is not None else ""
        raise ContractError(f"{path}: cannot read contract{where}: {exc.message}") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text, object_pairs_hook=unique_keys)
        else:
            data = yamlfile.parse(text, str(path), max_bytes=MAX_CONTRACT_BYTES).data
    except yamlfile.YamlError as exc:
        where = f"line {exc.line}: " if exc.line is not None else ""
        raise ContractError(f"{path}: cannot parse file:\n  {where}{exc.message}") from None
    except ValueError as exc:  # JSON: carries the position
        raise ContractError(f"{path}: cannot parse file:\n  {exc}") from None
    contract = parse_contract(data, source=str(path), text=text)
    return LoadedContract(contract, path, contract_hash(contract))
