"""Streaming counts over trajectories, one ``GroupCounts`` per task group.

Everything here follows the check's semantics (``docs/policies.md``), so a candidate's support
is what the check would have said: a failed call did not happen, an argument check looks at the
successful calls with captured arguments, a dataflow source is the latest successful call of
the source tool before the checked call, budgets count every step. A branch field's tables
count the tool relations again per value of the field (``ValueCounts``), as a guard reading
that value would select the trajectories.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from otel_plumb.check.values import MISSING, PathSegment, canonical, lookup, parse_path
from otel_plumb.model import Step, Trajectory
from otel_plumb.suggest.formats import NOT_TEXT, Shape, ShapeStats, shape_of


@dataclass(frozen=True, slots=True)
class Limits:
    """What bounds memory and time (see the package docstring)."""

    # Counter-example trace ids kept per candidate.
    examples: int = 5
    # Distinct tool names per group; calls of further tools are left out (and counted).
    max_tools: int = 64
    # Trajectories in which argument candidates (paths, dataflow sources) are discovered.
    warmup: int = 1_000
    # Scalar fields read per call's arguments or result when discovering, and how deep.
    max_leaves: int = 16
    max_depth: int = 4
    # Dataflow sources tried per argument, the most often matching in the warm-up.
    max_sources: int = 4
    # Distinct value shapes (and sets of shapes per trajectory) kept per argument.
    max_shapes: int = 64
    # Distinct values remembered per argument (to tell a constant from a varying value).
    distinct_values: int = 3
    # Result fields that may decide a branch, and the values each may have.
    branch_fields: int = 8
    branch_values: int = 4


PASS, INDETERMINATE, FAIL = 0, 1, 2
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
# Where a trajectory's shapes did not fit in the table: never accepted.
OVERFLOW: frozenset[Shape] = frozenset({("<overflow>",)})
# Durations are left out: they measure the machine and the network more than the agent.
BUDGET_METRICS = ("max_steps", "max_tool_calls", "max_llm_calls", "max_tool_errors", "max_tokens")
# A source is tried only if it matched at least this share of a target's calls in the warm-up.
MIN_SOURCE_SHARE = 0.5


class Examples:
    """The first ``limit`` trace ids of something; the count goes on past it."""

    __slots__ = ("ids", "limit")

    def __init__(self, limit: int, ids: list[str] | None = None) -> None:
        self.limit = limit
        self.ids = (ids or [])[:limit]

    def add(self, trace_id: str) -> None:
        if len(self.ids) < self.limit:
            self.ids.append(trace_id)


class Histogram:
    """Counts per value (bucketed by the caller), with the first trace ids of each."""

    __slots__ = ("counts", "examples", "limit")

    def __init__(self, limit: int) -> None:
        self.counts: Counter[Any] = Counter()
        self.examples: dict[Any, Examples] = {}
        self.limit = limit

    def add(self, value: Any, trace_id: str) -> None:
        self.counts[value] += 1
        ex = self.examples.get(value)
        if ex is None:
            ex = self.examples[value] = Examples(self.limit)
        ex.add(trace_id)

    def ids(self, values: Any) -> list[str]:
        out: list[str] = []
        for v in sorted(values):
            out.extend(self.examples[v].ids)
        return out[: self.limit]


def bucket_up(value: float | int) -> float | int:
    """The smallest value with two significant digits at or above ``value`` (ints up to 100 exact)."""
    return _bucket(value, up=True)


def bucket_down(value: float | int) -> float | int:
    return _bucket(value, up=False)


def _bucket(value: float | int, up: bool) -> float | int:
    if (isinstance(value, int) and abs(value) <= 100) or value == 0:
        return value
    if value < 0:
        return -_bucket(-value, not up)
    exponent = math.floor(math.log10(value)) - 1
    step = 10**exponent
    if not step:  # below the smallest normal float: kept as it is
        return value
    if isinstance(value, int) or step >= 1:
        edge = math.ceil(value / step) * step if up else math.floor(value / step) * step
        if up and edge < value:
            edge += step
        elif not up and edge > value:
            edge -= step
        return int(edge)
    # Rounded in decimal from the float's exact value: the bound is written without float noise
    # (0.31, not 0.31000000000000005) and is never inside the value (0.1 + 0.2 gives 0.31 up, as
    # 0.3 is below it), since the nearest float to a decimal beyond a float is beyond it too.
    rounding = ROUND_CEILING if up else ROUND_FLOOR
    return float(Decimal(value).quantize(Decimal(1).scaleb(exponent), rounding=rounding))


# ---- arguments ---------------------------------------------------------------------------


def leaves(value: Any, limits: Limits) -> list[tuple[str, Any]]:
    """Scalar fields of a call's arguments or result as (path, value), paths in the policy's
    syntax (``a.b``, ``lines[0]``). A JSON string met on the way is decoded, as the check does."""
    out: list[tuple[str, Any]] = []

    def walk(v: Any, path: str, depth: int) -> None:
        if len(out) >= limits.max_leaves:
            return
        if isinstance(v, str) and v[:1] in ("{", "["):
            with contextlib.suppress(ValueError):
                v = json.loads(v)
        if isinstance(v, dict):
            if depth < limits.max_depth:
                for k, x in v.items():
                    if isinstance(k, str) and _KEY.match(k):
                        walk(x, f"{path}.{k}" if path else k, depth + 1)
        elif isinstance(v, list):
            if depth < limits.max_depth and path:
                for i, x in enumerate(v[:4]):
                    walk(x, f"{path}[{i}]", depth + 1)
        elif path and (isinstance(v, (str, int, float)) and not isinstance(v, bool)):
            out.append((path, v))

    walk(value, "", 0)
    return out


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class Source:
    """A dataflow source: a field of the arguments or the result of a tool's call."""

    tool: str
    field: str  # "arg" or "result"
    path: str


class Flow:
    """``arg_equals {tool, arg, step: {tool: source.tool, <field>: source.path}}`` counts."""

    __slots__ = ("applied", "examples", "first", "held", "parsed", "source", "varied")

    def __init__(self, source: Source, limit: int) -> None:
        self.source = source
        self.parsed = parse_path(source.path)
        self.applied = self.held = 0
        self.examples = Examples(limit)
        self.first: Any = MISSING
        self.varied = False


class Target:
    """One argument of one tool: its dataflow sources, format and numeric range counts."""

    __slots__ = ("all_int", "distinct", "flows", "format_applied", "format_keys", "format_partial", "high",
                 "high_partial", "low", "low_partial", "number_applied", "numeric", "parsed", "path", "shapes",
                 "tool")  # fmt: skip

    def __init__(self, tool: str, path: str, text: bool, numeric: bool, limits: Limits) -> None:
        self.tool, self.path = tool, path
        self.parsed: tuple[PathSegment, ...] = parse_path(path)
        self.flows: list[Flow] = []
        # Format: trajectories counted per set of shapes their calls had, and the shapes' stats.
        self.format_applied = 0
        self.format_keys: Histogram | None = Histogram(limits.examples) if text else None
        # Trajectories with an undecided call (arguments not captured): they fail only if a
        # decided call does not match, so they are kept apart and counted once the format is known.
        self.format_partial = Histogram(limits.examples)
        self.shapes: dict[Shape, ShapeStats] = {}
        self.distinct: set[str] = set()
        # Numeric range: per trajectory its smallest and largest value, bucketed.
        self.numeric = numeric
        self.number_applied = 0
        self.low = Histogram(limits.examples)
        self.high = Histogram(limits.examples)
        # As format_partial: trajectories with a call the CEL comparison errs on (a missing or
        # non-numeric value, arguments not captured), by their decided calls' extremes.
        self.low_partial = Histogram(limits.examples)
        self.high_partial = Histogram(limits.examples)
        self.all_int = True


# ---- tool calls and their order ----------------------------------------------------------


@dataclass(slots=True)
class Pairs:
    """One trajectory's outcomes per ordered pair key a * M + b of tools both called:
    ``precedes`` held (first a < first b), else failed at the first b; ``responds`` held (last b >
    last a) or failed; ``after``: a b after the first a (``never_call b`` after ``a`` failed),
    with the last b."""

    precedes: list[int]
    precedes_failed: list[tuple[int, int]]
    responds: list[int]
    responds_failed: list[int]
    after: list[tuple[int, int]]


def _pairs(items: list[tuple[int, int]], last: dict[int, int], m: int) -> Pairs:
    out = Pairs([], [], [], [], [])
    precedes, precedes_failed, responds, responds_failed, after = (
        out.precedes, out.precedes_failed, out.responds, out.responds_failed, out.after
    )  # fmt: skip
    for a, fa in items:
        la, am = last[a], a * m
        for b, fb in items:
            if a == b:
                continue
            key = am + b
            if fa < fb:
                precedes.append(key)
            else:
                precedes_failed.append((key, fb))
            lb = last[b]
            if lb > la:
                responds.append(key)
            else:
                responds_failed.append(key)
            if lb > fa:
                after.append((key, lb))
    return out


@dataclass(slots=True)
class Calls:
    """A trajectory's successful calls of the tools mined: (tool, first position) in order,
    the last position and the number of calls per tool, the tools it did not call, and its pairs."""

    items: list[tuple[int, int]]
    last: dict[int, int]
    count: dict[int, int]
    missing: list[int]
    pairs: Pairs


# ---- branches ----------------------------------------------------------------------------

# A longer text is not a branch's value (a message, a payload).
MAX_BRANCH_TEXT = 64


def branch_value(v: Any) -> Any:
    """``v`` if it can be a branch's value (text, an integer, a boolean: what a tool answers to
    steer what comes next, not a measurement), else MISSING."""
    if isinstance(v, (bool, int)) or (isinstance(v, str) and len(v) <= MAX_BRANCH_TEXT):
        return v
    return MISSING


def result_fields(value: Any, limits: Limits) -> list[tuple[tuple[str, ...], Any]]:
    """Branch values in a call's result as (keys, value): maps only, as CEL sees the result (a
    JSON string is not decoded, a list is not entered)."""
    out: list[tuple[tuple[str, ...], Any]] = []

    def walk(v: Any, keys: tuple[str, ...]) -> None:
        if len(out) >= limits.max_leaves:
            return
        if isinstance(v, dict):
            if len(keys) < limits.max_depth:
                for k, x in v.items():
                    if isinstance(k, str) and _KEY.match(k):
                        walk(x, (*keys, k))
        elif keys and branch_value(v) is not MISSING:
            out.append((keys, v))

    walk(value, ())
    return out


class FieldSeen:
    """A result field in the warm-up: its values (up to one past the limit), the tasks it was
    returned in (enough of them to compare), and whether it was disqualified."""

    __slots__ = ("dead", "kind", "tasks", "trajectories", "values")

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.values: set[Any] = set()
        self.tasks: set[Hashable] = set()
        self.trajectories = 0
        self.dead = False

    def add(self, v: Any, task: Hashable | None, mixed: bool, limits: Limits) -> None:
        self.trajectories += 1
        if mixed or type(v) is not self.kind or self.dead:
            self.dead = True
            return
        self.values.add(v)
        if len(self.values) > limits.branch_values:
            self.dead = True
        if task is not None and len(self.tasks) < 2 * limits.branch_values:
            self.tasks.add(task)

    def qualifies(self) -> bool:
        # Two tasks per value on average: an identifier of the task has one value per task.
        return not self.dead and len(self.values) >= 2 and len(self.tasks) >= 2 * len(self.values)


class ValueCounts:
    """The tool counts of the trajectories in which a branch field had one value (as the
    group's, without counter-examples), and the failures that happened before the field was
    returned ("late": it cannot have decided them): ``precedes`` at the first unpreceded call,
    ``never_call`` after at the last call, ``call_count`` at the tool's last call."""

    __slots__ = ("after", "counts", "late_after", "late_counts", "late_precedes", "n", "precedes", "present",
                 "responds", "tasks_with")  # fmt: skip

    def __init__(self) -> None:
        self.n = 0
        self.present: Counter[int] = Counter()
        # (tool, number of calls) -> trajectories
        self.counts: Counter[tuple[int, int]] = Counter()
        self.late_counts: Counter[tuple[int, int]] = Counter()
        self.precedes: Counter[int] = Counter()
        self.responds: Counter[int] = Counter()
        self.after: Counter[int] = Counter()
        self.late_precedes: Counter[int] = Counter()
        self.late_after: Counter[int] = Counter()
        # Up to two tasks of the trajectories (None) and of those that called each tool.
        self.tasks_with: defaultdict[int | None, set[Hashable]] = defaultdict(set)

    def add(self, calls: Calls, p: int, m: int, task: Callable[[], Hashable | None]) -> None:
        """Count one trajectory, whose field was first returned by the call at position ``p``
        (``task``: its task, asked for only while there are fewer than two)."""
        self.n += 1
        for x in (None, *calls.count):
            tasks = self.tasks_with[x]
            if len(tasks) < 2 and (key := task()) is not None:
                tasks.add(key)
        last = calls.last
        self.present.update(calls.count.keys())
        for b, n in calls.count.items():
            self.counts[(b, n)] += 1
            if last[b] < p:
                self.late_counts[(b, n)] += 1
        pairs = calls.pairs
        self.precedes.update(pairs.precedes)
        self.responds.update(pairs.responds)
        self.after.update(key for key, _ in pairs.after)
        self.late_precedes.update(key for key, fb in pairs.precedes_failed if fb < p)
        self.late_after.update(key for key, lb in pairs.after if lb < p)
        for b, fb in calls.items:
            if fb < p:
                self.late_precedes.update(a * m + b for a in calls.missing)


class Branch:
    """A result field of one tool that may decide a branch: counts per value, at most
    ``branch_values`` of them (dropped once it shows more, or two in one trajectory)."""

    __slots__ = ("keys", "kind", "tables", "tool")

    def __init__(self, tool: str, keys: tuple[str, ...], kind: type) -> None:
        self.tool, self.keys, self.kind = tool, keys, kind
        self.tables: dict[Any, ValueCounts] = {}

    @property
    def path(self) -> str:
        return ".".join(self.keys)

    def value(self, result: Any) -> Any:
        v = result
        for k in self.keys:
            if not isinstance(v, dict):
                return MISSING
            v = v.get(k, MISSING)
        return branch_value(v)


# ---- per group ---------------------------------------------------------------------------


class GroupCounts:
    """Counts for the trajectories of one task group. ``add`` is called once per trajectory."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.n = 0
        self.tools: list[str] = []
        self.index: dict[str, int] = {}
        self.ignored_tools: set[str] = set()
        # The first trace ids overall: the counter-examples of a must_call whose tool first
        # shows after them.
        self.early = Examples(limits.examples)
        # Per tool (by index).
        self.present: list[int] = []
        self.first_with: list[Examples] = []
        self.absent: list[Examples] = []
        self.counts: list[Histogram] = []
        # Per ordered pair a * M + b: precedes(a, b) held, responds(a, b) held, and trajectories
        # with a successful b after the first successful a (never_call b after a failed).
        self.precedes: Counter[int] = Counter()
        self.responds: Counter[int] = Counter()
        self.after: Counter[int] = Counter()
        self.precedes_ex: dict[int, Examples] = {}
        self.responds_ex: dict[int, Examples] = {}
        self.after_ex: dict[int, Examples] = {}
        self.budgets = {m: Histogram(limits.examples) for m in BUDGET_METRICS}
        self.budget_applied = Counter[str]()
        # Arguments and branch fields: discovered in the warm-up, counted over every trajectory.
        self.warm: list[Trajectory] | None = []
        self.targets: dict[str, list[Target]] = {}
        self.memo = Memo()
        self.branches: list[Branch] = []
        self.branches_of: dict[str, list[Branch]] = {}

    # The pair key: tools are at most max_tools, so a * M + b is unique.
    @property
    def _m(self) -> int:
        return self.limits.max_tools

    def add(self, t: Trajectory) -> None:
        calls = self._calls(t)
        self._add_tools(t.trace_id, calls)
        self.n += 1
        self.early.add(t.trace_id)
        self._add_budgets(t)
        if self.warm is not None:
            self.warm.append(t)
            if len(self.warm) >= self.limits.warmup:
                self.end_warmup()
        else:
            self._add_arguments(t)
            self._add_branches(t, calls)

    def end_warmup(self) -> None:
        """Discover argument candidates and branch fields in the trajectories seen so far and
        count them."""
        if self.warm is None:
            return
        warm, self.warm = self.warm, None
        self._discover(warm)
        self._discover_branches(warm)
        for t in warm:
            self._add_arguments(t)
            if self.branches:
                self._add_branches(t, self._calls(t))

    # ---- tools and their order -----------------------------------------------------------

    def _tool(self, name: str) -> int | None:
        i = self.index.get(name)
        if i is not None:
            return i
        if len(self.tools) >= self.limits.max_tools:
            self.ignored_tools.add(name)
            return None
        i = self.index[name] = len(self.tools)
        k, m = self.limits.examples, self._m
        self.tools.append(name)
        self.present.append(0)
        self.first_with.append(Examples(k))
        # Every trajectory so far lacked the new tool: the first of them are its counter-examples.
        self.absent.append(Examples(k, list(self.early.ids)))
        self.counts.append(Histogram(k))
        for other in range(i):
            # precedes(new, other) failed wherever `other` was called; responds(other, new) too.
            self.precedes_ex[i * m + other] = Examples(k, list(self.first_with[other].ids))
            self.responds_ex[other * m + i] = Examples(k, list(self.first_with[other].ids))
        return i

    def _calls(self, t: Trajectory) -> Calls:
        """Per tool (index): the positions of its first and last successful call among the
        trajectory's successful calls of tools mined, and the number of its calls."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        count: dict[int, int] = {}
        position = 0
        for s in t.steps:
            if s.kind != "tool" or s.error is not None:
                continue
            i = self.index.get(s.name)
            if i is None:
                i = self._tool(s.name)
                if i is None:
                    continue
            if i not in first:
                first[i] = position
                count[i] = 1
            else:
                count[i] += 1
            last[i] = position
            position += 1
        items = sorted(first.items(), key=lambda kv: kv[1])
        missing = [x for x in range(len(self.tools)) if x not in first] if len(first) < len(self.tools) else []
        return Calls(items, last, count, missing, _pairs(items, last, self._m))

    def _add_tools(self, trace_id: str, calls: Calls) -> None:
        m, k = self._m, self.limits.examples
        for b, n in calls.count.items():
            self.present[b] += 1
            self.first_with[b].add(trace_id)
            self.counts[b].add(n, trace_id)
        for a in calls.missing:
            self.absent[a].add(trace_id)
        pairs = calls.pairs
        self.precedes.update(pairs.precedes)
        self.responds.update(pairs.responds)
        self.after.update(key for key, _ in pairs.after)
        for key, _ in pairs.precedes_failed:
            _example(self.precedes_ex, key, k, trace_id)
        for key in pairs.responds_failed:
            _example(self.responds_ex, key, k, trace_id)
        for key, _ in pairs.after:
            _example(self.after_ex, key, k, trace_id)
        # Failures where one side is missing: precedes(a, b) with no a, responds(a, b) with no b.
        for b, _ in calls.items:
            for a in calls.missing:
                _example(self.precedes_ex, a * m + b, k, trace_id)
                _example(self.responds_ex, b * m + a, k, trace_id)

    # ---- budgets ---------------------------------------------------------------------------

    def _add_budgets(self, t: Trajectory) -> None:
        steps = t.steps
        tool = llm = errors = 0
        tokens: int | None = None
        for s in steps:
            if s.kind == "tool":
                tool += 1
                if s.error is not None:
                    errors += 1
            elif s.kind == "llm":
                llm += 1
            if s.tokens is not None:
                tokens = s.tokens + (tokens or 0)
        values: dict[str, float | int] = {
            "max_steps": len(steps), "max_tool_calls": tool, "max_llm_calls": llm, "max_tool_errors": errors,
        }  # fmt: skip
        # No token counts on a trajectory with model calls: the check is indeterminate there.
        if tokens is not None or not llm:
            values["max_tokens"] = tokens or 0
        for metric, v in values.items():
            self.budget_applied[metric] += 1
            self.budgets[metric].add(bucket_up(v), t.trace_id)

    # ---- arguments ------------------------------------------------------------------------

    def _discover(self, warm: list[Trajectory]) -> None:
        """Argument paths with scalar values, and the sources each one equalled at least once
        (through an index from a value's canonical form to the fields that last held it)."""
        lim = self.limits
        kinds: dict[tuple[str, str], set[str]] = {}
        calls: Counter[tuple[str, str]] = Counter()
        matches: dict[tuple[str, str], Counter[Source]] = {}
        for t in warm:
            holding: dict[Hashable, set[Source]] = {}
            held_by: dict[str, list[tuple[Hashable, Source]]] = {}
            for s in t.steps:
                if s.kind != "tool" or s.error is not None or s.name not in self.index:
                    continue
                if s.args_status == "captured":
                    for path, v in leaves(s.args, lim):
                        key = (s.name, path)
                        kinds.setdefault(key, set()).add("text" if isinstance(v, str) else "number")
                        calls[key] += 1
                        for src in holding.get(self.memo.key(v), ()):
                            matches.setdefault(key, Counter())[src] += 1
                for old, src in held_by.pop(s.name, ()):
                    holding[old].discard(src)
                fields: list[tuple[Hashable, Source]] = []
                for field, value, status in (("arg", s.args, s.args_status), ("result", s.result, s.result_status)):
                    if status == "captured":
                        for path, v in leaves(value, lim):
                            c = self.memo.key(v)
                            src = Source(s.name, field, path)
                            holding.setdefault(c, set()).add(src)
                            fields.append((c, src))
                held_by[s.name] = fields
        for (tool, path), seen in kinds.items():
            target = Target(tool, path, seen == {"text"}, seen == {"number"}, lim)
            found = matches.get((tool, path), Counter())
            ranked = sorted(found, key=lambda src: (-found[src], _order(src)))
            for src in ranked[: lim.max_sources]:
                if found[src] >= MIN_SOURCE_SHARE * calls[(tool, path)]:
                    target.flows.append(Flow(src, lim.examples))
            self.targets.setdefault(tool, []).append(target)

    def _add_arguments(self, t: Trajectory) -> None:
        if not self.targets:
            return
        lim, key, memo = self.limits, self.memo.key, self.memo
        latest: dict[str, Step] = {}
        flow_state: dict[Flow, int] = {}
        # Per target in this trajectory: [its shapes, undecided], [smallest, largest, undecided].
        text_state: dict[Target, list[Any]] = {}
        number_state: dict[Target, list[Any]] = {}
        for s in t.steps:
            if s.kind != "tool" or s.error is not None:
                continue
            targets = self.targets.get(s.name)
            if targets:
                captured = s.args_status == "captured"
                for target in targets:
                    v = lookup(s.args, target.parsed) if captured else MISSING
                    vkey = key(v) if target.flows and v is not MISSING else None
                    for flow in target.flows:
                        outcome = (
                            _flow_outcome(flow, vkey, latest.get(flow.source.tool), key) if captured else INDETERMINATE
                        )
                        if outcome > flow_state.get(flow, -1):
                            flow_state[flow] = outcome
                    if target.format_keys is not None:
                        text = text_state.get(target)
                        if text is None:
                            text = text_state[target] = [set(), False]
                        if captured:
                            text[0].add(_shape(target, v, lim, memo))
                        else:
                            text[1] = True  # undecided: arguments not captured
                    if target.numeric:
                        extremes = number_state.get(target)
                        if extremes is None:
                            extremes = number_state[target] = [None, None, False]
                        if captured and is_number(v):
                            if extremes[0] is None or v < extremes[0]:
                                extremes[0] = v
                            if extremes[1] is None or v > extremes[1]:
                                extremes[1] = v
                            if not isinstance(v, int):
                                target.all_int = False
                        else:
                            extremes[2] = True  # the CEL comparison errs on this call
            latest[s.name] = s
        trace_id = t.trace_id
        for flow, outcome in flow_state.items():
            if outcome == PASS:
                flow.applied += 1
                flow.held += 1
            elif outcome == FAIL:
                flow.applied += 1
                flow.examples.add(trace_id)
        for target, (found, undecided) in text_state.items():
            assert target.format_keys is not None
            shape_set = frozenset(found)
            keys = target.format_partial if undecided else target.format_keys
            if shape_set not in keys.counts and len(keys.counts) >= lim.max_shapes:
                shape_set = OVERFLOW
            if not undecided:
                target.format_applied += 1
            keys.add(shape_set, trace_id)
        for target, (lo, hi, undecided) in number_state.items():
            if lo is None:
                continue
            if undecided:
                target.low_partial.add(bucket_down(lo), trace_id)
                target.high_partial.add(bucket_up(hi), trace_id)
            else:
                target.number_applied += 1
                target.low.add(bucket_down(lo), trace_id)
                target.high.add(bucket_up(hi), trace_id)

    # ---- branches ---------------------------------------------------------------------------

    def _discover_branches(self, warm: list[Trajectory]) -> None:
        """Result fields that may decide a branch (see the package docstring): in the warm-up,
        two to ``branch_values`` values of one type, one per trajectory, and at least twice as
        many tasks as values."""
        lim = self.limits
        seen: dict[tuple[str, tuple[str, ...]], FieldSeen] = {}
        for t in warm:
            task = self._task(t)
            values: dict[tuple[str, tuple[str, ...]], Any] = {}
            mixed: set[tuple[str, tuple[str, ...]]] = set()
            for s in t.steps:
                if s.kind != "tool" or s.error is not None or s.name not in self.index:
                    continue
                if s.result_status != "captured":
                    continue
                for keys, v in result_fields(s.result, lim):
                    f = (s.name, keys)
                    old = values.setdefault(f, v)
                    if old != v or type(old) is not type(v):
                        mixed.add(f)
            for f, v in values.items():
                stats = seen.get(f)
                if stats is None:
                    stats = seen[f] = FieldSeen(type(v))
                stats.add(v, task, f in mixed, lim)
        fields = [(f, x) for f, x in seen.items() if x.qualifies()]
        fields.sort(key=lambda fx: (len(fx[1].values), -fx[1].trajectories, self.index[fx[0][0]], fx[0][1]))
        for (tool, keys), stats in fields[: lim.branch_fields]:
            branch = Branch(tool, keys, stats.kind)
            self.branches.append(branch)
            self.branches_of.setdefault(tool, []).append(branch)

    def _task(self, t: Trajectory) -> Hashable | None:
        """The task a trajectory did: its case id, else the arguments of its first successful
        tool call (the input it started from); None when neither is known."""
        if t.case_id is not None:
            return ("case", t.case_id)
        for s in t.steps:
            if s.kind == "tool" and s.error is None:
                return ("args", self.memo.key(s.args)) if s.args_status == "captured" else None
        return None

    def _add_branches(self, t: Trajectory, calls: Calls) -> None:
        if not self.branches:
            return
        found: dict[Branch, tuple[Any, int]] = {}
        dropped: set[Branch] = set()
        position = 0
        for s in t.steps:
            if s.kind != "tool" or s.error is not None or s.name not in self.index:
                continue
            branches = self.branches_of.get(s.name)
            if branches and s.result_status == "captured":
                for branch in branches:
                    v = branch.value(s.result)
                    if v is MISSING:
                        continue
                    got = found.setdefault(branch, (v, position))
                    if got[0] != v or type(got[0]) is not type(v):
                        dropped.add(branch)
            position += 1
        m, limit = self._m, self.limits.branch_values
        task = functools.cache(lambda: self._task(t))
        for branch, (v, p) in found.items():
            if branch in dropped:
                continue
            table = branch.tables.get(v)
            if table is None:
                if type(v) is not branch.kind or len(branch.tables) >= limit:
                    dropped.add(branch)
                    continue
                table = branch.tables[v] = ValueCounts()
            table.add(calls, p, m, task)
        for branch in dropped:
            # Not a branch after all: it costs nothing from here on.
            branch.tables.clear()
            self.branches.remove(branch)
            self.branches_of[branch.tool].remove(branch)


class Memo:
    """Canonical forms (``check.values.canonical``) and shapes of recent values: a value is
    often passed from call to call within a trajectory. Cleared when it grows past ``size``."""

    __slots__ = ("keys", "shapes", "size")

    def __init__(self, size: int = 50_000) -> None:
        self.keys: dict[tuple[type, Any], Hashable] = {}
        self.shapes: dict[str, tuple[Shape, list[str] | None]] = {}
        self.size = size

    def key(self, value: Any) -> Hashable:
        if not isinstance(value, (str, int, float)):
            return canonical(value, "normalised")
        # The type is part of the key: 1, 1.0 and True are equal dict keys.
        k = (value.__class__, value)
        c = self.keys.get(k)
        if c is None:
            if len(self.keys) >= self.size:
                self.keys.clear()
            c = self.keys[k] = canonical(value, "normalised")
        return c

    def shape(self, text: str) -> tuple[Shape, list[str] | None]:
        found = self.shapes.get(text)
        if found is None:
            if len(self.shapes) >= self.size:
                self.shapes.clear()
            found = self.shapes[text] = shape_of(text)
        return found


def _order(src: Source) -> tuple[str, str, str]:
    return (src.tool, src.field, src.path)


def _example(table: dict[int, Examples], key: int, limit: int, trace_id: str) -> None:
    ex = table.get(key)
    if ex is None:
        table[key] = Examples(limit, [trace_id])
    else:
        ex.add(trace_id)


def _flow_outcome(flow: Flow, vkey: Hashable | None, src: Step | None, key: Callable[[Any], Hashable]) -> int:
    """The check's verdict on one call (``check.policy._expected_source`` and ``ArgEquals``),
    comparing canonical forms: equal under typed comparison exactly when their forms are equal."""
    if src is None:
        return INDETERMINATE
    field = flow.source.field
    if (src.result_status if field == "result" else src.args_status) != "captured":
        return INDETERMINATE
    expected = lookup(src.result if field == "result" else src.args, flow.parsed)
    if expected is MISSING:
        return INDETERMINATE
    if vkey is None or vkey != key(expected):
        return FAIL
    if not flow.varied:
        if flow.first is MISSING:
            flow.first = vkey
        elif vkey != flow.first:
            flow.varied = True
    return PASS


def _shape(target: Target, value: Any, lim: Limits, memo: Memo) -> Shape:
    """The shape of one value, recorded with the target's shapes (``ArgMatches`` reads numbers
    as their text and fails on anything else)."""
    if isinstance(value, str):
        text = value
    elif is_number(value):
        text = str(value)
    else:
        return NOT_TEXT
    shape, parts = memo.shape(text)
    if parts is not None:
        stats = target.shapes.get(shape)
        if stats is None:
            if len(target.shapes) >= lim.max_shapes:
                return ("<overflow>",)
            target.shapes[shape] = ShapeStats(parts)
        else:
            stats.add(parts)
        if len(target.distinct) < lim.distinct_values:
            target.distinct.add(text)
    return shape
