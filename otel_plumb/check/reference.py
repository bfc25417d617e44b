"""``matches_reference``: the trajectory's tool calls against a reference trajectory, with the
modes of LangChain's agentevals (``strict``, ``unordered``, ``subset``, ``superset``; argument
modes ``exact``, ``ignore``, ``subset``, ``superset``, per tool) and the typed comparison of
``arg_equals``. A mismatch is localised to the first divergent step by Needleman-Wunsch
alignment (``check.align``), as campaigns localise divergences.

The calls compared are the successful tool calls (a failed call did not happen). When the
trajectory is incomplete, or arguments the mode compares were not captured, the verdict is
indeterminate. Cost: O(calls + reference) for the unordered modes, O(calls x reference) for
the alignment of ``strict`` (references are short).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from otel_plumb.check.align import align
from otel_plumb.check.checks import PASS, Check, Outcome, Run
from otel_plumb.check.schema import ArgsMode, ReferenceMode
from otel_plumb.check.values import MISSING, equal, plain
from otel_plumb.model import Step


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


def args_match(mode: ArgsMode, got: Any, expected: Mapping[str, Any] | None) -> bool:
    """agentevals' argument modes: ``exact`` the same keys and values; ``subset`` every key of
    the call is in the reference with an equal value; ``superset`` every key of the reference is
    in the call with an equal value; ``ignore`` names only. A reference without args matches any."""
    if mode == "ignore" or expected is None:
        return True
    if not isinstance(got, Mapping):
        return False
    def same(k: str) -> bool:
        return k in got and k in expected and equal(got[k], expected[k])

    if mode == "exact":
        return set(got) == set(expected) and all(same(k) for k in got)
    if mode == "subset":
        return all(same(k) for k in got)
    return all(same(k) for k in expected)


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
        calls = [s for s in steps if s.kind == "tool" and s.error is None]
        for s in calls:
            if self._args_mode(s.name) != "ignore" and s.args_status != "captured":
                return Outcome("indeterminate", s, f"arguments of {run.where(s)} ({s.name}) are {s.args_status}, "
                               "so they cannot be compared with the reference")  # fmt: skip
        expected = [repr(r) for r in reference]
        got = [s.name for s in calls]

        def same(r: ReferenceCall, s: Step) -> bool:
            return r.name == s.name and args_match(self._args_mode(s.name), s.args, r.args)

        if self.mode == "strict":
            columns = align(range(len(reference)), range(len(calls)), same=lambda i, j: same(reference[i], calls[j]))
            for column in columns:
                if column.kind == "match":
                    continue
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
            return PASS
        # The unordered modes: match each call to an unused reference call (first fit, in order).
        unused = list(range(len(reference)))
        extra: Step | None = None
        for s in calls:
            hit = next((i for i in unused if same(reference[i], s)), None)
            if hit is None:
                extra = extra or s
                continue
            unused.remove(hit)
        if self.mode in ("unordered", "subset") and extra is not None:
            return Outcome("fail", extra, f"{extra.name} at {run.where(extra)} matches no call of the reference",
                           expected, got)  # fmt: skip
        if self.mode in ("unordered", "superset") and unused:
            missing = [repr(reference[i]) for i in unused]
            return Outcome("fail", None, f"the reference calls {', '.join(missing)}; the trajectory does not",
                           expected, got)  # fmt: skip
        return PASS


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
