"""Running a campaign: variants once per case, trials per arm, trajectories, verdicts, store.

Trials run concurrently up to ``limits.concurrency``; each is committed to the store as it
finishes, so an interrupted run resumes with what is left. Agent answers are cached by trial
identity (campaign, seed, arm and its definition, variant and its steps, repetition), never
by request content alone: repeats of the same request stay separate trials.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from otel_plumb import yamlfile
from otel_plumb.campaign.analysis import arg_key, state_key
from otel_plumb.campaign.collect import (
    GRPC,
    EmbeddedReceiver,
    FileSource,
    NoSpans,
    OtlpEndpoints,
    TraceMissing,
    TraceSource,
    WatchSource,
    trajectory_from_record,
)
from otel_plumb.campaign.config import CampaignError, Case, LoadedCampaign, load_dataset
from otel_plumb.campaign.perturb import Variant, apply_steps, generate_variants
from otel_plumb.campaign.runners import PROTOCOL, AgentError, Runner, TraceContext, make_runner
from otel_plumb.campaign.store import Store, TrialRow
from otel_plumb.check import CompiledPolicy, PolicyError, decide, load_policies, redaction_for
from otel_plumb.model import Trajectory
from otel_plumb.model.trajectory import ARM, CASE_ID, CONTEXT_PREFIX, TRIAL_ID, VARIANT_ID
from otel_plumb.redact import REDACTION_KEY_ENV, Redaction
from otel_plumb.report.records import decided_record


@dataclass(slots=True)
class PlannedTrial:
    row: TrialRow
    variant: Variant
    case: Case


@dataclass(slots=True)
class RunOutcome:
    run_id: str
    status: str  # "complete", "partial" (a limit, or an arm whose spans never came, stopped it), "interrupted"
    ran: int
    skipped: int
    # Arms stopped early, each with what is wrong.
    stopped_arms: dict[str, str]


# An arm whose first trials all answered but not one span of theirs arrived is stopped after
# this many: the agent exports nowhere or to the wrong place, and every further trial would
# only wait out the deadline to say so again.
SILENT_TRIALS = 3


def trial_identity(campaign: LoadedCampaign, arm: str, variant: Variant, rep: int) -> str:
    spec = campaign.spec
    arm_def = spec.arms[arm].model_dump(exclude_none=True)
    blob = json.dumps([spec.campaign, spec.seed, arm, arm_def, variant.variant_id, variant.steps, rep],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def plan(campaign: LoadedCampaign, variants: Sequence[Variant], cases: dict[str, Case],
         arms: Sequence[str], trials: int) -> list[PlannedTrial]:
    out: list[PlannedTrial] = []
    for variant in variants:
        case = cases.get(variant.case_id)
        if case is None:
            continue
        for arm in arms:
            for rep in range(trials):
                identity = trial_identity(campaign, arm, variant, rep)
                row = TrialRow(identity[:24], identity, arm, case.id, variant.variant_id, variant.perturbation, rep)
                out.append(PlannedTrial(row, variant, case))
    return out


def load_checks(campaign: LoadedCampaign) -> list[CompiledPolicy]:
    try:
        return load_policies([campaign.resolve(p) for p in campaign.spec.policies])
    except PolicyError as e:
        raise CampaignError(e.path, e.line, e.message) from None


def make_source(campaign: LoadedCampaign) -> TraceSource:
    traces = campaign.spec.traces
    if traces.receiver == "embedded":
        return EmbeddedReceiver()
    if traces.watch is not None:
        token = None
        if traces.token is not None:
            try:
                token = yamlfile.expand_env(traces.token, str(campaign.path), None)
            except yamlfile.YamlError as e:
                raise CampaignError(campaign.path, None, f"traces.token: {e.message}") from None
        tls: dict[str, bytes] = {}
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(traces.tls, key, None)
            if path is not None:
                try:
                    tls[key] = campaign.resolve(path).read_bytes()
                except OSError as e:
                    message = f"traces.tls.{key}: cannot read {path}: {e.strerror}"
                    raise CampaignError(campaign.path, None, message) from None
        return WatchSource(traces.watch, token, tls)
    assert traces.files is not None
    return FileSource([str(campaign.resolve(p)) for p in traces.files])


def judge(trajectory: Trajectory, trial: PlannedTrial, policies: Sequence[CompiledPolicy],
          ) -> tuple[dict[str, Any], str, bool, dict[str, Any]]:
    """Verdicts for one trial's trajectory: its record, status, critical conformance, summary."""
    attrs = trajectory.attributes
    # The harness knows which trial this is and the case's ground truth; the agent need not.
    for key, value in ((CASE_ID, trial.case.id), (VARIANT_ID, trial.variant.variant_id),
                       (TRIAL_ID, trial.row.trial_id), (ARM, trial.row.arm)):
        attrs.setdefault(key, value)
    for key, value in trial.case.context.items():
        attrs.setdefault(CONTEXT_PREFIX + key, value)
    decided = decide(policies, trajectory)
    verdicts, status = decided.verdicts, decided.status
    critical_ok = trajectory.complete and not any(
        v.severity == "critical" and v.verdict in ("fail", "indeterminate") for v in verdicts)
    # The store and its reports leave the process: what the policies' redaction covers is
    # redacted, and argument keys are keyed hashes (equal iff the arguments are equal).
    redaction = redaction_for(policies, key=os.environ.get(REDACTION_KEY_ENV, "").encode() or None)
    emitted = decided if redaction is None else redaction.decided(decided)
    record = decided_record(emitted)
    path = [[e.name, e.index, e.args if e.args_status == "captured" else None,
             _arg_key(s.args if s.args_status == "captured" else None, redaction)]
            for s, e in zip(trajectory.steps, emitted.trajectory.steps, strict=True)
            if s.kind == "tool" and s.succeeded]
    violations = sorted({(v.invariant, v.severity) for v in verdicts if v.verdict == "fail"})
    summary = {"path": path, "violations": [{"invariant": i, "severity": s} for i, s in violations]}
    return record, status, critical_ok, summary


def _arg_key(args: Any, redaction: Redaction | None) -> str:
    key = arg_key(args)
    return key if redaction is None else redaction.digest(key)


class CampaignRun:
    def __init__(self, campaign: LoadedCampaign, store: Store, *, arms: Sequence[str] | None = None,
                 use_cache: bool = True, progress: Callable[[TrialRow], None] | None = None,
                 trials: int | None = None, notice: Callable[[str], None] | None = None) -> None:
        self.campaign = campaign
        self.store = store
        spec = campaign.spec
        unknown = [a for a in arms or () if a not in spec.arms]
        if unknown:
            raise CampaignError(campaign.path, None, f"unknown arm {unknown[0]!r}; arms are {', '.join(spec.arms)}")
        self.arms = list(arms) if arms else list(spec.arms)
        self.use_cache = use_cache
        self.trials = trials or spec.trials
        self.progress = progress
        self.notice = notice
        self.cases = {c.id: c for c in load_dataset(campaign.resolve(spec.dataset))}
        self.policies = load_checks(campaign)

    def generate(self) -> tuple[list[Variant], list[Any]]:
        spec = self.campaign.spec
        paraphraser = guard = None
        if spec.perturbations.paraphrase is not None:
            from otel_plumb.campaign.paraphrase import make_guard, make_paraphraser

            paraphraser = make_paraphraser(self.campaign, spec.perturbations.paraphrase)
            guard = make_guard(self.campaign, spec.perturbations.paraphrase.effective_guard)
        return generate_variants(self.campaign, list(self.cases.values()), paraphraser, guard)

    def start(self, resume: str | None = None, variants: list[Variant] | None = None,
              parent: str | None = None, note: str | None = None) -> str:
        """A new run (variants generated and stored), or the run to resume."""
        if resume is not None:
            info = self.store.run(resume)
            if info.campaign != self.campaign.spec.campaign:
                raise CampaignError(self.campaign.path, None,
                                    f"run {info.run_id} is of campaign {info.campaign!r}, not "
                                    f"{self.campaign.spec.campaign!r}")
            self.store.set_status(info.run_id, "running")
            return info.run_id
        discards: list[Any] = []
        if variants is None:
            variants, discards = self.generate()
        run_id = self.store.create_run(self.campaign.spec.campaign, str(self.campaign.path), self.campaign.raw,
                                       self.campaign.spec.seed, self.arms, parent, note)
        self.store.save_variants(run_id, variants, discards)
        return run_id

    async def execute(self, run_id: str) -> RunOutcome:
        spec = self.campaign.spec
        variants = self.store.variants(run_id)
        done = self.store.finished_trial_ids(run_id)
        planned = [p for p in plan(self.campaign, variants, self.cases, self.arms, self.trials)
                   if p.row.trial_id not in done]
        limited = False
        if spec.limits.max_trials is not None:
            room = max(0, spec.limits.max_trials - len(done))
            limited = len(planned) > room
            planned = planned[:room]
        source = make_source(self.campaign)
        try:
            await source.start()
        except Exception as e:  # an unreachable Watch server, a port in use, unreadable files
            await source.stop()
            raise CampaignError(self.campaign.path, None, f"cannot start trace collection: {e}") from None
        runners = {arm: make_runner(spec.arms[arm], self.campaign.folder) for arm in self.arms}
        deadline = time.monotonic() + spec.limits.max_duration_s if spec.limits.max_duration_s else None
        queue: asyncio.Queue[PlannedTrial] = asyncio.Queue()
        for p in planned:
            queue.put_nowait(p)
        ran = 0
        status = "complete"
        silent: dict[str, int] = {}
        heard: set[str] = set()
        stopped: dict[str, str] = {}

        async def worker() -> None:
            nonlocal ran, status
            while not queue.empty():
                trial = queue.get_nowait()
                arm = trial.row.arm
                if deadline is not None and time.monotonic() > deadline:
                    status = "partial"
                    return
                if arm in stopped:
                    continue
                nothing = await self._trial(run_id, trial, runners[arm], source)
                ran += 1
                if trial.row.status == "ok":
                    heard.add(arm)
                elif nothing is not None and arm not in heard:
                    silent[arm] = silent.get(arm, 0) + 1
                    if silent[arm] >= SILENT_TRIALS and arm not in stopped:
                        stopped[arm] = (f"no spans from arm {arm} after {silent[arm]} trials: {nothing.hint}; "
                                        f"its other trials were not run")
                        if self.notice is not None:
                            self.notice(stopped[arm])
                if self.progress is not None:
                    self.progress(trial.row)

        try:
            await asyncio.gather(*(worker() for _ in range(min(spec.limits.concurrency, max(1, len(planned))))))
        except (asyncio.CancelledError, KeyboardInterrupt):
            self.store.set_status(run_id, "interrupted")
            raise
        finally:
            for runner in runners.values():
                await runner.close()
            await source.stop()
        if limited or stopped:
            status = "partial"
        self.store.set_status(run_id, status)
        return RunOutcome(run_id, status, ran, len(planned) - ran, stopped)

    async def _trial(self, run_id: str, trial: PlannedTrial, runner: Runner, source: TraceSource) -> NoSpans | None:
        """Run, judge and store one trial; the NoSpans when the agent answered but exported nothing."""
        row = trial.row
        nothing: NoSpans | None = None
        started = time.perf_counter()
        cached = self.store.cache_get(row.identity) if self.use_cache else None
        record: dict[str, Any] | None = None
        if cached is not None and cached[2] is not None:
            answer, trace_id, cached_record = cached
            row.answer, row.trace_id, row.cached = answer, trace_id, True
            assert cached_record is not None
            record, row.traj_status, row.critical_ok, row.summary = judge(
                trajectory_from_record(cached_record), trial, self.policies)
            row.summary["state_key"] = state_key(answer.get("state"))
            row.status = "ok"
        else:
            trace_id = secrets.token_hex(16)
            row.trace_id = trace_id
            ctx = TraceContext(trace_id, secrets.token_hex(8), {
                CASE_ID: row.case_id, VARIANT_ID: row.variant_id, TRIAL_ID: row.trial_id, ARM: row.arm})
            request = self.request(trial, source.endpoints)
            try:
                row.answer = await runner(request, ctx) if source.runs_agents else {"output": None, "state": None}
                trajectory = await source.trajectory(trace_id, row.trial_id, self.campaign.spec.traces.deadline_s)
                row.trace_id = trajectory.trace_id or trace_id
                record, row.traj_status, row.critical_ok, row.summary = judge(trajectory, trial, self.policies)
                row.summary["state_key"] = state_key(row.answer.get("state"))
                row.status = "ok"
                self.store.cache_put(row.identity, row.answer, trace_id, record)
            except AgentError as e:
                row.status, row.error = "error", f"agent: {e}"
            except TraceMissing as e:
                row.status, row.error = "error", f"trace missing: {e}"
                nothing = e if isinstance(e, NoSpans) else None
        row.duration_ms = (time.perf_counter() - started) * 1000
        self.store.save_trial(run_id, row, record)
        return nothing

    def request(self, trial: PlannedTrial, endpoints: OtlpEndpoints | None) -> dict[str, Any]:
        changed = apply_steps(trial.case, trial.variant.steps)
        row = trial.row
        protocol = self.campaign.spec.arms[row.arm].otlp_protocol or GRPC
        return {
            "protocol": PROTOCOL,
            "campaign": self.campaign.spec.campaign,
            "case_id": row.case_id,
            "variant_id": row.variant_id,
            "trial_id": row.trial_id,
            "arm": row.arm,
            "perturbation": row.perturbation,
            "input": changed.input,
            "extra_tools": changed.extra_tools,
            "faults": changed.faults,
            "temperature": changed.temperature,
            "otlp_endpoint": endpoints.for_protocol(protocol) if endpoints else None,
            "otlp_protocol": protocol if endpoints else None,
            "otlp_grpc_endpoint": endpoints.grpc if endpoints else None,
            "otlp_http_endpoint": endpoints.http if endpoints else None,
        }
