"""Runs: golden cases through a backend, then metamorphic properties.

original decision -> controlled transformation -> new decision -> comparison -> verdict.
Local backends (mock, Python functions) are called one after another in the event loop: they
are CPU-bound, so threads would only add overhead. Network backends overlap up to
``evaluation.max_concurrency`` requests.
"""

from __future__ import annotations

import asyncio
import builtins
import gc
import math
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from otel_plumb.decision.backends import Backend, Health, create_backend
from otel_plumb.decision.compare import Comparison, compare, judge
from otel_plumb.decision.contract import DEFAULT_BACKEND, DecisionSpec, Fuzz, LoadedContract, Properties, PropertyConfig
from otel_plumb.decision.dataset import Dataset, load_dataset
from otel_plumb.decision.errors import BackendError, ContractError, DecisionError
from otel_plumb.decision.model import Case, CaseError, Outcome, Record, Request, Result
from otel_plumb.decision.paraphrase import Paraphraser, create_paraphraser
from otel_plumb.decision.rng import case_rng
from otel_plumb.decision.transforms import Mutation, NotApplicable, Presentation, Steps, Transform, make_transform
from otel_plumb.stats.distribution import select_label

T = TypeVar("T")
R = TypeVar("R")
ORIGINAL_ERROR = "original_error"


async def map_bounded(
    fn: Callable[[T], Awaitable[R]], items: Sequence[T], *, concurrency: int, overlap: bool
) -> list[R]:
    """``[await fn(item) for item in items]``, overlapping at most ``concurrency`` when ``overlap``."""
    if not overlap or concurrency <= 1 or len(items) <= 1:
        return [await fn(item) for item in items]
    gate = asyncio.Semaphore(concurrency)

    async def one(item: T) -> R:
        async with gate:
            return await fn(item)

    return list(await asyncio.gather(*(one(item) for item in items)))


async def decide_safely(backend: Backend, request: Request, tolerance: float) -> Outcome:
    try:
        return await backend.decide(request, tolerance=tolerance)
    except BackendError as exc:
        return CaseError(exc.kind, str(exc))
    except DecisionError:
        raise  # configuration problems abort the run
    except Exception as exc:  # a buggy plugin must not drop cases silently
        return CaseError("exception", f"{type(exc).__name__}: {exc}")


async def decide_cases(
    backend: Backend, spec: DecisionSpec, cases: Sequence[Case], *, concurrency: int, tolerance: float
) -> list[Record]:
    async def one(case: Case) -> Record:
        return Record(case, await decide_safely(backend, Request(case.id, spec, case.input), tolerance))

    return await map_bounded(one, cases, concurrency=concurrency, overlap=backend.concurrent)


async def decide_mutation(
    backend: Backend, spec: DecisionSpec, request_id: str, mutation: Mutation, tolerance: float
) -> Outcome:
    """Send the labels as shown; map the answer back to the contract labels in canonical order."""
    presentation = mutation.presentation
    shown = spec if presentation is None else spec.shown(tuple(s for s, _ in presentation))
    outcome = await decide_safely(backend, Request(request_id, shown, mutation.input), tolerance)
    if isinstance(outcome, CaseError) or presentation is None:
        return outcome
    by_label = {label: outcome.probabilities[s] for s, label in presentation}
    return outcome.relabel(request_id, spec.labels, {label: by_label[label] for label in spec.labels}, spec.name)


def mean_result(results: Sequence[Result]) -> Result:
    """The reference for k original draws: the mean distribution (ours: fuzz.original_samples)."""
    first = results[0]
    if len(results) == 1:
        return first
    labels = first.labels
    probabilities = {label: math.fsum(r.probabilities[label] for r in results) / len(results) for label in labels}
    selected = select_label(labels, probabilities)
    return Result(
        first.case_id,
        first.decision,
        first.decision_type,
        labels,
        probabilities,
        selected,
        probabilities[selected],
        first.backend,
        first.provider,
        first.model,
        first.model_version,
        first.latency_ms,
        first.metadata,
    )


# --- property pairs ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reduced:
    steps: Steps
    input: Any
    presentation: Presentation | None
    result: Result
    comparison: Comparison
    violations: tuple[str, ...]
    backend_calls: int


@dataclass(frozen=True, slots=True)
class Pair:
    """One transformed case: what was sent, what came back, how it compares."""

    id: str
    property: str
    case_id: str
    sample: int
    steps: Steps
    provenance: dict[str, Any]
    input: Any
    presentation: Presentation | None
    outcome: Outcome
    comparison: Comparison | None = None
    violations: tuple[str, ...] = ()
    reduced: Reduced | None = None

    # ``property`` is a field here, so the decorator is spelled out.
    @builtins.property
    def result(self) -> Result | None:
        return self.outcome if isinstance(self.outcome, Result) else None

    @builtins.property
    def error(self) -> CaseError | None:
        return self.outcome if isinstance(self.outcome, CaseError) else None

    def failed(self) -> bool:
        error = self.error
        return bool(self.violations) or (error is not None and error.kind != ORIGINAL_ERROR)


@dataclass(frozen=True, slots=True)
class Skip:
    property: str
    case_id: str
    reason: str


@dataclass
class PropertyRun:
    seed: int
    fuzz: Fuzz
    config: Properties
    pairs: list[Pair]
    skipped: list[Skip]
    draws: dict[str, list[Outcome]] = field(default_factory=dict)
    """Extra original draws per case id when fuzz.original_samples > 1."""


def pair_id(name: str, case_id: str, sample: int) -> str:
    return f"{name}/{case_id}/{sample}"


def references(records: Sequence[Record], draws: dict[str, list[Outcome]]) -> dict[str, Outcome]:
    """What each transformed case is compared with: the golden result, or the mean of k draws."""
    out: dict[str, Outcome] = {}
    for record in records:
        extra = draws.get(record.case.id, [])
        outcomes = [record.outcome, *extra]
        failed = next((o for o in outcomes if isinstance(o, CaseError)), None)
        out[record.case.id] = failed or mean_result([o for o in outcomes if isinstance(o, Result)])
    return out


def judge_pair(
    name: str,
    config: PropertyConfig,
    case: Case,
    sample: int,
    mutation: Mutation | None,
    outcome: Outcome,
    reference: Outcome,
) -> Pair:
    """A pair from an outcome; its comparison and verdict follow from the reference."""
    pid = pair_id(name, case.id, sample)
    steps = mutation.steps if mutation else ()
    base = (
        pid,
        name,
        case.id,
        sample,
        steps,
        mutation.provenance if mutation else {},
        mutation.input if mutation else case.input,
        mutation.presentation if mutation else None,
    )
    if isinstance(outcome, CaseError):
        return Pair(*base, outcome)
    assert isinstance(reference, Result)
    comparison = compare(reference, outcome, config)
    return Pair(*base, outcome, comparison, tuple(judge(config, comparison)))


def select_properties(config: Properties, only: Sequence[str] | None) -> Properties:
    enabled = config.configured()
    if only:
        unknown = [name for name in only if name not in enabled]
        if unknown:
            raise ContractError(
                f"property {unknown[0]!r} is not enabled in the contract; enabled: " + (", ".join(enabled) or "none")
            )
        config = Properties(**{name: getattr(config, name) for name in only})
    if not config.configured():
        raise ContractError("the contract enables no properties; add a 'properties' section")
    return config


@dataclass(frozen=True, slots=True)
class _Planned:
    name: str
    config: PropertyConfig
    transform: Transform
    case: Case
    sample: int
    mutation: Mutation | None
    error: CaseError | None = None


class PropertyRunner:
    def __init__(
        self,
        backend: Backend,
        loaded: LoadedContract,
        *,
        concurrency: int,
        seed: int | None = None,
        only: Sequence[str] | None = None,
        minimize: bool | None = None,
        paraphraser: Paraphraser | None = None,
    ) -> None:
        contract = loaded.contract
        self.backend = backend
        self.spec = contract.spec()
        self.tolerance = contract.evaluation.probability_tolerance
        self.concurrency = concurrency
        updates: dict[str, Any] = {}
        if seed is not None:
            updates["seed"] = seed
        if minimize is not None:
            updates["minimize"] = minimize
        self.fuzz = contract.fuzz.model_copy(update=updates)
        self.config = select_properties(contract.properties, only)
        self._owned_paraphraser = False
        if self.config.paraphrase is not None and self.config.paraphrase.enabled and paraphraser is None:
            paraphraser = create_paraphraser(self.config.paraphrase.source, base_dir=loaded.path.parent)
            self._owned_paraphraser = True
        self.paraphraser = paraphraser
        self.transforms = {
            name: make_transform(name, prop, self.spec, self.fuzz, paraphraser)
            for name, prop in self.config.configured().items()
        }

    async def aclose(self) -> None:
        if self._owned_paraphraser and self.paraphraser is not None:
            await self.paraphraser.aclose()

    async def plan(self, cases: Sequence[Case]) -> tuple[list[_Planned], list[Skip]]:
        planned: list[_Planned] = []
        skipped: list[Skip] = []
        for name, prop in self.config.configured().items():
            transform = self.transforms[name]
            for case in cases:
                try:
                    mutations = await transform.generate(case, case_rng(self.fuzz.seed, name, case.id))
                except NotApplicable as exc:
                    skipped.append(Skip(name, case.id, str(exc)))
                    continue
                except BackendError as exc:  # e.g. the paraphrase provider failed
                    planned.append(_Planned(name, prop, transform, case, 0, None, CaseError(exc.kind, str(exc))))
                    continue
                except DecisionError:
                    raise
                except Exception as exc:  # a buggy paraphrase plugin must not drop cases
                    error = CaseError("exception", f"{type(exc).__name__}: {exc}")
                    planned.append(_Planned(name, prop, transform, case, 0, None, error))
                    continue
                planned += [_Planned(name, prop, transform, case, k, m) for k, m in enumerate(mutations)]
        return planned, skipped

    async def _draws(self, records: Sequence[Record]) -> dict[str, list[Outcome]]:
        extra = self.fuzz.original_samples - 1
        if extra <= 0:
            return {}
        todo = [(r.case, k) for r in records if r.result is not None for k in range(extra)]

        async def one(item: tuple[Case, int]) -> Outcome:
            case = item[0]
            return await decide_safely(self.backend, Request(case.id, self.spec, case.input), self.tolerance)

        outcomes = await map_bounded(one, todo, concurrency=self.concurrency, overlap=self.backend.concurrent)
        draws: dict[str, list[Outcome]] = {}
        for (case, _), outcome in zip(todo, outcomes, strict=True):
            draws.setdefault(case.id, []).append(outcome)
        return draws

    async def run(self, cases: Sequence[Case], records: Sequence[Record]) -> PropertyRun:
        draws = await self._draws(records)
        refs = references(records, draws)
        planned, skipped = await self.plan(cases)

        async def execute(item: _Planned) -> Pair:
            reference = refs[item.case.id]
            if item.error is not None:
                outcome: Outcome = item.error
            elif isinstance(reference, CaseError):
                outcome = CaseError(ORIGINAL_ERROR, f"the original case errored ({reference.kind}), nothing to compare")
            else:
                assert item.mutation is not None
                pid = pair_id(item.name, item.case.id, item.sample)
                outcome = await decide_mutation(self.backend, self.spec, pid, item.mutation, self.tolerance)
            return judge_pair(item.name, item.config, item.case, item.sample, item.mutation, outcome, reference)

        pairs = await map_bounded(execute, planned, concurrency=self.concurrency, overlap=self.backend.concurrent)
        if self.fuzz.minimize and self.fuzz.max_minimize_calls > 0:
            failing = [i for i, pair in enumerate(pairs) if pair.violations]

            async def reduce(index: int) -> Reduced | None:
                reference = refs[planned[index].case.id]
                assert isinstance(reference, Result)
                return await self._minimize(planned[index], reference)

            reduced = await map_bounded(reduce, failing, concurrency=self.concurrency, overlap=self.backend.concurrent)
            for index, found in zip(failing, reduced, strict=True):
                if found is not None:
                    pairs[index] = replace(pairs[index], reduced=found)
        return PropertyRun(self.fuzz.seed, self.fuzz, self.config, pairs, skipped, draws)

    async def _minimize(self, item: _Planned, before: Result) -> Reduced | None:
        """Greedy: take the first smaller step list that still fails; repeat until none does or the
        call budget is spent."""
        assert item.mutation is not None
        budget = self.fuzz.max_minimize_calls
        calls = 0
        steps = item.mutation.steps
        best: Reduced | None = None
        improved = True
        pid = pair_id(item.name, item.case.id, item.sample)
        while improved and calls < budget:
            improved = False
            for candidate in item.transform.reductions(steps):
                if calls >= budget:
                    break
                mutation = item.transform.apply(item.case.input, candidate)
                if mutation.is_no_op(item.case.input):
                    continue
                calls += 1
                outcome = await decide_mutation(self.backend, self.spec, pid, mutation, self.tolerance)
                if isinstance(outcome, CaseError):
                    continue
                comparison = compare(before, outcome, item.config)
                violations = judge(item.config, comparison)
                if violations:
                    steps = candidate
                    best = Reduced(
                        candidate, mutation.input, mutation.presentation, outcome, comparison, tuple(violations), calls
                    )
                    improved = True
                    break
        if best is not None and best.backend_calls != calls:
            best = replace(best, backend_calls=calls)
        return best


# --- a whole run ---------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    loaded: LoadedContract
    dataset: Dataset
    backend_info: dict[str, Any]
    health: Health | None
    records: list[Record]
    mode: str
    properties: PropertyRun | None


def resolve_dataset(loaded: LoadedContract, dataset: str | Path | None) -> Dataset:
    if dataset is not None:
        path = Path(dataset)
    elif loaded.contract.dataset is not None:
        path = loaded.resolve(loaded.contract.dataset)
    else:
        raise ContractError(f"{loaded.path}: no dataset given; set 'dataset' in the contract or pass --dataset")
    return load_dataset(path, loaded.contract.spec())


@contextmanager
def paused_gc() -> Iterator[None]:
    """A run allocates hundreds of thousands of small acyclic objects; the cyclic collector would
    rescan the growing heap again and again (it doubled run time), so it waits until the run is
    over. The survivors are then moved to the oldest generation without a scan (freeze, then
    unfreeze): a later full collection still sees them, but no young collection rescans them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


async def run_contract(
    loaded: LoadedContract,
    *,
    dataset: str | Path | None = None,
    backend: str | Backend | None = None,
    concurrency: int | None = None,
    check_health: bool = True,
    mode: str = "test",
    seed: int | None = None,
    properties: Sequence[str] | None = None,
    minimize: bool | None = None,
    paraphraser: Paraphraser | None = None,
) -> RunOutcome:
    spec = loaded.contract.spec()
    if mode != "test":
        select_properties(loaded.contract.properties, properties)  # fail before any call
    data = resolve_dataset(loaded, dataset)
    limit = concurrency or loaded.contract.evaluation.max_concurrency
    if isinstance(backend, Backend):
        instance, owned = backend, False
    else:
        instance = create_backend(
            loaded.contract.backend_config(backend), decision=spec, name=backend or DEFAULT_BACKEND
        )
        owned = True
    # Local backends make the run CPU-bound: pause the cyclic collector (see paused_gc). A network
    # backend waits on I/O instead, where collecting as usual costs nothing noticeable.
    pause: AbstractContextManager[None] = nullcontext() if instance.concurrent else paused_gc()
    try:
        with pause:
            health = await instance.healthcheck() if check_health else None
            if health is not None and health.status == "unhealthy":
                raise DecisionError(f"backend {instance.name!r} is unhealthy: {health.detail}")
            records = await decide_cases(
                instance,
                spec,
                data.cases,
                concurrency=limit,
                tolerance=loaded.contract.evaluation.probability_tolerance,
            )
            if records and all(r.error is not None for r in records):
                first = records[0].error
                assert first is not None
                raise DecisionError(
                    f"backend {instance.name!r} failed on every case; first error: {first.kind}: {first.message}"
                )
            run = None
            if mode != "test":
                runner = PropertyRunner(
                    instance,
                    loaded,
                    concurrency=limit,
                    seed=seed,
                    only=properties,
                    minimize=minimize,
                    paraphraser=paraphraser,
                )
                try:
                    run = await runner.run(data.cases, records)
                finally:
                    await runner.aclose()
            info = instance.info().to_json()
    finally:
        if owned:
            await instance.aclose()
    return RunOutcome(loaded, data, info, health, records, mode, run)
