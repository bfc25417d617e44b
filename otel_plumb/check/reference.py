"""``matches_reference``: the trajectory's tool calls against a reference trajectory, with the
modes of LangChain's agentevals (``strict``, ``unordered``, ``subset``, ``superset``; argument
modes ``exact``, ``ignore``, ``subset``, ``superset``, per tool) and the typed comparison of
``arg_equals``. A mismatch is localised to the first divergent step by Needleman-Wunsch
alignment (``check.align``), as campaigns localise divergences.

The calls compared are the successful tool calls (a failed call did not happen). When the
trajectory is incomplete, or arguments the mode compares were not captured, are redaction
stand-ins or JSON text that does not decode, the verdict is indeterminate: the verdict is
worked out with the comparisons that are certain (pass if they suffice), then counting the
undecidable ones as matches (indeterminate if that suffices, else fail).

The unordered modes pair calls with reference calls one to one by a maximum bipartite matching
(first fit can miss a pairing that exists and report a false fail). Cost: calls x reference
comparisons, each made once, for every mode; then O(reference x edges) for the matching (edges:
the pairs that compare equal, at most calls x reference), or O(calls x reference) for the
alignment of ``strict`` (references are short).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from otel_plumb.check.align import AlignedPair, align
from otel_plumb.check.checks import PASS, Check, Outcome, Run, over_unsure_calls
from otel_plumb.check.schema import ArgsMode, ReferenceMode
from otel_plumb.check.values import MISSING, Unreadable, equal, plain, stand_in_within
from otel_plumb.model import Step
from otel_plumb.model.placeholders import stand_in
from otel_plumb.model.text import parse_json


class ReferenceCall:
    """One expected call: a tool name and, unless only the name is given, its arguments."""

    __slots__ = ("args", "name")

    def __init__(self, name: str, args: Mapping[str, Any] | None) -> None:
        self.name = name
        self.args = args

    def __repr__(self) -> str:
        return self.name if self.args is None else f"{self.name}({plain(dict(self.args))})"


def reference_calls(value: Any) -> list[ReferenceCall]:
    """A reference as written in context or a file: a list of tool names or of
    ``{name|tool, args}``. Raises ``ValueError`` naming what is wrong."""
    if not isinstance(value, list):
        raise ValueError("a reference trajectory is a list of tool calls")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(ReferenceCall(item, None))
            continue
        if not isinstance(item, Mapping):
            raise ValueError(f"reference call {i} is neither a tool name nor a mapping")
        name = item.get("name", item.get("tool"))
        if not isinstance(name, str):
            raise ValueError(f"reference call {i} has no name")
        args = item.get("args", item.get("arguments"))
        if args is not None and not isinstance(args, Mapping):
            raise ValueError(f"reference call {i}: args must be a mapping")
        out.append(ReferenceCall(name, args))
    return out


def args_match(mode: ArgsMode, got: Any, expected: Mapping[str, Any] | None) -> bool | Unreadable:
    """agentevals' argument modes: ``exact`` the same keys and values; ``subset`` every key of
    the call is in the reference with an equal value; ``superset`` every key of the reference is
    in the call with an equal value; ``ignore`` names only. A reference without args matches any.

    ``Unreadable`` when the data cannot say: a value the mode compares is or holds a stand-in
    (``model.placeholders``), or the arguments are not readable as named arguments (a stand-in,
    JSON text that does not decode, text). A certain mismatch elsewhere still decides (False)."""
    if mode == "ignore" or expected is None:
        return True
    named = _named_args(got)
    if isinstance(named, Unreadable):
        return named
    if mode == "exact" and set(named) != set(expected):
        return False  # the keys are there to see, whatever their values
    unknown: Unreadable | None = None
    for k in expected if mode == "superset" else named:
        if k not in named or k not in expected:
            return False
        found = stand_in_within(named[k])
        if found is not None:
            unknown = unknown or Unreadable(f"{k}{found[0]} is {found[1]}")
        elif not equal(named[k], expected[k]):
            return False
    return unknown or True


def _named_args(got: Any) -> Mapping[str, Any] | Unreadable:
    """The call's arguments as a mapping (JSON text decoded, twice-encoded too), or why they
    cannot be read as one: a stand-in, JSON text that does not decode (cut off), or no named
    arguments at all (text, a list: what names they went by is unknown), as ``read_argument``
    reads them."""
    while isinstance(got, str):
        try:
            got = parse_json(got)
        except (ValueError, RecursionError):
            why = stand_in(got)
            if why is not None:
                return Unreadable(f"the arguments are {why}")
            if got.lstrip()[:1] in ("{", "[", '"'):
                return Unreadable(f"the arguments are JSON text that does not decode, cut off perhaps ({got[:40]!r})")
            return Unreadable(f"the arguments are text, not named arguments ({got[:40]!r})")
    if isinstance(got, Mapping):
        return got
    return Unreadable(f"the arguments are not named arguments: {repr(got)[:40]}")


def _max_matching(edges: Sequence[Sequence[int]], calls: int) -> list[int | None]:
    """A maximum matching of reference calls (``edges[i]``: the calls reference call ``i`` may
    pair with) to ``calls`` calls: the reference call paired with each call, or None. Kuhn's
    augmenting paths from each reference call, O(len(edges) x edges); depth-first with an
    explicit stack, so a long reference cannot exhaust Python's recursion."""
    owner: list[int | None] = [None] * calls
    # The reference calls with the fewest choices first: a paired one stays paired, so one left
    # over (and reported missing) is one that had more, a name-only call rather than a(x=1).
    for root in sorted(range(len(edges)), key=lambda i: len(edges[i])):
        seen: set[int] = set()
        path: list[tuple[int, Iterator[int]]] = [(root, iter(edges[root]))]  # reference calls
        through: list[int] = []  # the call by which each reference call after the root was reached
        while path:
            j = next((j for j in path[-1][1] if j not in seen), None)
            if j is None:  # a dead end: back up
                path.pop()
                if through:
                    through.pop()
                continue
            seen.add(j)
            holder = owner[j]
            if holder is None:  # a free call: shift every pairing along the path by one
                for (i, _), c in zip(path, [*through, j], strict=True):
                    owner[c] = i
                break
            through.append(j)
            path.append((holder, iter(edges[holder])))
    return owner


class MatchesReference(Check):
    # A trajectory cut short may still make the calls that are missing: its fail is not final.
    final_fail = False
    fail_survives_lost_data = False

    def __init__(self, reference: Callable[[Run], tuple[list[ReferenceCall] | None, str | None]], mode: ReferenceMode,
                 args: ArgsMode, per_tool: Mapping[str, ArgsMode]) -> None:  # fmt: skip
        self.reference = reference
        self.mode = mode
        self.args = args
        self.per_tool = dict(per_tool)

    def _args_mode(self, tool: str) -> ArgsMode:
        return self.per_tool.get(tool, self.args)

    def run(self, run: Run, steps: Sequence[Step]) -> Outcome:
        reference, unknown = self.reference(run)
        if reference is None:
            return Outcome("indeterminate", None, f"no reference trajectory: {unknown}")
        return over_unsure_calls(run, steps, None, lambda run, steps: self.compare(run, steps, reference))

    def compare(self, run: Run, steps: Sequence[Step], reference: list[ReferenceCall]) -> Outcome:
        calls = [s for s in steps if s.kind == "tool" and s.error is None]
        for s in calls:
            if self._args_mode(s.name) != "ignore" and s.args_status != "captured":
                return Outcome("indeterminate", s, f"arguments of {run.where(s)} ({s.name}) are {s.args_status}, "
                               "so they cannot be compared with the reference")  # fmt: skip
        expected = [repr(r) for r in reference]
        got = [s.name for s in calls]
        # Every comparison once: True, False, or Unreadable (cannot say).
        fit = [[r.name == s.name and args_match(self._args_mode(s.name), s.args, r.args) for s in calls]
               for r in reference]  # fmt: skip

        def edge(i: int, j: int, certain: bool) -> bool:
            """Whether reference call i and call j pair: surely, or unless the data cannot say."""
            return fit[i][j] is True if certain else fit[i][j] is not False

        def unsure(i: int, j: int) -> Outcome:
            why = fit[i][j]
            assert isinstance(why, Unreadable)
            s = calls[j]
            return Outcome("indeterminate", s, f"arguments of {run.where(s)} ({s.name}) cannot be compared with "
                           f"the reference: {why.reason}", expected, got)  # fmt: skip

        # Each mode is tried with the certain comparisons (pass if they do), then counting every
        # undecidable one as a match (indeterminate if that does, else a fail that stands
        # whatever the unseen values were, localised from that optimistic try).
        if self.mode == "strict":

            def columns(certain: bool) -> list[AlignedPair]:
                return align(range(len(reference)), range(len(calls)), same=lambda i, j: edge(i, j, certain))

            if all(c.kind == "match" for c in columns(True)):
                return PASS
            optimistic = columns(False)
            if all(c.kind == "match" for c in optimistic):  # call j stands for reference call j
                return next(unsure(j, j) for j in range(len(calls)) if fit[j][j] is not True)
            column = next(c for c in optimistic if c.kind != "match")
            if column.got is None:  # skipped
                assert column.expected is not None
                message = f"the reference calls {reference[column.expected]!r} here; the trajectory does not"
                return Outcome("fail", None, message, expected, got)
            step = calls[column.got]
            if column.expected is None:
                message = f"{step.name} at {run.where(step)} is not in the reference"
            else:
                wanted = reference[column.expected]
                message = f"{step.name} at {run.where(step)} where the reference calls {wanted!r}"
            return Outcome("fail", step, message, expected, got)

        # The unordered modes: pair calls with reference calls one to one, as many as can be. A
        # maximum matching leaves the fewest calls and the fewest reference calls unpaired.
        def pairing(certain: bool) -> tuple[list[int | None], list[int], list[int]]:
            """The reference call paired with each call, the unpaired calls, the unpaired reference calls."""
            edges = [[j for j in range(len(calls)) if edge(i, j, certain)] for i in range(len(reference))]
            owner = _max_matching(edges, len(calls))
            extra = [j for j, i in enumerate(owner) if i is None]
            paired = set(owner)
            return owner, extra, [i for i in range(len(reference)) if i not in paired]

        def enough(extra: list[int], missing: list[int]) -> bool:
            return (self.mode == "superset" or not extra) and (self.mode == "subset" or not missing)

        if enough(*pairing(True)[1:]):
            return PASS
        owner, extra, missing = pairing(False)
        if enough(extra, missing):
            return next(unsure(i, j) for j, i in enumerate(owner) if i is not None and fit[i][j] is not True)
        if self.mode != "superset" and extra:
            s = calls[extra[0]]
            return Outcome("fail", s, f"{s.name} at {run.where(s)} matches no call of the reference", expected, got)
        names = ", ".join(repr(reference[i]) for i in missing)
        return Outcome("fail", None, f"the reference calls {names}; the trajectory does not", expected, got)


def context_reference(key: str) -> Callable[[Run], tuple[list[ReferenceCall] | None, str | None]]:
    def from_context(run: Run) -> tuple[list[ReferenceCall] | None, str | None]:
        value = run.ctx.get(key, MISSING)
        if value is MISSING:
            return None, f"no {key!r} in the context"
        try:
            return reference_calls(value), None
        except ValueError as exc:
            return None, f"context {key!r}: {exc}"

    return from_context


def file_reference(
    references: Mapping[str, list[ReferenceCall]], attribute: str
) -> Callable[[Run], tuple[list[ReferenceCall] | None, str | None]]:
    def from_file(run: Run) -> tuple[list[ReferenceCall] | None, str | None]:
        task = run.trajectory.attributes.get(attribute)
        if task is None:
            return None, f"the trajectory has no {attribute!r} attribute to pick its reference by"
        found = references.get(str(task))
        return (None, f"the reference file has no entry {task!r}") if found is None else (found, None)

    return from_file
