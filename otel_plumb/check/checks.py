"""The check kinds. Each looks at the steps in scope and returns an ``Outcome``.

Rules shared by all: a failed call did not happen (only successful calls satisfy or count,
except ``never_call`` with ``attempts`` and budgets, which count effort); arguments that were
not captured make an argument check indeterminate, never a pass; on an incomplete trajectory
a check that a later span could still satisfy (``must_call``, ``responds``, ``call_count``
min) is indeterminate rather than failed.

A call only the model's request records (``source: llm_output``: no tool span of its own) may
have failed, or not run at all when its result was never given back; one only a client span
that does not record how it ended records (the MCP SDK's) may have failed. Either is a call
that *may* have been made (``Step.unsure``, ``split_calls``). A verdict stands only if it holds
whichever way such calls went; else it is indeterminate, naming the call.

A CEL expression (``arg_satisfies``, ``expr``) that may read a stand-in in trace values (a
placeholder, a redaction marker: ``read_stand_in``) is indeterminate without being evaluated:
it would decide on the stand-in's text, "<REDACTED>" != "boss@corp.com" a false pass.

Steps timed by different clocks (an agent and a tool server or sub-agent on another host) are
ordered as far as the trace can say (``Trajectory.start_bounds``): a verdict that turns on the
order of calls stands only if it holds in every order the trace allows (``over_orders``).

A run is *provisional* when it checks a trajectory still in flight (early verdicts): step
indices are not final there (a span that starts earlier, the root first of all, may still
arrive and shift every index), so its messages name a step by span id and call ordinal
(``Run.where`` / ``Run.at``) and its verdicts carry no step index.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from otel_plumb.check.expr import BudgetExceeded, CostBudget, EvaluationError, Expression
from otel_plumb.check.regex import Regex
from otel_plumb.check.values import (
    MISSING,
    CompareMode,
    PathSegment,
    Unreadable,
    equal,
    plain,
    read_argument,
    stand_in_read,
    stand_in_within,
)
from otel_plumb.model import Step, Trajectory, VerdictValue

Tools = frozenset[str]


@dataclass(slots=True, init=False)  # its own __init__: see model/trajectory.py
class Outcome:
    verdict: VerdictValue
    step: Step | None = None
    message: str = ""
    expected: Any = None
    got: Any = None

    def __init__(
        self, verdict: VerdictValue, step: Step | None = None, message: str = "", expected: Any = None, got: Any = None
    ) -> None:
        self.verdict = verdict
        self.step = step
        self.message = message
        self.expected = expected
        self.got = got


PASS: Final = Outcome("pass")


def tools_text(tools: Tools) -> str:
    return " or ".join(sorted(tools))


class Run:
    """One trajectory as seen by one policy: its steps and its ground truth. The maps CEL
    expressions read are built lazily, once per trajectory and set of fields.

    ``provisional``: the trajectory is still in flight (so never ``complete``) and its step
    indices may change. ``reason``: why it is not complete (the trajectory's own reason, or
    one the policy found: a span named like one of its tools that no convention reads).
    ``budget``: what its CEL expressions may still cost (``expr.CostBudget``)."""

    __slots__ = (
        "_calls", "_cel_steps", "_ctx_stand_ins", "_stand_ins", "_unsure", "budget", "complete", "ctx",
        "provisional", "reason", "trajectory",
    )  # fmt: skip

    def __init__(
        self,
        trajectory: Trajectory,
        ctx: dict[str, Any],
        complete: bool,
        *,
        provisional: bool = False,
        reason: str | None = None,
    ) -> None:
        self.trajectory = trajectory
        self.ctx = ctx
        self.complete = complete
        self.provisional = provisional
        self.reason = reason if reason is not None else trajectory.incomplete_reason
        self.budget = CostBudget()
        self._cel_steps: dict[frozenset[str], list[dict[str, Any]]] = {}
        # Successful calls per set of tools, by step index (built once per trajectory).
        self._calls: dict[Tools, tuple[list[int], list[Step]]] = {}
        # What ``stand_in_in_steps`` found over all the steps, per expression.
        self._stand_ins: dict[Expression, tuple[Step, str] | None] = {}
        # What ``ctx_stand_in`` found, per expression.
        self._ctx_stand_ins: dict[Expression, str | None] = {}
        # What ``first_unsure_call`` found over all the steps, once looked for.
        self._unsure: tuple[Step | None] | None = None

    def where(self, step: Step) -> str:
        """Where ``step`` is, for a message: ``step N``, or ``span X`` while indices are provisional."""
        return f"span {step.span_id}" if self.provisional else f"step {step.index}"

    def at(self, step: Step, call: int) -> str:
        """``at step N``, or ``(call C, span X)`` while indices are provisional: ``call`` is the
        step's ordinal among the calls the check counts."""
        return f"(call {call}, {self.where(step)})" if self.provisional else f"at {self.where(step)}"

    @property
    def index_note(self) -> str:
        """Appended to a message that names a step by its span while indices are provisional."""
        return " (step index provisional until the trajectory completes)" if self.provisional else ""

    @property
    def steps(self) -> list[Step]:
        return self.trajectory.steps

    def last_call_before(self, tools: Tools, index: int) -> Step | None:
        """The last call of ``tools`` before step ``index`` that may have succeeded (an unsure
        call included: the caller tells it apart): from an index of those
        calls built on first use (O(steps) once, then O(log calls) a lookup), so an argument
        check that reads an earlier step stays linear in the trajectory."""
        indices, calls = self._calls_of(tools)
        at = bisect.bisect_left(indices, index)
        return calls[at - 1] if at else None

    def call_in_unknown_order(self, tools: Tools, step: Step) -> Step | None:
        """A call of ``tools`` (as ``last_call_before`` counts them) the trace cannot say started
        before ``step`` or after it (``started_before``), or None."""
        t = self.trajectory
        if not t.start_bounds:
            return None
        return next((c for c in self._calls_of(tools)[1] if started_before(t, c, step) is None), None)

    def _calls_of(self, tools: Tools) -> tuple[list[int], list[Step]]:
        """The calls of ``tools`` that may have succeeded, in step order, and their indices."""
        calls = self._calls.get(tools)
        if calls is None:
            made, maybe = split_calls(self.trajectory.steps, tools)
            found = sorted(made + maybe, key=_index)
            calls = self._calls[tools] = ([s.index for s in found], found)
        return calls

    def cel_steps(self, steps: Sequence[Step], fields: frozenset[str]) -> list[dict[str, Any]]:
        built = self._cel_steps.get(fields)
        if built is None:
            getters = _step_getters(fields)
            built = self._cel_steps[fields] = [{k: get(s) for k, get in getters} for s in self.trajectory.steps]
        if steps is self.trajectory.steps:
            return built
        by_position = {s.index: i for i, s in enumerate(self.trajectory.steps)}
        return [built[by_position[s.index]] for s in steps]

    def stand_in_in_steps(self, expression: Expression, steps: Sequence[Step]) -> tuple[Step, str] | None:
        """The first of ``steps`` holding a stand-in ``expression`` may read, and what
        (``read_stand_in``); over all the steps once per expression, since ``arg_satisfies``
        asks on every call."""
        every = steps is self.trajectory.steps
        if every and expression in self._stand_ins:
            return self._stand_ins[expression]
        found: tuple[Step, str] | None = None
        if expression.value_roots:
            for s in steps:
                what = read_stand_in(self, expression, s)
                if what is not None:
                    found = (s, what)
                    break
        if every:
            self._stand_ins[expression] = found
        return found

    def stand_in_read_by(
        self, expression: Expression, steps: Sequence[Step], call: Step | None = None
    ) -> tuple[Step | None, str] | None:
        """A stand-in ``expression`` may read, and where: in ``call``'s arguments or result, in
        one of ``steps`` when it reads them, or in the context. (The step holding it, or None
        for the context; what it is), or None when it reads none. The ``error`` of an unsure call
        (``Step.unsure``) is one: null there says nothing about how the call ended; so is a
        duration spanning the times of several clocks (``_skewed_duration``)."""
        if call is not None and expression.value_roots:
            what = read_stand_in(self, expression, call)
            if what is not None:
                return call, what
        if "steps" in expression.variables:
            found = self.stand_in_in_steps(expression, steps)
            if found is not None:
                return found
            if "error" in step_fields(expression):
                unsure = self.first_unsure_call(steps)
                if unsure is not None:
                    return unsure, f"the error is unknown: {unsure_text(self, unsure)}"
        if "trajectory" in expression.variables and "duration_ms" in trajectory_fields(expression):
            skewed = _skewed_duration(self.trajectory)
            if skewed is not None:
                return None, skewed
        what = self.ctx_stand_in(expression)
        return None if what is None else (None, what)

    def first_unsure_call(self, steps: Sequence[Step]) -> Step | None:
        """The first of ``steps`` that is an unsure call (``Step.unsure``); over all the steps
        once per trajectory, since ``arg_satisfies`` asks on every call."""
        every = steps is self.trajectory.steps
        if every and self._unsure is not None:
            return self._unsure[0]
        found = next((s for s in steps if s.kind == "tool" and s.unsure), None)
        if every:
            self._unsure = (found,)
        return found

    def ctx_stand_in(self, expression: Expression) -> str | None:
        """What of the context ``expression`` may read is a stand-in, as ``ctx.amount is a
        redaction placeholder`` (ground truth carried on spans may be redacted on the way, as
        any attribute); None when none is. Once per expression."""
        if "ctx" not in expression.variables or not self.ctx:
            return None
        if expression not in self._ctx_stand_ins:
            found = stand_in_read(self.ctx, expression.words, "ctx" in expression.whole_roots)
            self._ctx_stand_ins[expression] = None if found is None else f"ctx{found[0]} is {found[1]}"
        return self._ctx_stand_ins[expression]

    def cel_trajectory(self, fields: frozenset[str]) -> dict[str, Any]:
        t = self.trajectory
        return {k: get(t, self) for k, get in TRAJECTORY_FIELDS.items() if k in fields}

    def activation(self, expression: Expression, steps: Sequence[Step], **extra: Any) -> dict[str, Any]:
        """The variables ``expression`` reads, and only those: converting values to CEL is the
        cost of an expression, so step and trajectory maps carry only the fields it names."""
        names = expression.variables
        act: dict[str, Any] = {k: v for k, v in extra.items() if k in names}
        if "ctx" in names:
            act["ctx"] = self.ctx
        if "steps" in names:
            act["steps"] = self.cel_steps(steps, step_fields(expression))
        if "trajectory" in names:
            act["trajectory"] = self.cel_trajectory(trajectory_fields(expression))
        return act


STEP_FIELDS: Final[dict[str, Callable[[Step], Any]]] = {
    "index": lambda s: s.index,
    "kind": lambda s: s.kind,
    "name": lambda s: s.name,
    "span_id": lambda s: s.span_id,
    "args": lambda s: s.args if s.args_status == "captured" else None,
    "args_status": lambda s: s.args_status,
    "result": lambda s: s.result if s.result_status == "captured" else None,
    "result_status": lambda s: s.result_status,
    "error": lambda s: s.error,
    "agent": lambda s: s.agent,
    "source": lambda s: s.source,
    "duration_ms": lambda s: s.duration_ms,
    "tokens": lambda s: s.tokens,
}
TRAJECTORY_FIELDS: Final[dict[str, Callable[[Trajectory, Run], Any]]] = {
    "key": lambda t, r: t.key,
    "trace_id": lambda t, r: t.trace_id,
    "service": lambda t, r: t.service,
    "agent": lambda t, r: t.agent,
    "complete": lambda t, r: r.complete,
    "duration_ms": lambda t, r: max(0, t.end_ns - t.start_ns) / 1e6,
    "step_count": lambda t, r: len(t.steps),
    "attributes": lambda t, r: t.attributes,
}


ALL_STEP_FIELDS: Final = frozenset(STEP_FIELDS)
ALL_TRAJECTORY_FIELDS: Final = frozenset(TRAJECTORY_FIELDS)


def step_fields(expression: Expression) -> frozenset[str]:
    """The fields of the step maps ``expression`` is given: those it names, or every one when it
    may read a map whole (``Expression.maps_whole``: ``steps[0] == steps[1]`` compares them all)."""
    return ALL_STEP_FIELDS if expression.maps_whole else expression.words


def trajectory_fields(expression: Expression) -> frozenset[str]:
    """The fields of the trajectory map ``expression`` is given: those it names, or every one
    when it reads the map whole (``Expression.trajectory_whole``)."""
    return ALL_TRAJECTORY_FIELDS if expression.trajectory_whole else expression.words


def cel_step(s: Step, fields: frozenset[str] = ALL_STEP_FIELDS) -> dict[str, Any]:
    return {k: get(s) for k, get in _step_getters(fields)}


@functools.lru_cache(maxsize=1024)
def _step_getters(fields: frozenset[str]) -> tuple[tuple[str, Callable[[Step], Any]], ...]:
    """The step fields an expression names, picked once per set of names (not once per step)."""
    return tuple((k, get) for k, get in STEP_FIELDS.items() if k in fields)


def read_stand_in(run: Run, expression: Expression, s: Step) -> str | None:
    """What of step ``s``'s arguments or result ``expression`` may read is a stand-in, as
    ``send_email at step 3: args.to is a redaction placeholder``; None when none is. Read means
    (``values.stand_in_read``): under a key the expression names, anywhere in a root it reads
    whole (``Expression.whole_roots``), or the root itself. Only the roots it names are walked."""
    roots = expression.value_roots
    for root, value, status in (("args", s.args, s.args_status), ("result", s.result, s.result_status)):
        if root in roots and status == "captured":  # not captured: CEL sees null, no stand-in
            found = stand_in_read(value, expression.words, root in expression.whole_roots)
            if found is not None:
                return f"{s.name} at {run.where(s)}: {root}{found[0]} is {found[1]}"
    return None


def step_summary(run: Run, s: Step) -> dict[str, Any]:
    """What a verdict's ``got`` shows of a step: its index, or its span while indices are provisional."""
    out: dict[str, Any] = {"span": s.span_id} if run.provisional else {"step": s.index}
    out["name"] = s.name
    if s.args_status == "captured":
        out["args"] = s.args
    if s.error is not None:
        out["error"] = s.error
    return out


def _index(s: Step) -> int:
    return s.index


def split_calls(steps: Sequence[Step], tools: Tools, *, attempts: bool = False) -> tuple[list[Step], list[Step]]:
    """The calls of ``tools`` the trace shows made, and those it cannot tell. Made: a tool span
    without an error (with ``attempts``, any tool span saying how it ended, and a requested call
    whose result went back to the model). Cannot tell: an unsure call (``Step.unsure``), which
    may have failed, or not run (a span the SDK cut may be no call at all)."""
    made: list[Step] = []
    maybe: list[Step] = []
    for s in steps:
        if s.kind != "tool" or s.name not in tools:
            continue
        if not s.unsure:
            if attempts or s.error is None:
                made.append(s)
        elif attempts and _ran(s):
            made.append(s)
        else:
            maybe.append(s)
    return made, maybe


def unsure_text(run: Run, s: Step) -> str:
    """Why an unsure call (``Step.unsure``) does not count for sure."""
    if s.source == "span":
        return (f"{s.name} at {run.where(s)} is recorded by a span that does not say how it ended (an MCP client "
                "span with no server span under it, or a span the SDK cut)")  # fmt: skip
    how = "how it ended" if s.result_status != "absent" else "whether it ran"
    return f"{s.name} at {run.where(s)} was asked for by the model, and no tool span records {how}"


# Calls the trace cannot tell about that a check goes through every outcome of (2^n runs).
MAX_UNSURE_CALLS: Final = 8


def over_unsure_calls(
    run: Run, steps: Sequence[Step], tools: Tools | None, decide: Callable[[Run, Sequence[Step]], Outcome]
) -> Outcome:
    """``decide`` whichever way the unsure calls (``Step.unsure``) of ``tools`` (None: of any
    tool) went: each in or out of the steps (a failed call did not happen), the
    verdict all ways give, else indeterminate. For checks whose verdict turns on the order of
    calls, not just their number."""
    maybe = [s for s in steps if s.kind == "tool" and s.unsure and (tools is None or s.name in tools)]
    if not maybe:
        return decide(run, steps)
    if len(maybe) > MAX_UNSURE_CALLS:
        return Outcome("indeterminate", maybe[0], f"{len(maybe)} tool calls it reads may have failed or not run "
                       "(first: " + unsure_text(run, maybe[0]) + ")")  # fmt: skip
    unsure = {id(s) for s in maybe}
    base = decide(run, [s for s in steps if id(s) not in unsure])
    for chosen in range(1, 1 << len(maybe)):
        left_out = {id(s) for i, s in enumerate(maybe) if not chosen >> i & 1}
        other = decide(run, [s for s in steps if id(s) not in left_out])
        if other.verdict != base.verdict:
            taken = next(s for i, s in enumerate(maybe) if chosen >> i & 1)
            return Outcome("indeterminate", taken, f"{base.verdict} or {other.verdict}, as "
                           + unsure_text(run, taken) + f" ({base.message or other.message})", base.expected,
                           base.got)  # fmt: skip
    return base


# Calls whose order is unknown that a check tries every order of, at most (6! = 720 orders).
MAX_LOOSE_STEPS: Final = 6


def start_bounds(t: Trajectory, s: Step) -> tuple[int, int | None]:
    """When ``s`` started by the agent's clock: its start, or after and before the bounds
    the trace gives when another clock timed it (``Trajectory.start_bounds``)."""
    found = t.start_bounds.get(s.span_id)
    return (s.start_ns, s.start_ns) if found is None else found


def started_before(t: Trajectory, a: Step, b: Step) -> bool | None:
    """Whether ``a`` started before ``b`` (True), after it (False), or either may have come
    first (None): steps of one clock, or of two traces of a session, by their order; of two
    clocks in one trace by ``start_bounds``."""
    clocks = t.clocks
    if not t.start_bounds or clocks.get(a.span_id) == clocks.get(b.span_id) or a.trace_id != b.trace_id:
        return a.index < b.index  # (the traces of a session are in the order they started)
    lo_a, hi_a = start_bounds(t, a)
    lo_b, hi_b = start_bounds(t, b)
    if hi_a is not None and hi_a <= lo_b:
        return True
    if hi_b is not None and hi_b <= lo_a:
        return False
    return None


def loose_steps(t: Trajectory, steps: Sequence[Step]) -> list[Step]:
    """Those of ``steps`` timed by one clock whose start the trace cannot place against another
    of ``steps`` of its trace timed by another (``started_before``), in step order; stops past
    MAX_LOOSE_STEPS. A sweep over the start bounds: O(steps log steps) plus the overlaps."""
    if not t.start_bounds:
        return []
    clocks = t.clocks
    loose: dict[int, Step] = {}
    open_bounds: list[tuple[int, int | None, Step]] = []  # of steps of other clocks, started by now
    for (lo, hi), s in sorted(((start_bounds(t, s), s) for s in steps), key=lambda b: b[0][0]):
        open_bounds = [b for b in open_bounds if b[1] is None or b[1] > lo]
        clock = clocks.get(s.span_id)
        for other_lo, _, other in open_bounds:
            if (
                clocks.get(other.span_id) != clock and other.trace_id == s.trace_id
                and not (hi is not None and hi <= other_lo)
            ):  # fmt: skip
                loose[id(other)], loose[id(s)] = other, s
        if hi is None or hi > lo:
            open_bounds.append((lo, hi, s))
        if len(loose) > MAX_LOOSE_STEPS:
            break
    return sorted(loose.values(), key=_index)


def over_orders(
    run: Run, steps: Sequence[Step], tools: Tools | None, decide: Callable[[Run, Sequence[Step]], Outcome]
) -> Outcome:
    """``decide`` on the steps in every order the trace allows the tool calls of ``tools`` (None:
    every step) to have started in: the verdict all give, else indeterminate. Calls timed by one
    clock keep their order; calls of two clocks whose start bounds overlap (``loose_steps``)
    may have started either way. ``decide`` is given the steps in step order, then only the
    steps read, in each other order."""
    t = run.trajectory
    if not t.start_bounds:
        return decide(run, steps)
    read = [s for s in steps if tools is None or (s.kind == "tool" and s.name in tools)]
    loose = loose_steps(t, read)
    if not loose:
        return decide(run, steps)
    if len(loose) > MAX_LOOSE_STEPS:
        return Outcome("indeterminate", loose[0], f"more than {MAX_LOOSE_STEPS} steps it reads were timed by "
                       "different clocks, which cannot say in which order they started (first: "
                       f"{run.where(loose[0])})")  # fmt: skip
    base = decide(run, steps)
    loose_ids = {id(s) for s in loose}
    fixed = [s for s in read if id(s) not in loose_ids]
    fixed_indices = [s.index for s in fixed]
    # Where each loose step goes among the others: after those before it (their order against
    # every step is known, and step order follows it).
    slot = {id(s): bisect.bisect_left(fixed_indices, s.index) for s in loose}
    for order in itertools.permutations(loose):
        if all(a is b for a, b in zip(order, loose, strict=True)) or not _possible(t, order, slot):
            continue
        place = {id(s): n for n, s in enumerate(order)}
        keyed = [((n, 1, 0), s) for n, s in enumerate(fixed)] + [((slot[id(s)], 0, place[id(s)]), s) for s in loose]
        other = decide(run, [s for _, s in sorted(keyed, key=lambda k: k[0])])
        if other.verdict != base.verdict:
            a, b = next((a, b) for a, b in itertools.combinations(order, 2) if a.index > b.index)
            return Outcome("indeterminate", b, f"{base.verdict} or {other.verdict}, as {run.where(b)} ({b.name}) "
                           f"and {run.where(a)} ({a.name}) were timed by different clocks ({t.clocks.get(b.span_id)}, "
                           f"{t.clocks.get(a.span_id)}), which cannot say which started first "
                           f"({base.message or other.message})", base.expected, base.got)  # fmt: skip
    return base


def _possible(t: Trajectory, order: Sequence[Step], slot: dict[int, int]) -> bool:
    """Whether the steps may have started in ``order``: none after one it surely started before."""
    for a, b in itertools.combinations(order, 2):
        if slot[id(a)] > slot[id(b)] or started_before(t, b, a) is True:
            return False
    return True


class Check:
    """Base: ``early`` marks kinds whose fail on a partial trajectory is final (SPEC 6);
    ``final_fail`` whether a fail on an incomplete trajectory stands; ``fail_survives_lost_data``
    whether it stands when spans may be missing from anywhere (``model.trajectory.DATA_LOST``)."""

    early = False
    final_fail = True
    fail_survives_lost_data = True

    def run(self, run: Run, steps: Sequence[Step]) -> Outcome:
        raise NotImplementedError


class MustCall(Check):
    def __init__(self, tools: Tools) -> None:
        self.tools = tools

    def run(self, run: Run, steps: Sequence[Step]) -> Outcome:
        made, maybe = split_calls(steps, self.tools)
        if made:
            return PASS
        expected = f"a successful call of {tools_text(self.tools)}"
        if maybe:
            return Outcome("indeterminate", maybe[0], unsure_text(run, maybe[0]), expected, "a requested call")
        failed = split_calls(steps, self.tools, attempts=True)[0]
        got = f"{len(failed)} failed call(s)" if failed else "no call"
        if not run.complete:
            return Outcome(
                "indeterminate", None, f"{expected} not seen yet and the trajectory is incomplete", expected, got
            )
        why = " (a failed call did not happen)" if failed else ""
        return Outcome("fail", None, f"{tools_text(self.tools)} was never called successfully{why}", expected, got)


class NeverCall(Check):
    early = True

    def __init__(self, tools: Tools, attempts: bool) -> None:
        self.tools = tools
        self.attempts = attempts

    def run(self, run: Run, steps: Sequence[Step]) -> Outcome:
        calls, maybe = split_calls(steps, self.tools, attempts=self.attempts)
        if not calls:
            if maybe:
                return Outcome("indeterminate", maybe[0], unsure_text(run, maybe[0]),
                               f"no call of {tools_text(self.tools)}", step_summary(run, maybe[0]))  # fmt: skip
            return PASS
        s = calls[0]
        what = "attempted" if s.error is not None else "called"
        return Outcome(
            "fail", s, f"{s.name} was {what} {run.at(s, 1)}", f"no call of {tools_text(self.tools)}",
            step_summary(run, s),
        )  # fmt: skip


class CallCount(Check):
    early = True

    def __init__(self, tools: Tools, low: int | None, high: int | None) -> None:
        self.tools, self.low, self.high = tools, low, high

    def run(self, run: Run, steps: Sequence[Step]) -> Outcome:
        calls, maybe = split_calls(steps, self.tools)
        n, m = len(calls), len(maybe)
        name = tools_text(self.tools)
        if self.high is not None and n > self.high:
            s = calls[self.high]
            return Outcome(
                "fail", s, f"{name} called successfully {n} times, at most {self.high} allowed; "
                f"call {self.high + 1} is {run.where(s)}{run.index_note}", f"at most {self.high}", n,
            )  # fmt: skip
        over = self.high is not None and n + m > self.high
        if maybe and (over or (self.low is not None and n < self.low <= n + m)):
            limits = (f"at least {self.low}" if self.low is not None else "",
                      f"at most {self.high}" if self.high is not None else "")  # fmt: skip
            bounds = " and ".join(text for text in limits if text)
            return Outcome("indeterminate", maybe[0], f"{name}: {n} successful call(s) and {m} more that may have "
                           f"been (first: {unsure_text(run, maybe[0])}), {bounds} allowed", bounds, n)  # fmt: skip
        if self.low is not None and n + m < self.low:
            if not run.complete:
                return Outcome("indeterminate", None, f"{name}: {n} of at least {self.low} calls so far; "
                               "the trajectory is incomplete", f"at least {self.low}", n)  # fmt: skip
            also = f" (and {m} more that may have been)" if m else ""
            return Outcome("fail", None, f"{name} called successfully {n} times{also}, at least {self.low} required",
                           f"at least {self.low}", n)  # fmt: skip
        return PASS


class OrderCheck(Check):
    """A check whose verdict turns on the order of the calls of ``read``: ``decide`` on the
    calls in one order, the verdict it gives whichever way the unsure calls went and in every
    order the trace allows."""

    read: Tools

    def run(self, run: Run, steps: Sequence[Step]) -> Outcome:
        return over_unsure_calls(run, steps, self.read, self.in_any_order)

    def in_any_order(self, run: Run, steps: Sequence[Step]) -> Outcome:
        return over_orders(run, steps, self.read, self.decide)

    def decide(self, run: Run, steps: Sequence[Step]) -> Outcome:
        raise NotImplementedError


class Precedes(OrderCheck):
    early = True
    # The earlier call it wants may be among the lost spans.
    fail_survives_lost_data = False

    def __init__(self, first: Tools, then: Tools) -> None:
        self.first, self.then = first, then
        self.read = first | then

    def decide(self, run: Run, steps: Sequence[Step]) -> Outcome:
        for s in steps:
            if s.kind != "tool" or s.error is not None:
                continue
            if s.name in self.first:
                return PASS
            if s.name in self.then:
                return Outcome(
                    "fail", s, f"{s.name} {run.at(s, 1)} without an earlier successful {tools_text(self.first)}",
                    f"{tools_text(self.first)} before {tools_text(self.then)}", step_summary(run, s),
                )  # fmt: skip
        return PASS


class Responds(OrderCheck):
    def __init__(self, trigger: Tools, then: Tools) -> None:
        self.trigger, self.then = trigger, then
        self.read = trigger | then

    def decide(self, run: Run, steps: Sequence[Step]) -> Outcome:
        waiting: Step | None = None
        for s in steps:
            if s.kind != "tool" or s.error is not None:
                continue
            if s.name in self.then and waiting is not None:
                waiting = None
            elif s.name in self.trigger and waiting is None:
                waiting = s
        if waiting is None:
            return PASS
        expected = f"a successful {tools_text(self.then)} after {waiting.name}"
        if not run.complete:
            return Outcome("indeterminate", waiting, f"no response to {run.where(waiting)} yet; "
                           "the trajectory is incomplete", expected, "nothing yet")  # fmt: skip
        return Outcome(
            "fail", waiting, f"{waiting.name} at {run.where(waiting)} was never followed by a successful "
            f"{tools_text(self.then)}", expected, "no response",
        )  # fmt: skip


class ArgumentCheck(Check):
    """Checks one argument of every successful call of ``tools``. Aggregation: the first
    failing call decides; else any undecidable call makes it indeterminate; else pass."""

    def __init__(self, tools: Tools, arg: str, path: tuple[PathSegment, ...]) -> None:
        self.tools, self.arg, self.path = tools, arg, path

    def run(self, run: Run, steps: Sequence[Step]) -> Outcome:
        calls, maybe = split_calls(steps, self.tools)
        if not calls and not maybe:
            verdict: VerdictValue = "not_applicable" if run.complete else "indeterminate"
            return Outcome(verdict, None, f"no successful call of {tools_text(self.tools)}"
                           + ("" if run.complete else " yet; the trajectory is incomplete"))  # fmt: skip
        out = self.check_calls(run, calls)
        if out.verdict == "fail" or not maybe:
            return out
        # A call that may not have succeeded: checked, but its fail (or pass, with no call surely
        # made: then it may be not applicable) is not the verdict.
        unsure = self.check_calls(run, maybe)
        if unsure.verdict == "fail" or (unsure.verdict == "pass" and not calls):
            s = unsure.step or maybe[0]
            detail = f" ({unsure.message})" if unsure.message else ""
            return Outcome("indeterminate", s, f"{unsure_text(run, s)}{detail}", unsure.expected, unsure.got)
        return out if out.verdict == "indeterminate" or unsure.verdict == "pass" else unsure

    def check_calls(self, run: Run, calls: Sequence[Step]) -> Outcome:
        """Fail at the first failing call, else indeterminate at the first undecidable, else pass."""
        undecided: Outcome | None = None
        for s in calls:
            if s.args_status != "captured":
                out = Outcome("indeterminate", s, f"arguments of {run.where(s)} ({s.name}) are {s.args_status}, "
                              "not captured")  # fmt: skip
            else:
                # arg_satisfies (no path) reads the arguments in CEL, where a missing key is an error.
                value = read_argument(s.args, self.path) if self.path else s.args
                if isinstance(value, Unreadable):
                    out = Outcome("indeterminate", s, f"{s.name} at {run.where(s)}: argument {self.arg} cannot be "
                                  f"read: {value.reason}")  # fmt: skip
                else:
                    out = self.check_call(run, s, value)
            if out.verdict == "fail":
                return out
            if out.verdict == "indeterminate" and undecided is None:
                undecided = out
        return undecided or PASS

    def check_call(self, run: Run, step: Step, value: Any) -> Outcome:
        raise NotImplementedError

    def missing(self, run: Run, step: Step, expected: Any) -> Outcome:
        return Outcome("fail", step, f"{step.name} at {run.where(step)} has no argument {self.arg}", expected, None)


class ArgEquals(ArgumentCheck):
    def __init__(
        self,
        tools: Tools,
        arg: str,
        path: tuple[PathSegment, ...],
        expected: Callable[[Run, Step], tuple[Any, str | None]],
        mode: CompareMode,
        tolerance: Decimal,
        *,
        from_step: bool = False,
        from_trace: bool = False,
    ) -> None:
        super().__init__(tools, arg, path)
        self.expected = expected
        self.mode, self.tolerance = mode, tolerance
        # Dataflow: the expected value is the last earlier call of the source tool, and on an
        # incomplete trajectory a later one may still be missing, so a mismatch is not final.
        self.final_fail = not from_step
        # The expected value is trace data (another call's, or ground truth carried on spans):
        # a placeholder there is no expected value.
        self.from_trace = from_trace or from_step

    def check_call(self, run: Run, step: Step, value: Any) -> Outcome:
        expected, why_unknown = self.expected(run, step)
        if why_unknown is None and self.from_trace:
            found = stand_in_within(expected)
            if found is not None:
                at = f" (at {found[0].lstrip('.')})" if found[0] else ""
                why_unknown = f"the value {self.arg} is compared with{at} is {found[1]}"
        if why_unknown is not None:
            return Outcome("indeterminate", step, f"expected value unknown: {why_unknown}", None, plain(value))
        if value is MISSING:
            return self.missing(run, step, plain(expected))
        if equal(value, expected, self.mode, self.tolerance):
            return PASS
        tol = f" (tolerance {self.tolerance})" if self.tolerance else ""
        return Outcome("fail", step, f"{step.name} at {run.where(step)}: {self.arg} is {value!r}, expected "
                       f"{plain(expected)!r}{tol}", plain(expected), plain(value))  # fmt: skip


class ArgMatches(ArgumentCheck):
    """``regex`` is RE2's (``check.regex``): matching takes time linear in the argument,
    whatever the pattern, since arguments come from the agent under test."""

    def __init__(self, tools: Tools, arg: str, path: tuple[PathSegment, ...], regex: Regex) -> None:
        super().__init__(tools, arg, path)
        self.regex = regex

    def check_call(self, run: Run, step: Step, value: Any) -> Outcome:
        expected = f"matches {self.regex.pattern}"
        if value is MISSING:
            return self.missing(run, step, expected)
        if isinstance(value, str):
            text = value
        elif isinstance(value, int) and not isinstance(value, bool):
            text = str(value)  # a JSON integer decodes and re-renders to the digits sent
        elif isinstance(value, (float, Decimal)):
            # 4820.00 decodes to 4820.0, 0.00001 to 1e-05: the text the call sent is not kept
            return Outcome("indeterminate", step, f"{self.arg} at {run.where(step)} is the number {value}, decoded "
                           "from JSON: the text the call sent is not kept, so the pattern cannot be matched",
                           expected, float(value))  # fmt: skip
        else:
            return Outcome("fail", step, f"{self.arg} at {run.where(step)} is not text", expected, value)
        if self.regex.found(text):
            return PASS
        return Outcome("fail", step, f"{step.name} at {run.where(step)}: {self.arg} {text!r} does not match "
                       f"{self.regex.pattern!r}", expected, value)  # fmt: skip


class ArgSatisfies(ArgumentCheck):
    def __init__(self, tools: Tools, expression: Expression) -> None:
        super().__init__(tools, "args", ())
        self.expression = expression
        self.final_fail = not ({"steps", "trajectory"} & expression.variables)

    def check_call(self, run: Run, step: Step, value: Any) -> Outcome:
        names = self.expression.variables
        if "result" in names and step.result_status != "captured":
            return Outcome("indeterminate", step, f"result of {run.where(step)} is {step.result_status}, not captured")
        hidden = run.stand_in_read_by(self.expression, run.steps, step)
        if hidden is not None:
            return Outcome("indeterminate", step, f"{hidden[1]}, which {self.expression.source} reads")
        act = run.activation(
            self.expression, run.steps, args=step.args, result=step.result,
            step=cel_step(step, step_fields(self.expression)) if "step" in names else None,
        )  # fmt: skip
        try:
            ok = self.expression.test(act, run.budget)
        except BudgetExceeded as over:
            return Outcome("indeterminate", step, str(over))
        except EvaluationError as exc:
            return Outcome("indeterminate", step, f"{self.expression.source}: {exc}")
        if ok:
            return PASS
        return Outcome("fail", step, f"{step.name} at {run.where(step)} does not satisfy {self.expression.source}",
                       self.expression.source, step.args)  # fmt: skip


class Budget(Check):
    early = True

    def __init__(self, limits: dict[str, float | int]) -> None:
        self.limits = limits

    def run(self, run: Run, steps: Sequence[Step]) -> Outcome:
        unknown: Outcome | None = None
        for name, limit in self.limits.items():
            locate = not run.provisional or name in _CROSSING_KNOWN_EARLY
            if name == "max_duration_ms":
                out = _duration(steps, limit, locate, run.trajectory.clocks)
            elif name == "max_tokens":
                out = _tokens(run, steps, int(limit), locate)
            else:
                counted, maybe = _BUDGET_COUNTS[name](steps)
                out = PASS
                what = name.removeprefix("max_").replace("_", " ")
                if len(counted) > limit:
                    s = counted[int(limit)]
                    where = f"the limit was crossed at {run.where(s)}" if locate else _CROSSING_LATER
                    out = Outcome("fail", s if locate else None, f"{what} {len(counted)} > {limit}; {where}",
                                  f"<= {limit}", len(counted))  # fmt: skip
                elif len(counted) + len(maybe) > limit:
                    out = Outcome("indeterminate", maybe[0], f"{what} {len(counted)}, and {len(maybe)} more that may "
                                  f"count (first: {unsure_text(run, maybe[0])}), against at most {limit}",
                                  f"<= {limit}", len(counted))  # fmt: skip
            if out.verdict == "fail":
                return out
            if out.verdict == "indeterminate" and unknown is None:
                unknown = out
        return unknown or PASS


def _tool_calls(steps: Sequence[Step]) -> tuple[list[Step], list[Step]]:
    """Tool calls that ran, and those that may have: an unsure call (``Step.unsure``), but one
    only the model's request records whose result was given back (it ran). A span that does
    not say how a call ended may be no call at all: the SDK may have cut what it was."""
    ran: list[Step] = []
    maybe: list[Step] = []
    for s in steps:
        if s.kind == "tool":
            (ran if _ran(s) else maybe).append(s)
    return ran, maybe


def _ran(s: Step) -> bool:
    """Whether a tool call surely ran: one the trace is sure of, or one only the model's request
    records whose result was given back to the model."""
    return not s.unsure or (s.source != "span" and s.result_status != "absent")


def _tool_errors(steps: Sequence[Step]) -> tuple[list[Step], list[Step]]:
    """Tool calls that failed, and those that may have: any unsure call (``Step.unsure``)."""
    failed = [s for s in steps if s.kind == "tool" and s.error is not None and not s.unsure]
    return failed, [s for s in steps if s.kind == "tool" and s.unsure]


# Per budget: the steps it surely counts, and those it may count.
_BUDGET_COUNTS: Final[dict[str, Callable[[Sequence[Step]], tuple[list[Step], list[Step]]]]] = {
    "max_steps": lambda steps: (list(steps), []),
    "max_tool_calls": _tool_calls,
    # A model call on a span the SDK cut may be another record of one counted already.
    "max_llm_calls": lambda steps: (
        [s for s in steps if s.kind == "llm" and s.outcome_recorded],
        [s for s in steps if s.kind == "llm" and not s.outcome_recorded],
    ),
    "max_tool_errors": _tool_errors,
}
# On a trajectory still in flight, where a limit was crossed is known only for the tool-call
# limits: the spans still to come start earlier than those seen and shift the crossing point of
# the others (the root, a step and the start of the duration; a framework's model-call span
# around the client library's, which takes over its count and tokens).
_CROSSING_KNOWN_EARLY: Final = frozenset({"max_tool_calls", "max_tool_errors"})
_CROSSING_LATER: Final = "where the limit was crossed is known when the trajectory completes"


def _duration(steps: Sequence[Step], limit: float, locate: bool, clocks: dict[str, str]) -> Outcome:
    """Fails when the steps timed by one clock took longer than the limit; when they took longer
    only by the times of two clocks together, which may be skewed, it cannot say."""
    if not steps:
        return PASS
    start, end = _extent(steps)
    took = (end - start) / 1e6
    if took <= limit:
        return PASS
    if not clocks:
        return _took_too_long(steps, start, took, limit, locate, "")
    by_clock = _steps_by_clock(steps, clocks)
    longest, longest_took = "", 0.0
    for clock, on_clock in by_clock.items():
        clock_start, clock_end = _extent(on_clock)
        clock_took = (clock_end - clock_start) / 1e6
        if clock_took > limit:
            return _took_too_long(on_clock, clock_start, clock_took, limit, locate, f" by the clock of {clock}")
        if clock_took >= longest_took:
            longest, longest_took = clock, clock_took
    return Outcome(
        "indeterminate", None, f"took {took:.0f} ms by the times of {_clocks_text(by_clock)}, which may be "
        f"skewed; by one clock at most {longest_took:.0f} ms ({longest}), within {limit:g} ms",
        f"<= {limit:g} ms", None,
    )  # fmt: skip


def _steps_by_clock(steps: Sequence[Step], clocks: dict[str, str]) -> dict[str, list[Step]]:
    by_clock: dict[str, list[Step]] = {}
    for s in steps:
        by_clock.setdefault(clocks.get(s.span_id, ""), []).append(s)
    return by_clock


def _clocks_text(by_clock: dict[str, list[Step]]) -> str:
    return f"{len(by_clock)} clocks ({', '.join(sorted(by_clock))})"


def _skewed_duration(t: Trajectory) -> str | None:
    """Why ``trajectory.duration_ms`` may be off: it spans the times of several clocks and is
    longer than the steps of any one took (so the clocks' skew is in it); None when it is not."""
    if not t.clocks or not t.steps:
        return None
    start, end = _extent(t.steps)
    by_clock = _steps_by_clock(t.steps, t.clocks)
    for on_clock in by_clock.values():
        if _extent(on_clock) == (start, end):
            return None
    return f"trajectory.duration_ms spans the times of {_clocks_text(by_clock)}, which may be skewed"


def _extent(steps: Sequence[Step]) -> tuple[int, int]:
    start, end = steps[0].start_ns, steps[0].end_ns
    for s in steps:  # a loop, not min() and max() over generators: compiled, those cost a call per step
        if s.start_ns < start:
            start = s.start_ns
        if s.end_ns > end:
            end = s.end_ns
    return start, end


def _took_too_long(steps: Sequence[Step], start: int, took: float, limit: float, locate: bool, by: str) -> Outcome:
    over = next((s for s in steps if (s.end_ns - start) / 1e6 > limit), None) if locate else None
    where = "" if locate else f"; {_CROSSING_LATER}"
    return Outcome("fail", over, f"took {took:.0f} ms{by}, more than {limit:g} ms{where}", f"<= {limit:g} ms",
                   round(took, 3))  # fmt: skip


def _tokens(run: Run, steps: Sequence[Step], limit: int, locate: bool) -> Outcome:
    total, seen = 0, False
    uncounted: Step | None = None
    # Tokens on spans the SDK cut: what merged such a span with another record of its call may
    # be gone, so they may be counted twice.
    cut_tokens, cut = 0, None
    for s in steps:
        if s.tokens is None:
            if uncounted is None and s.kind == "llm":
                uncounted = s
            continue
        seen = True
        if not s.outcome_recorded:
            cut_tokens += s.tokens
            if cut is None:
                cut = s
            continue
        total += s.tokens
        if total > limit:
            if not locate:
                return Outcome("fail", None, f"{total} tokens, more than {limit}; {_CROSSING_LATER}",
                               f"<= {limit}", total)  # fmt: skip
            return Outcome("fail", s, f"{total} tokens by {run.where(s)}, more than {limit}", f"<= {limit}", total)
    if cut is not None and total + cut_tokens > limit:
        return Outcome(
            "indeterminate", cut, f"{total} tokens counted, and {cut_tokens} more on spans the SDK cut, which may "
            f"count a model call twice (first: {run.where(cut)})", f"<= {limit}", total,
        )  # fmt: skip
    if uncounted is not None:
        # The counted tokens are within the limit, but a model call without a count may hold the rest.
        if not seen:
            return Outcome("indeterminate", None, "no token counts recorded on the model calls", f"<= {limit}", None)
        n = sum(1 for s in steps if s.kind == "llm" and s.tokens is None)
        return Outcome(
            "indeterminate", uncounted, f"{total} tokens counted, but {n} model call(s) recorded no token count "
            f"(first: {run.where(uncounted)}{run.index_note})", f"<= {limit}", total,
        )  # fmt: skip
    return PASS


class Expr(Check):
    def __init__(self, expression: Expression) -> None:
        self.expression = expression
        self.final_fail = False

    def run(self, run: Run, steps: Sequence[Step]) -> Outcome:
        hidden = run.stand_in_read_by(self.expression, steps)
        if hidden is not None:
            return Outcome("indeterminate", hidden[0], f"{hidden[1]}, which {self.expression.source} reads")
        if "steps" in self.expression.variables:
            return over_orders(run, steps, None, self.evaluate)
        return self.evaluate(run, steps)

    def evaluate(self, run: Run, steps: Sequence[Step]) -> Outcome:
        """The expression on ``steps``; in another order than step order (``over_orders``), a
        step's ``index`` is its place in it."""
        act = run.activation(self.expression, steps)
        if "steps" in act and "index" in step_fields(self.expression):
            indices = sorted(s.index for s in steps)
            if any(s.index != i for s, i in zip(steps, indices, strict=True)):
                act["steps"] = [{**m, "index": i} for m, i in zip(act["steps"], indices, strict=True)]
        try:
            ok = self.expression.test(act, run.budget)
        except BudgetExceeded as over:
            return Outcome("indeterminate", None, str(over))
        except EvaluationError as exc:
            return Outcome("indeterminate", None, f"{self.expression.source}: {exc}")
        if ok:
            return PASS
        return Outcome("fail", None, f"{self.expression.source} is false", self.expression.source, False)
