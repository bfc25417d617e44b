"""Coverage: what the traces can and cannot support, with plain-language notes.

Counted from trajectories (every span is a step, so span counts come from ``source == "span"``
steps), optionally with what reading reported (spans left out, read errors). The result is a
JSON-ready dict: ``report["coverage"]`` and the ``coverage`` command.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Final

from otel_plumb.model import Trajectory
from otel_plumb.model.trajectory import ATTRIBUTES_DROPPED, CASE_ID
from otel_plumb.normalise.hints import CAPTURE_HINTS, FRAMEWORK_HINTS
from otel_plumb.replay import ReplayStats

CAPTURE_STATUSES: Final[tuple[str, ...]] = ("captured", "absent", "redacted", "undecodable")
GENERIC_CAPTURE_HINT: Final = "the instrumentation's content capture (tool arguments and results are often opt-in)"
# Longest lists kept in the report (names of tools and of spans not understood).
TOP_N: Final = 20


class CoverageCounter:
    """Accumulates coverage one trajectory at a time (replay streams them)."""

    def __init__(self, task_attributes: Sequence[str] = (), tool_names: Iterable[str] = ()) -> None:
        self.task_attributes = (CASE_ID, *task_attributes)
        # The policies' tool names: found in an unrecognised span's name, a sign of a missed convention.
        self.tool_names = frozenset(tool_names)
        self.unrecognised: Counter[str] = Counter()
        self.tools_in_unrecognised: Counter[str] = Counter()
        self.trajectories = 0
        self.spans = 0
        self.conventions: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.tool_calls = 0
        self.tool_calls_from_output = 0
        self.tool_calls_without_outcome = 0
        self.args: Counter[str] = Counter()
        self.results: Counter[str] = Counter()
        self.errored = 0
        # Tool calls without arguments, by the framework that wrote them (else the convention).
        self.absent_args_by_source: Counter[str] = Counter()
        # Per framework (instrumentation scope): spans, tool calls, tool calls with arguments.
        self.frameworks: dict[str, Counter[str]] = {}
        self.tools: dict[str, Counter[str]] = {}
        self.agents: dict[str, Counter[str]] = {}
        self.not_understood: Counter[str] = Counter()
        self.incomplete: Counter[str] = Counter()
        self.without_root = 0
        self.unlabelled = 0
        # Trajectories with model calls but no tool call at all, by the model calls' convention.
        self.llm_without_tools: Counter[str] = Counter()
        self.problems = 0
        self.problem_examples: list[str] = []

    def add(self, trajectory: Trajectory) -> None:
        self.trajectories += 1
        if not trajectory.complete:
            self.incomplete[trajectory.incomplete_reason or "unknown"] += 1
        if trajectory.root_span_id is None:
            self.without_root += 1
        if not any(trajectory.attributes.get(k) not in (None, "") for k in self.task_attributes):
            self.unlabelled += 1
        self.problems += len(trajectory.problems)
        if not any(s.kind == "tool" for s in trajectory.steps):
            llm = next((s for s in trajectory.steps if s.kind == "llm"), None)
            if llm is not None:
                self.llm_without_tools[llm.convention] += 1
        for p in trajectory.problems:
            if len(self.problem_examples) >= 10:
                break
            self.problem_examples.append(p)
        for step in trajectory.steps:
            if step.source == "span":
                self.spans += 1
                if step.framework is not None:
                    per_framework = self.frameworks.get(step.framework)
                    if per_framework is None:
                        per_framework = self.frameworks[step.framework] = Counter()
                    per_framework["spans"] += 1
                self.conventions[step.convention] += 1
                self.kinds[step.kind] += 1
                if step.kind == "other" and step.convention == "unknown":
                    self.not_understood[step.name] += 1
                elif step.convention == "unrecognised":
                    self.unrecognised[step.name] += 1
                    for tool in self.tool_names:
                        if tool in step.name:
                            self.tools_in_unrecognised[tool] += 1
            if step.kind != "tool":
                continue
            self.tool_calls += 1
            if step.source == "llm_output":
                self.tool_calls_from_output += 1
            elif not step.outcome_recorded:
                self.tool_calls_without_outcome += 1
            self.args[step.args_status] += 1
            self.results[step.result_status] += 1
            if step.args_status in ("absent", "redacted"):
                self.absent_args_by_source[step.framework or step.convention] += 1
            if step.framework is not None:
                self.frameworks[step.framework]["tool_calls"] += 1
                if step.args_status == "captured":
                    self.frameworks[step.framework]["with_arguments"] += 1
            per_tool = self.tools.get(step.name)
            if per_tool is None:
                per_tool = self.tools[step.name] = Counter()
            agent = step.agent or trajectory.agent or trajectory.service or "unknown"
            per_agent = self.agents.get(agent)
            if per_agent is None:
                per_agent = self.agents[agent] = Counter()
            per_agent["calls"] += 1
            per_agent[step.args_status] += 1
            per_tool["calls"] += 1
            if step.args_status == "captured":
                per_tool["with_arguments"] += 1
            if step.result_status == "captured":
                per_tool["with_result"] += 1
            if step.error is not None:
                self.errored += 1
                per_tool["errors"] += 1

    def report(self, stats: ReplayStats | None = None) -> dict[str, Any]:
        tools = sorted(self.tools.items(), key=lambda kv: (-kv[1]["calls"], kv[0]))
        out: dict[str, Any] = {
            "trajectories": self.trajectories,
            "spans": self.spans,
            "conventions": dict(self.conventions.most_common()),
            "steps_by_kind": {k: self.kinds.get(k, 0) for k in ("tool", "llm", "agent", "other")},
            "tool_calls": {
                "total": self.tool_calls,
                "from_model_output": self.tool_calls_from_output,
                "without_outcome": self.tool_calls_without_outcome,
                "arguments": {s: self.args.get(s, 0) for s in CAPTURE_STATUSES},
                "results": {s: self.results.get(s, 0) for s in CAPTURE_STATUSES},
                "errored": self.errored,
                "by_tool": {
                    name: {k: c.get(k, 0) for k in ("calls", "with_arguments", "with_result", "errors")}
                    for name, c in tools[:TOP_N]
                },
                "tools_seen": len(self.tools),
                "by_agent": {
                    name: {"calls": c["calls"], "arguments": {s: c.get(s, 0) for s in CAPTURE_STATUSES}}
                    for name, c in sorted(self.agents.items(), key=lambda kv: (-kv[1]["calls"], kv[0]))[:TOP_N]
                },
            },
            "not_understood": {
                "spans": sum(self.not_understood.values()),
                "names": dict(self.not_understood.most_common(TOP_N)),
            },
            "frameworks": {
                name: {k: c.get(k, 0) for k in ("spans", "tool_calls", "with_arguments")}
                for name, c in sorted(self.frameworks.items(), key=lambda kv: -kv[1]["spans"])
            },
            "unrecognised": {
                "spans": sum(self.unrecognised.values()),
                "names": dict(self.unrecognised.most_common(TOP_N)),
                "policy_tools_in_names": dict(self.tools_in_unrecognised.most_common(TOP_N)),
            },
            "incomplete": {"trajectories": sum(self.incomplete.values()), "by_reason": dict(self.incomplete)},
            "without_root": self.without_root,
            "unlabelled": {"trajectories": self.unlabelled, "attributes": list(self.task_attributes)},
            "model_calls_without_tool_calls": sum(self.llm_without_tools.values()),
            "problems": {"count": self.problems, "examples": list(self.problem_examples)},
            "spans_left_out": {
                "late": stats.late_spans if stats else 0,
                "over_limit": stats.over_limit_spans if stats else 0,
                "duplicate": stats.duplicate_spans if stats else 0,
            },
            "read_errors": stats.errors_total if stats else 0,
        }
        out["notes"] = self.notes(stats)
        return out

    def notes(self, stats: ReplayStats | None = None) -> list[str]:
        notes: list[str] = []
        total_spans = self.spans
        if self.trajectories == 0:
            notes.append("No spans were read: nothing can be checked.")
            return notes
        if self.tool_calls == 0:
            notes.append(
                f"No tool calls in {self.trajectories} trajectories: call and argument checks have nothing to "
                "look at (is the agent instrumented for tool execution?)."
            )
        # Where arguments are absent or redacted, how each framework (else convention) records them.
        hints: dict[str, str] = {**CAPTURE_HINTS, **FRAMEWORK_HINTS}
        where = "; ".join(
            f"{source}: {hints.get(source) or GENERIC_CAPTURE_HINT}"
            for source, _ in self.absent_args_by_source.most_common()
        )
        absent = self.args.get("absent", 0)
        if absent:
            notes.append(
                f"{absent} of {self.tool_calls} tool calls carry no arguments: argument checks will be "
                f"indeterminate for them; enable content capture ({where})."
            )
        redacted = self.args.get("redacted", 0)
        if redacted:
            notes.append(
                f"{redacted} of {self.tool_calls} tool calls have redacted arguments (a placeholder such as "
                f"<REDACTED>): argument checks will be indeterminate for them; to record them: {where}."
            )
        undecodable = self.args.get("undecodable", 0)
        if undecodable:
            notes.append(f"{undecodable} of {self.tool_calls} tool calls have arguments that could not be decoded "
                         "(kept as raw text): argument checks will be indeterminate for them.")  # fmt: skip
        no_result = self.tool_calls - self.results.get("captured", 0)
        if self.tool_calls and no_result:
            notes.append(
                f"{no_result} of {self.tool_calls} tool calls carry no usable result: checks that compare "
                "against a step's result will be indeterminate for them."
            )
        if self.errored:
            notes.append(
                f"{self.errored} of {self.tool_calls} tool calls failed: a failed call does not count as made "
                "(must_call)."
            )
        if self.tool_calls_from_output:
            notes.append(
                f"{self.tool_calls_from_output} tool calls were read from model output messages, not from tool "
                "spans: whether they ran and succeeded is not recorded, so checks that turn on it are "
                "indeterminate (instrument the tools, a span per call, to have them decided)."
            )
        if self.tool_calls_without_outcome:
            notes.append(
                f"{self.tool_calls_without_outcome} tool calls are recorded by a span that does not say how they "
                "ended (an MCP client span with no span of the server's under it, or a span the SDK cut): whether "
                "they succeeded is not recorded, so checks that turn on it are indeterminate (trace the MCP server "
                "too; raise the SDK's span limits)."
            )
        no_tools = sum(self.llm_without_tools.values())
        if no_tools:
            where = "; ".join(
                f"{conv}: {hints.get(conv) or GENERIC_CAPTURE_HINT}" for conv, _ in self.llm_without_tools.most_common()
            )
            notes.append(
                f"{no_tools} of {self.trajectories} trajectories have model calls but no tool call: if the agent "
                f"used tools, they were not recorded (tool calls requested in model output need message content "
                f"capture: {where})."
            )
        unknown = sum(self.not_understood.values())
        if unknown:
            names = ", ".join(repr(n) for n, _ in self.not_understood.most_common(3))
            notes.append(
                f"{unknown} of {total_spans} spans follow no known convention (e.g. {names}): they are kept as "
                "'other' steps and never count as tool calls."
            )
        unrecognised = sum(self.unrecognised.values())
        if unrecognised:
            names = ", ".join(repr(n) for n, _ in self.unrecognised.most_common(3))
            notes.append(
                f"{unrecognised} spans look like an agent framework's (they speak of tools, agents or model calls) but "
                f"follow no convention otel-plumb reads (e.g. {names}): their trajectories are incomplete "
                "(unrecognised_spans) and checks on which tools were called are indeterminate. See the problems for "
                "their attribute namespaces; instrument the agent with OpenInference or the OTel GenAI conventions."
            )
        if self.tools_in_unrecognised:
            tools = ", ".join(repr(t) for t, _ in self.tools_in_unrecognised.most_common(3))
            notes.append(
                f"The policies' tools {tools} appear in the names of unrecognised spans: a strong sign that a "
                "framework's tool calls are there but in a convention otel-plumb does not read."
            )
        incomplete = sum(self.incomplete.values())
        if incomplete:
            reasons = ", ".join(f"{r}: {n}" for r, n in self.incomplete.most_common())
            notes.append(
                f"{incomplete} of {self.trajectories} trajectories are incomplete ({reasons}): their verdicts "
                "are indeterminate at best."
            )
        if self.incomplete.get("unreadable_input"):
            notes.append(
                f"{self.incomplete['unreadable_input']} trajectories are incomplete because part of their input "
                "could not be read and the format cannot tell which trace it held: every trajectory of a file "
                "with an unreadable line or record is marked (see errors[] for where)."
            )
        if self.incomplete.get(ATTRIBUTES_DROPPED):
            notes.append(
                f"{self.incomplete[ATTRIBUTES_DROPPED]} trajectories are incomplete because the SDK dropped attributes "
                "or events from some of their spans (its span limits, 128 by default, which a long conversation's "
                "messages exceed): raise OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT and OTEL_SPAN_EVENT_COUNT_LIMIT where the "
                "agent runs (the problems name the spans)."
            )
        if self.unlabelled:
            keys = " or ".join(self.task_attributes)
            notes.append(
                f"{self.unlabelled} of {self.trajectories} trajectories carry no task label ({keys}): they cannot "
                "be grouped by case or matched to per-task ground truth."
            )
        if stats is not None and stats.late_spans:
            notes.append(
                f"{stats.late_spans} spans arrived long after the rest of their trace and were left out of it."
            )
        if stats is not None and stats.duplicate_spans:
            notes.append(
                f"{stats.duplicate_spans} spans were read more than once (same trace and span id, e.g. a retried "
                "export) and were counted once."
            )
        if stats is not None and stats.over_limit_spans:
            notes.append(f"{stats.over_limit_spans} spans were past the per-trace span limit and were left out.")
        if self.problems:
            were = "value was" if self.problems == 1 else "values were"
            notes.append(f"{self.problems} {were} present but not understood, or cut (see problems.examples).")
        return notes


def coverage_report(
    trajectories: Iterable[Trajectory],
    stats: ReplayStats | None = None,
    task_attributes: Sequence[str] = (),
    tool_names: Iterable[str] = (),
) -> dict[str, Any]:
    counter = CoverageCounter(task_attributes, tool_names)
    for t in trajectories:
        counter.add(t)
    return counter.report(stats)
