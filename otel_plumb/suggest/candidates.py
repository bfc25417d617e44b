"""Candidates from a group's counts, and the implication rules that drop the redundant ones."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_plumb.stats import wilson_interval
from otel_plumb.suggest import formats
from otel_plumb.suggest.mine import OVERFLOW, Branch, GroupCounts, Histogram, Source, Target, ValueCounts


@dataclass(slots=True)
class Candidate:
    """One proposed invariant. ``check`` is its check (and scope) in the policy language,
    ``when`` its guard (a branch's, see ``_Builder.add``); ``key`` is what the implication rules
    read. Support: ``held`` of ``applied`` trajectories (where the guard, if any, was true)."""

    id: str
    key: tuple[Any, ...]
    check: dict[str, Any]
    applied: int
    held: int
    examples: list[str]
    text: str
    when: str | None = None
    implied_by: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return str(self.key[0])

    @property
    def rate(self) -> float:
        return self.held / self.applied if self.applied else 0.0

    @property
    def lower_bound(self) -> float:
        return wilson_interval(self.held, self.applied)[0]

    @property
    def failed(self) -> int:
        return self.applied - self.held


_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


def slug(text: str, taken: set[str]) -> str:
    """``text`` as an id (other characters as ``-``), made unique among ``taken`` by a numeric
    suffix, and added to it."""
    base = _SLUG.sub("-", text).strip("-") or "x"
    out, n = base, 2
    while out in taken:
        out, n = f"{base}-{n}", n + 1
    taken.add(out)
    return out


# Per value of a branch field: (applied, held, failed late, tasks applied to up to 2) of a
# candidate, from its counts.
PerValue = Callable[[ValueCounts], tuple[int, int, int, int]]


class _Builder:
    def __init__(self, counts: GroupCounts, min_support: float, min_applied: int) -> None:
        self.c = counts
        self.min_support, self.min_applied = min_support, min_applied
        self.out: list[Candidate] = []
        self.ids: set[str] = set()

    def ok(self, held: int, applied: int) -> bool:
        return applied >= self.min_applied and applied > 0 and held / applied >= self.min_support

    def add(self, name: str, key: tuple[Any, ...], check: dict[str, Any], applied: int, held: int,
            examples: list[str], text: str, per_value: PerValue | None = None) -> None:  # fmt: skip
        """Add the candidate if it is supported enough; but if a branch field separates its
        counter-examples, its guarded forms instead (whatever its support without the guard)."""
        if per_value is not None and held < applied:
            found = self._separated(per_value, applied - held)
            if found is not None:
                self._guarded(name, key, check, held, text, *found)
                return
        if self.ok(held, applied):
            self._emit(name, key, check, applied, held, examples, text, None)

    def _emit(self, name: str, key: tuple[Any, ...], check: dict[str, Any], applied: int, held: int,
              examples: list[str], text: str, when: str | None) -> None:  # fmt: skip
        ident = slug(name, self.ids)
        self.out.append(Candidate(ident, key, check, applied, held, examples[: self.c.limits.examples], text, when))

    def _separated(self, per_value: PerValue, failed: int) -> tuple[Branch, list[Any], int] | None:
        """The first branch field whose values split the trajectories exactly: every failure in
        trajectories with a value with which the candidate failed wherever it applied, never
        late, at least ``min_applied`` of them; another value seen where it held; and every value
        seen where it applied representative (it applied in all the value's trajectories, or in
        those of two tasks at least). (field, the failing values, their trajectories)."""
        for br in self.c.branches:
            values, broken, other = [], 0, 0
            for v, table in br.tables.items():
                applied, held, late, tasks = per_value(table)
                if not applied:
                    continue
                if applied < table.n and tasks < 2:
                    break
                if held == 0 and late == 0:
                    values.append(v)
                    broken += applied
                else:
                    other += applied
            else:
                if values and broken == failed and other and broken >= self.min_applied:
                    return br, sorted(values, key=_literal), broken
        return None

    def _guarded(self, name: str, key: tuple[Any, ...], check: dict[str, Any], held: int, text: str, br: Branch,
                 values: list[Any], broken: int) -> None:  # fmt: skip
        """The candidate where the field did not have those values (it held in all of them), and
        for ``must_call T``, ``never_call T`` where it had them (T was never called there)."""
        exists, said = _exists(br, values), _said(br, values)
        label = f"{br.tool}-{br.path}-{'-'.join(str(v) for v in values)}"
        if self.ok(held, held):
            self._emit(f"{name}-unless-{label}", key, check, held, held, [], f"{text} unless {said}", f"!{exists}")
        if key[0] == "must_call":
            tool = key[1]
            self._emit(f"no-{tool}-if-{label}", ("never_call", tool), {"never_call": tool}, broken, broken, [],
                       f"never_call {tool} if {said}", exists)  # fmt: skip


def _literal(v: Any) -> str:
    """A branch value as a CEL literal."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v) if isinstance(v, int) else json.dumps(v, ensure_ascii=False)


def _exists(br: Branch, values: list[Any]) -> str:
    """CEL: a successful call of the field's tool returned one of ``values`` in it (a missing key
    is false, as the field was missing when mining)."""
    terms = ['s.kind == "tool"', f"s.name == {json.dumps(br.tool, ensure_ascii=False)}", "s.error == null",
             's.result_status == "captured"']  # fmt: skip
    ref = "s.result"
    for k in br.keys:
        terms.append(f"{json.dumps(k)} in {ref}")
        ref += f"[{json.dumps(k)}]"
    literals = [_literal(v) for v in values]
    terms.append(f"{ref} == {literals[0]}" if len(literals) == 1 else f"{ref} in [{', '.join(literals)}]")
    return f"steps.exists(s, {' && '.join(terms)})"


def _said(br: Branch, values: list[Any]) -> str:
    literals = [_literal(v) for v in values]
    what = literals[0] if len(literals) == 1 else " or ".join(literals)
    return f"{br.tool} returned {br.path} {what}"


def build(counts: GroupCounts, min_support: float, min_applied: int) -> list[Candidate]:
    """Every candidate whose support rate is at least ``min_support`` over at least
    ``min_applied`` trajectories, in a stable order (tools in order of first appearance); a
    candidate a branch separates in its guarded forms."""
    b = _Builder(counts, min_support, min_applied)
    c, n, tools, m = counts, counts.n, counts.tools, counts.limits.max_tools
    for i, t in enumerate(tools):
        b.add(f"must-call-{t}", ("must_call", t), {"must_call": t}, n, c.present[i], c.absent[i].ids,
              f"must_call {t}", _called(i))  # fmt: skip
    for i, t in enumerate(tools):
        _call_count(b, i, t, c.counts[i], n, c.absent[i].ids)
    # Ordered pairs of distinct tools: (a, its name, b, its name, the pair key).
    pairs = [(a, ta, bb, tb, a * m + bb) for a, ta in enumerate(tools) for bb, tb in enumerate(tools) if a != bb]
    for _, ta, bb, tb, key in pairs:
        ex = c.precedes_ex.get(key)
        b.add(f"{ta}-before-{tb}", ("precedes", ta, tb), {"precedes": {"first": ta, "then": tb}},
              c.present[bb], c.precedes[key], ex.ids if ex else [], f"precedes {ta} -> {tb}",
              _preceded(key, bb))  # fmt: skip
    for a, ta, _, tb, key in pairs:
        ex = c.responds_ex.get(key)
        b.add(f"{tb}-after-{ta}", ("responds", ta, tb), {"responds": {"trigger": ta, "then": tb}},
              c.present[a], c.responds[key], ex.ids if ex else [], f"responds {ta} -> {tb}",
              _responded(key, a))  # fmt: skip
    for a, ta, bb, tb, key in pairs:
        # A tool that is never called says nothing about when it is not called.
        if c.present[bb] < min_applied:
            continue
        ex = c.after_ex.get(key)
        b.add(f"no-{tb}-after-{ta}", ("never_after", tb, ta), {"scope": {"after": ta}, "never_call": tb},
              c.present[a], c.present[a] - c.after[key], ex.ids if ex else [], f"never_call {tb} after {ta}",
              _not_after(key, a))  # fmt: skip
    for metric in c.budgets:
        _budget(b, metric, c.budgets[metric], c.budget_applied[metric])
    for targets in c.targets.values():
        for target in targets:
            _arguments(b, target)
    return b.out


def _called(i: int) -> PerValue:
    return lambda v: (v.n, v.present[i], 0, len(v.tasks_with[None]))


def _preceded(key: int, then: int) -> PerValue:
    return lambda v: (v.present[then], v.precedes[key], v.late_precedes[key], len(v.tasks_with[then]))


def _responded(key: int, trigger: int) -> PerValue:
    return lambda v: (v.present[trigger], v.responds[key], 0, len(v.tasks_with[trigger]))


def _not_after(key: int, after: int) -> PerValue:
    return lambda v: (v.present[after], v.present[after] - v.after[key], v.late_after[key], len(v.tasks_with[after]))


def _call_count(b: _Builder, i: int, tool: str, hist: Histogram, n: int, absent: list[str]) -> None:
    counts = dict(hist.counts)
    zero = n - sum(counts.values())
    values = sorted(counts)
    if not values:
        return
    # The smallest max (at least 1: a max of 0 would be never_call) and the largest min (at
    # least 2: a min of 1 is must_call) that hold often enough.
    high = next(v for v in values if (zero + sum(counts[x] for x in values if x <= v)) / n >= b.min_support
                or v == values[-1])  # fmt: skip
    low = next((v for v in reversed(values) if v >= 2 and sum(counts[x] for x in values if x >= v) / n
                >= b.min_support), None)  # fmt: skip
    if low is not None and low > high:
        low = None
    while True:
        held = sum(counts[x] for x in values if (low is None or x >= low) and x <= high)
        if low is None:
            held += zero
        if low is None or b.ok(held, n):
            break
        low = None
    bad = [x for x in values if x > high or (low is not None and x < low)]
    examples = (absent if low is not None else []) + hist.ids(bad)
    spec: dict[str, Any] = {"tool": tool}
    if low is not None:
        spec["min"] = low
    spec["max"] = high

    def within(x: int) -> bool:
        return bool((low is None or x >= low) and x <= high)

    def per_value(v: ValueCounts) -> tuple[int, int, int, int]:
        mine = [(x, k) for (t, x), k in v.counts.items() if t == i]
        held = sum(k for x, k in mine if within(x)) + (v.n - v.present[i] if low is None else 0)
        late = sum(k for (t, x), k in v.late_counts.items() if t == i and not within(x))
        return v.n, held, late, len(v.tasks_with[None])

    bounds = f"{low}..{high}" if low is not None else f"at most {high}"
    b.add(f"count-{tool}", ("call_count", tool, low, high), {"call_count": spec}, n, held, examples,
          f"call_count {tool} {bounds}", per_value)  # fmt: skip


def _bound(b: _Builder, hist: Histogram, applied: int, upper: bool, widen: bool = False,
           partial: Histogram | None = None) -> tuple[Any, int, int, list[str]] | None:  # fmt: skip
    """The tightest bound (a bucket edge) that held in enough trajectories: (bound, held,
    applied, examples). ``widen``: for measured quantities, where the tightest bound would flag
    the largest ``1 - min_support`` of good runs by construction, the bound is the largest value
    seen within ``WIDEN`` times it (values further out are what it flags); a lower bound is 0 when
    no value was negative. ``partial``: trajectories with undecided calls, which count (as fails)
    only where a decided value is beyond the bound."""
    values = sorted(hist.counts, reverse=not upper)
    extra = partial.counts if partial is not None else {}

    def beyond(x: Any, v: Any) -> bool:
        return bool(x > v if upper else x < v)

    def at(v: Any) -> tuple[int, int, list[str]]:
        held = sum(n for x, n in hist.counts.items() if not beyond(x, v))
        out = [x for x in values if beyond(x, v)]
        failed = [x for x in extra if beyond(x, v)]
        examples = hist.ids(out) + (partial.ids(failed) if partial is not None else [])
        return held, applied + sum(extra[x] for x in failed), examples

    for v in values:
        held, n, examples = at(v)
        if b.ok(held, n):
            break
    else:
        return None
    if widen:
        if upper and v > 0:
            v = max(x for x in values if x <= WIDEN * v)
        elif not upper and min([values[-1], *extra]) >= 0:
            v = 0
        held, n, examples = at(v)
    return v, held, n, examples


# See ``_bound``: a value ten times the usual is a slip (a missing decimal point), not a variation.
WIDEN = 10


def _budget(b: _Builder, metric: str, hist: Histogram, applied: int) -> None:
    found = _bound(b, hist, applied, upper=True, widen=metric == "max_tokens")
    if found is None:
        return
    bound, held, applied, examples = found
    b.add(f"budget-{metric.removeprefix('max_')}", ("budget", metric, bound), {"budget": {metric: bound}}, applied,
          held, examples, f"budget {metric} {bound}")  # fmt: skip


def _cel_path(path: str) -> str:
    out = "args"
    for seg in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        out += seg if seg.startswith("[") else f'["{seg}"]'
    return out


def _arguments(b: _Builder, target: Target) -> None:
    tool, path = target.tool, target.path
    for flow in target.flows:
        src: Source = flow.source
        # A value that never changed cannot tell dataflow from two constants.
        if not flow.varied:
            continue
        step = {"tool": src.tool, src.field: src.path}
        b.add(f"{tool}-{path}-from-{src.tool}-{src.field}-{src.path}", ("flow", tool, path, src),
              {"arg_equals": {"tool": tool, "arg": path, "step": step}}, flow.applied, flow.held,
              flow.examples.ids, f"arg_equals {tool}.{path} = {src.tool} {src.field} {src.path}")  # fmt: skip
    keys = target.format_keys
    if keys is not None and target.format_applied:
        _format(b, target, keys)
    if target.numeric and target.number_applied:
        expr = _cel_path(path)
        for upper, hist, partial in ((True, target.high, target.high_partial),
                                     (False, target.low, target.low_partial)):  # fmt: skip
            found = _bound(b, hist, target.number_applied, upper, widen=True, partial=partial)
            if found is None:
                continue
            bound, held, applied, examples = found
            literal = str(bound) if target.all_int or isinstance(bound, float) or bound == 0 else f"{bound}.0"
            op = "<=" if upper else ">="
            b.add(f"{tool}-{path}-{'max' if upper else 'min'}", ("range", tool, path, upper, bound),
                  {"arg_satisfies": {"tool": tool, "expr": f"{expr} {op} {literal}"}}, applied, held,
                  examples, f"{tool}.{path} {op} {literal}")  # fmt: skip


def _format(b: _Builder, target: Target, keys: Histogram) -> None:
    """Add shapes, most frequent first, until enough trajectories have only accepted shapes (at
    most ``MAX_ALTERNATIVES``)."""
    by_shape: dict[formats.Shape, int] = {}
    for key, n in keys.counts.items():
        if key is OVERFLOW:
            continue
        for shape in key:
            if shape in target.shapes:
                by_shape[shape] = by_shape.get(shape, 0) + n
    ranked = sorted(by_shape, key=lambda s: (-by_shape[s], s))[:MAX_ALTERNATIVES]
    accepted: list[formats.Shape] = []
    for shape in ranked:
        accepted.append(shape)
        allowed = set(accepted)
        held = sum(n for key, n in keys.counts.items() if key is not OVERFLOW and key <= allowed)
        partial = target.format_partial
        failed_partial = [key for key in partial.counts if key is OVERFLOW or not key <= allowed]
        applied = target.format_applied + sum(partial.counts[key] for key in failed_partial)
        if b.ok(held, applied):
            bad = [key for key in keys.counts if key is OVERFLOW or not key <= allowed]
            examples = [i for key in bad for i in keys.examples[key].ids]
            examples += [i for key in failed_partial for i in partial.examples[key].ids]
            literal = len(target.distinct) >= formats.LITERAL_AFTER
            pattern = formats.regex(accepted, target.shapes, literal)
            b.add(f"{target.tool}-{target.path}-format", ("format", target.tool, target.path),
                  {"arg_matches": {"tool": target.tool, "arg": target.path, "regex": pattern}}, applied, held,
                  examples, f"{target.tool}.{target.path} matches {pattern}")  # fmt: skip
            return


# A format that needs more alternatives than this is not a format.
MAX_ALTERNATIVES = 3


# ---- implication ---------------------------------------------------------------------------

# Among candidates with the same support rate, the order in which they are tested: a kind tested
# earlier is the one dropped when two are implied by each other.
_TIE_ORDER = {"never_after": 0, "responds": 1, "flow": 2, "precedes": 3, "budget": 4, "call_count": 5}
# Never dropped (see the package docstring).
_NEVER_DROPPED = frozenset({"must_call", "never_call", "format", "range"})


class _Kept:
    """The candidates still kept, indexed for the rules."""

    def __init__(self, candidates: Iterable[Candidate]) -> None:
        self.all = {id(c): c for c in candidates}
        self.by_key = {c.key: c for c in self.all.values()}
        self.edges: dict[str, dict[str, dict[str, Candidate]]] = {"precedes": {}, "responds": {}}
        for c in self.all.values():
            if c.kind in self.edges:
                self.edges[c.kind].setdefault(c.key[1], {})[c.key[2]] = c

    def remove(self, c: Candidate) -> None:
        del self.all[id(c)]
        del self.by_key[c.key]
        if c.kind in self.edges:
            del self.edges[c.kind][c.key[1]][c.key[2]]

    def get(self, key: tuple[Any, ...], rate: float) -> Candidate | None:
        c = self.by_key.get(key)
        return c if c is not None and c.rate >= rate else None

    def path(self, kind: str, a: str, b: str, rate: float, skip: Candidate | None = None) -> list[Candidate] | None:
        """Edges of a path a -> ... -> b of kept ``kind`` candidates at ``rate`` or better, not using ``skip``."""
        graph = self.edges[kind]
        came: dict[str, Candidate | None] = {a: None}
        todo = deque([a])
        while todo:
            x = todo.popleft()
            for y, edge in graph.get(x, {}).items():
                if edge is skip or edge.rate < rate or y in came:
                    continue
                came[y] = edge
                if y == b:
                    out = []
                    while (e := came[y]) is not None:
                        out.append(e)
                        y = e.key[1]
                    return out[::-1]
                todo.append(y)
        return None

    def at_most_once(self, tool: str, rate: float) -> Candidate | None:
        for c in self.all.values():
            if c.kind == "call_count" and c.key[1] == tool and c.key[3] <= 1 and c.rate >= rate:
                return c
        return None

    def flows_into(self, tool: str, path: str, rate: float) -> list[Candidate]:
        return [c for c in self.all.values() if c.kind == "flow" and c.key[1:3] == (tool, path) and c.rate >= rate]


def _implied(c: Candidate, kept: _Kept) -> list[Candidate] | None:
    """The kept candidates (support rate at least ``c``'s) that together imply ``c``, or None."""
    r = c.rate
    kind = c.kind
    if kind == "precedes":
        _, a, b = c.key
        return kept.path("precedes", a, b, r, skip=c)
    if kind == "responds":
        _, a, b = c.key
        chain = kept.path("responds", a, b, r, skip=c)
        if chain:
            return chain
        must_b = kept.get(("must_call", b), r)
        if must_b is None:
            return None
        # b always happens, and after the first successful a: a's only call (or every a,
        # if none follows b) is answered.
        once = kept.at_most_once(a, r)
        order = kept.path("precedes", a, b, r) if once else None
        if once and order:
            return [*order, once, must_b]
        never = _never_after(kept, a, b, r, None)
        return [must_b, *never] if never else None
    if kind == "never_after":
        _, b, a = c.key
        return _never_after(kept, b, a, r, c)
    if kind == "call_count":
        _, _tool, low, high = c.key
        budget = kept.get(("budget", "max_tool_calls", _budget_of(kept, "max_tool_calls")), r)
        return [budget] if low is None and budget is not None and budget.key[2] <= high else None
    if kind == "budget":
        _, metric, bound = c.key
        for wider in _BUDGET_WIDER.get(metric, ()):
            other = kept.get(("budget", wider, _budget_of(kept, wider)), r)
            if other is not None and other.key[2] <= bound:
                return [other]
        return None
    if kind == "flow":
        _, tool, path, src = c.key
        if src.field != "arg":
            return None
        for other in kept.flows_into(tool, path, r):
            if other is c:
                continue
            root = other.key[3]
            feeds = kept.get(("flow", src.tool, src.path, root), r)
            once = kept.at_most_once(root.tool, r)
            if feeds is not None and once is not None:
                return [other, feeds, once]
        return None
    return None


def _never_after(kept: _Kept, b: str, a: str, r: float, skip: Candidate | None) -> list[Candidate] | None:
    """Kept candidates (rate >= r, not ``skip``) giving "no successful b after the first successful a"."""
    direct = kept.get(("never_after", b, a), r)
    if direct is not None and direct is not skip:
        return [direct]
    once = kept.at_most_once(b, r)
    order = kept.path("precedes", b, a, r) if once else None
    if once and order:
        return [once, *order]
    for other in kept.all.values():
        if other is skip or other.kind != "never_after" or other.key[1] != b or other.rate < r:
            continue
        order = kept.path("precedes", other.key[2], a, r)
        if order:
            return [other, *order]
    return None


# A count is part of a wider one: tool calls and model calls are steps, tool errors tool calls.
_BUDGET_WIDER = {"max_tool_calls": ("max_steps",), "max_llm_calls": ("max_steps",),
                 "max_tool_errors": ("max_tool_calls", "max_steps")}  # fmt: skip


def _budget_of(kept: _Kept, metric: str) -> Any:
    for key in kept.by_key:
        if key[0] == "budget" and key[1] == metric:
            return key[2]
    return None


def _written(premises: list[str], by_id: dict[str, Candidate]) -> list[str]:
    """``premises`` with each dropped one replaced by what implies it, recursively. This ends: a
    premise was kept when it was used, so its own premises were dropped later or never."""
    out: list[str] = []
    for p in premises:
        for q in _written(by_id[p].implied_by, by_id) if by_id[p].implied_by else [p]:
            if q not in out:
                out.append(q)
    return out


def prune(candidates: list[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
    """(kept, implied): weakest first, a candidate is dropped when kept candidates at least as
    well supported imply it; ``implied_by`` names them. A guarded candidate is implied by
    unguarded ones and ones of the same guard (all hold where the guard is true), never the
    other way round."""
    plain = [c for c in candidates if c.when is None]
    _prune(plain, [])
    premises = [c for c in plain if not c.implied_by]
    for when in dict.fromkeys(c.when for c in candidates if c.when is not None):
        _prune([c for c in candidates if c.when == when], premises)
    implied = [c for c in candidates if c.implied_by]
    return [c for c in candidates if not c.implied_by], implied


def _prune(candidates: list[Candidate], premises: list[Candidate]) -> None:
    """Set ``implied_by`` of the ``candidates`` implied by others or by ``premises`` (kept)."""
    kept = _Kept([*premises, *candidates])
    order: Callable[[Candidate], tuple[float, int]] = lambda c: (c.rate, _TIE_ORDER.get(c.kind, 9))  # noqa: E731
    for c in sorted(candidates, key=order):
        if c.kind in _NEVER_DROPPED:
            continue
        why = _implied(c, kept)
        if why:
            c.implied_by = [x.id for x in why]
            kept.remove(c)
    # Name premises that are written where possible: one tested earlier may have gone since
    # (it is implied by what remains, so ``c`` still is).
    by_id = {c.id: c for c in [*premises, *candidates]}
    for c in candidates:
        if c.implied_by:
            final = _implied(c, kept)
            c.implied_by = [x.id for x in final] if final else _written(c.implied_by, by_id)
