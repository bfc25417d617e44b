"""Mining candidate invariants from trajectories (``otel-plumb suggest``). Pure: no I/O.

The trajectories are assumed mostly good. Every candidate is an invariant in the policy
language with its **support**: ``held`` of the ``applied`` trajectories (where the check would
not have been ``not_applicable`` or ``indeterminate``), the first counter-examples (trace ids),
and the Wilson 95% lower bound of the rate. A candidate is proposed when its support *rate* is at
least ``min_support`` over at least ``min_applied`` trajectories: the rate is a statement about
the data ("held in 95% of runs") that does not move with the sample size, and the Wilson bound
beside it says how far to trust it (``min_bound`` filters on it too).

Algorithm: one pass, streaming, per task group (all trajectories, or one group per agent or per
value of a task attribute). Complete trajectories only: an incomplete one cannot say that
something held; and agents' runs only: a trace with no agent span is left out, as the checker
leaves it unchecked. Per trajectory of L steps and k distinct successful tools, in a group that has
seen G distinct tools (G <= ``max_tools``):

- per tool: trajectories with a successful call, a histogram of successful-call counts
  (``must_call``, ``call_count``);
- per ordered pair (a, b) of tools both called: first(a) < first(b) (``precedes a -> b``),
  last(b) > last(a) (``responds a -> b``), last(b) > first(a) (``never_call b`` after ``a`` broken):
  O(k^2); a pair with one side missing is a counter-example of precedes/responds, O(k * G);
- budgets: steps, tool calls, model calls, tool errors and tokens, each in a histogram of
  two-significant-digit buckets, so the bound chosen is a bucket edge and its support is exact
  (durations are not mined: they measure the machine more than the agent);
- arguments: discovered in the first ``warmup`` trajectories (buffered: bounded): scalar
  fields of captured arguments (``max_leaves`` per call); for each, the dataflow sources it
  equalled at least once (an index from a value's canonical form, ``check.values.canonical``, to
  the argument and result fields of the latest call of each tool holding it; ``max_sources``
  kept). Then every trajectory is counted: each dataflow source with the check's own typed
  comparison (``check.values.equal``) against the latest earlier successful call; the shape of
  each text value (``formats``: at most ``max_shapes`` shapes kept); per trajectory the smallest
  and largest numeric value (bucketed). O(L * arguments * sources).

A count bound is the tightest one that held in ``min_support`` of the trajectories. A measured
quantity (a numeric argument, tokens) is widened: the tightest bound would flag the largest
``1 - min_support`` of good runs by construction, so the bound is the largest value seen within
ten times it, and a lower bound is 0 when no value was negative; what it flags is then a slip
(a missing decimal point, a runaway loop), not the upper end of normal.

- branches: discovered in the warm-up, the result fields that may decide what the agent does
  next (below); then per trajectory, for each such field it returned, the tool counts above
  (without counter-examples) in the table of the field's value, and the failures that happened
  before the field was returned. O(L + B * (k^2 + k * G)) for B branch fields returned.

Time O(N * (L + k^2 + k * G + L * A + B * (k^2 + k * G))) for N trajectories (A: argument
candidates per call), memory O(G^2 * (1 + branch_fields * branch_values) + budget buckets +
argument candidates * shapes + warmup * L), independent of N (counter-examples are capped at
``examples`` per candidate). A relation that first shows after the warm-up, or a tool past
``max_tools``, is not proposed.

**Branches.** A run that takes the other side of a data-decided branch (the vendor check says
sanctioned, so the agent flags and does not pay) breaks the paying path's habits without being
a fault. A *branch field* is a scalar field at a path of map keys in the captured results of
one tool: text (up to 64 characters), an integer or a boolean, the answers that steer an agent
(not a measurement). In the warm-up it must have two to ``branch_values`` values, all of one
type, one per trajectory (calls that disagree disqualify it), and at least twice as many
distinct *tasks* as values among the trajectories that returned it: on average every value is
shared by two tasks, which an identifier of the task (an invoice id, the vendor of one invoice:
one value per task) or anything derived from it is not, so a deterministic fault of one task
cannot be explained by it. A trajectory's task is its ``plumb.case.id``, else the arguments of
its first successful tool call (the input it started from); a trajectory with neither counts no
task. Up to ``branch_fields`` fields are kept (fewest values first); one that shows more values
later, or two values in one trajectory, is dropped (its tables freed).

A ``must_call``, ``precedes``, ``responds``, ``never_call`` after or ``call_count`` candidate
(at any support) is *separated* by a branch field when its failures are exactly the
trajectories whose field had one of a set of values S: it failed in every trajectory with a
value in S, held in every other (the field missing included), at least ``min_applied``
trajectories had a value in S and some other value was seen where it applied; every value seen
where it applied is representative: it applied in all the value's trajectories, or in those of
two tasks at least (else what the value "decides" is one task's runs, the rest of the value's
trajectories out of its reach: a fault of that task, on either side); and no failure in S
happened before the field was returned (a ``precedes`` at its first unpreceded call, a
``never_call`` after at its last call, a ``call_count`` at the tool's last call): the agent
reacted to the answer, rather than the answer reporting the fault (a payment check that says
"duplicate" after a double payment). The first field in that order that separates it decides.
The candidate is then proposed as ``when: !steps.exists(<a successful call of the tool returned
a value in S>)`` (held in all of them), and a ``must_call T`` also as ``never_call T`` when the
tool did return one (T was called in none of them); the unguarded candidate is not proposed.
Two guarded candidates may say the same for the values seen (``never_call T`` after the first
call unless the usual answer, ``never_call T`` if the unusual one); they differ where the field
is missing or has a value not seen, so neither is dropped. A
candidate broken both by a branch and elsewhere is left as it is: its counter-examples cannot be
told apart. A fault present in every run of a value no other task shares (the one vendor in a
country) is indistinguishable from a branch in the data; the review step is where it is told.

Candidates implied by others are dropped (``candidates.prune``), testing the weakest first and
only against kept candidates whose support rate is at least its own, so that deleting a less
supported rule in review never loses a better supported one it stood for. A guarded candidate
is implied only by unguarded ones and ones of the same guard (all of them hold where the guard
is true). The rules (each a logical implication under the check's semantics):

- ``precedes a -> c`` by a path of kept ``precedes`` a -> b -> ... -> c (transitive);
- ``responds a -> c`` by a path of kept ``responds``; or by ``precedes a -> b`` (a path),
  ``call_count a`` at most 1 and ``must_call b``; or by ``must_call b`` and ``never_call a``
  after ``b``;
- ``never_call b`` after ``a`` by ``call_count b`` at most 1 and ``precedes b -> a``; or by
  ``never_call b`` after ``c`` and ``precedes c -> a``;
- ``call_count t`` (max only) by a ``budget max_tool_calls`` no larger; a budget limit by a no
  larger limit on a count that includes it (tool calls and model calls are steps, tool errors
  tool calls);
- dataflow ``T.arg = X.field`` by ``T.arg = Y.f`` with ``X.field = Y.f`` and ``Y`` called at
  most once (typed equality is transitive); one ``call_count`` per tool by construction (the
  smallest max from 1, the largest min from 2: min 1 is ``must_call``).

``must_call``, ``never_call``, formats and numeric ranges are never dropped: ``precedes a -> b`` with
``must_call b`` implies ``must_call a``, but a reviewer who deletes an order rule should not
lose the call it implied. ``never_call b`` with scope ``before: a`` is ``precedes a -> b``, so it
is not proposed separately. A dataflow whose value never varied is not proposed (two constants
cannot be told from a flow).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from otel_plumb.model import Trajectory
from otel_plumb.suggest.candidates import Candidate, build, prune, slug
from otel_plumb.suggest.mine import GroupCounts, Limits

GroupBy = Literal["none", "agent", "attribute"]

__all__ = ["Candidate", "Group", "GroupBy", "Limits", "Miner", "Options", "Suggestion", "mine"]


@dataclass(frozen=True, slots=True)
class Options:
    min_support: float = 0.95
    min_applied: int = 5
    # Candidates whose Wilson lower bound is below this are left out too.
    min_bound: float = 0.0
    group_by: GroupBy = "none"
    attribute: str | None = None
    # Groups beyond this many are not mined (their trajectories are counted as ungrouped).
    max_groups: int = 32


@dataclass(slots=True)
class Group:
    """The candidates of one task group. ``value`` is the agent or attribute value (None: all)."""

    value: Any
    guard: str | None
    trajectories: int
    kept: list[Candidate]
    implied: list[Candidate]
    ignored_tools: list[str]

    @property
    def label(self) -> str:
        return "all" if self.value is None else str(self.value)


@dataclass(slots=True)
class Suggestion:
    options: Options
    groups: list[Group]
    trajectories: int = 0
    incomplete: int = 0
    ungrouped: int = 0
    # Traces with no agent span (HTTP, database, application spans only): no policy applies to
    # them (check.decide), so they are no evidence either way.
    not_agent: int = 0
    skipped: dict[str, int] = field(default_factory=dict)


class Miner:
    """Feed trajectories with ``add`` (streaming), then ``finish``."""

    def __init__(self, options: Options | None = None, limits: Limits | None = None) -> None:
        options = options or Options()
        if options.group_by == "attribute" and not options.attribute:
            raise ValueError("grouping by a task attribute needs the attribute's name")
        self.options, self.limits = options, limits or Limits()
        self.groups: dict[Any, GroupCounts] = {}
        self.seen = self.incomplete = self.ungrouped = self.not_agent = 0

    def _group(self, t: Trajectory) -> Any:
        o = self.options
        if o.group_by == "agent":
            return t.agent
        if o.group_by == "attribute":
            assert o.attribute is not None
            value = t.attributes.get(o.attribute)
            return value if isinstance(value, (str, int, float, bool)) else None
        return ""

    def add(self, t: Trajectory) -> None:
        self.seen += 1
        if not t.complete:
            self.incomplete += 1
            return
        if not t.has_agent_spans:
            self.not_agent += 1
            return
        value = self._group(t)
        if value is None:
            self.ungrouped += 1
            return
        counts = self.groups.get(value)
        if counts is None:
            if len(self.groups) >= self.options.max_groups:
                self.ungrouped += 1
                return
            counts = self.groups[value] = GroupCounts(self.limits)
        counts.add(t)

    def finish(self) -> Suggestion:
        o = self.options
        groups = []
        prefixes: set[str] = set()
        for value, counts in self.groups.items():
            counts.end_warmup()
            found = [c for c in build(counts, o.min_support, o.min_applied) if c.lower_bound >= o.min_bound]
            kept, implied = prune(found)
            guarded = o.group_by != "none"
            if guarded:
                prefix = slug(str(value), prefixes)
                for c in found:
                    c.id = f"{prefix}.{c.id}"
                for c in implied:
                    c.implied_by = [f"{prefix}.{x}" for x in c.implied_by]
            guard = _guard(o, value) if guarded else None
            groups.append(Group(None if not guarded else value, guard, counts.n, kept, implied,
                                sorted(counts.ignored_tools)))  # fmt: skip
        return Suggestion(o, groups, self.seen, self.incomplete, self.ungrouped, self.not_agent)


def _guard(o: Options, value: Any) -> str:
    """A CEL ``when`` guard selecting the group's trajectories."""
    literal = json.dumps(value, ensure_ascii=False)
    if o.group_by == "agent":
        return f"trajectory.agent == {literal}"
    name = json.dumps(o.attribute, ensure_ascii=False)
    return f"{name} in trajectory.attributes && trajectory.attributes[{name}] == {literal}"


def mine(
    trajectories: Iterable[Trajectory], options: Options | None = None, limits: Limits | None = None
) -> Suggestion:
    """Mine an iterable of trajectories."""
    miner = Miner(options, limits)
    for t in trajectories:
        miner.add(t)
    return miner.finish()
