"""CEL expressions (``when``, ``arg_satisfies``, ``expr``), compiled once per policy.

Backed by ``common-expression-language`` (``import cel``: Rust bindings). Compilation
checks syntax, and also the names an expression uses: an unknown variable or function is
refused when the policy loads, not discovered on the first trajectory.

Cost: the binding converts every value of the activation on each evaluation (linear in the
steps), and its ``filter`` and ``map`` copy their growing result at each element (quadratic:
3.3 s for a ``filter`` over 5,000 steps). So ``steps.filter(x, p)``, ``steps.map(x, e)``,
``steps.exists(x, p)`` and ``steps.all(x, p)`` outside any other comprehension are evaluated
here instead: the body is compiled on its own and run once per step (for ``exists`` and
``all``, in order up to the first step that decides, as the binding does), and the result
(or, under ``size(...)``, its length) bound to a variable of the rest of the expression. That is
linear in the steps (about 8 µs a step). When the body fails on a step (a missing key, a
predicate that is not a boolean) the whole expression runs in the binding as written, so
errors and their short-circuiting are the library's own.

The commonest bodies, a field compared with a literal (``s.kind == 'tool'``, ``s.error ==
null``, joined by ``&&`` or by ``||``), are decided in Python for a step whose fields hold the
literal's type (or, against null, a string, boolean or int): under 1 µs a step against 6 to 9.
Any other step goes through the library, so the answer is always the library's.

Trace values may hold stand-ins for what was sent (``"<REDACTED>"``, ``[redacted:email]``),
and an expression that reads one decides on the stand-in's text: a false fail or a false
pass. So ``Expression`` notes at compile which of a step's ``args`` and ``result`` it names
(``value_roots``) and which it reads whole (``whole_roots``, see ``_whole_roots``); the checks
then look for a stand-in it may read before evaluating (``values.stand_in_read``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final

import cel

# Functions of the CEL standard library this binding implements (macros such as has, all,
# exists, exists_one, map and filter are expanded by the parser and never listed).
_FUNCTIONS: Final = frozenset(
    {
        "size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double", "string",
        "bytes", "type", "timestamp", "duration", "dyn", "getFullYear", "getMonth", "getDate",
        "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getHours", "getMinutes", "getSeconds",
        "getMilliseconds",
    }
)  # fmt: skip
_MACRO_VARIABLE: Final = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")


_WORD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# ``args``, ``result`` or ``ctx`` read other than by plain field selection (``args.to``): an index
# (``args["to"]``), a method or macro (``args.size()``, ``args.exists(k, ...)``), an argument
# (``size(args)``, ``string(args)``) or an operand (``args == {...}``, ``'to' in args``) reads the
# whole value, so a stand-in anywhere in it may be read whatever its key. Matched over the raw
# source: the word inside a string literal counts too, which errs towards reading.
_WHOLE_READ: Final = re.compile(r"\b(args|result|ctx)\b(?!\s*\.\s*[A-Za-z_][A-Za-z0-9_]*\b(?!\s*\())")
VALUE_ROOTS: Final = frozenset({"args", "result"})

# Limits on what one expression may cost. The binding has no cost or time limit of its own and
# holds the interpreter until it returns, so the bounds are set here: nested comprehensions over
# whole collections multiply (``steps.all(a, steps.all(b, steps.all(c, ...)))`` is len(steps)^3
# evaluations), so more than MAX_NESTING are refused at load; and before each evaluation its cost
# (values converted into CEL, comprehension iterations) is estimated and charged to the
# trajectory's budget: an expression over the steps evaluated once per call adds up too.
MAX_SOURCE_CHARS: Final = 10_000
MAX_NESTING: Final = 2
COST_BUDGET: Final = 1_000_000
CONVERT_COST: Final = 3
FILTER_COPY_COST: Final = 0.25
# A verdict made indeterminate by the budget has a message starting with this.
BUDGET_EXCEEDED: Final = "CEL cost budget exceeded"
_MACROS: Final = frozenset({"all", "exists", "exists_one", "map", "filter"})
_TOKEN: Final = re.compile(
    r"""(?P<space>\s+)|(?P<comment>//[^\n]*)"""
    r"""|(?P<string>[rRbB]{0,2}(?:'{3}[\s\S]*?'{3}|"{3}[\s\S]*?"{3}|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))"""
    r"""|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<number>\d[\w.]*)|(?P<punct>.)""",
)
_OPEN: Final = {"(": ")", "[": "]", "{": "}"}
_CLOSE: Final = {v: k for k, v in _OPEN.items()}


@dataclass(slots=True)
class Comprehension:
    """One macro call (``R.all(x, ...)`` and friends): what it ranges over, and the
    comprehensions in its body. ``root`` is the identifier the range starts from (``steps``
    in ``steps.filter(...).all(...)``); ``bound``: that identifier is an enclosing
    comprehension's variable (the range is part of one element, not a whole collection)."""

    macro: str
    range_text: str
    root: str | None
    bound: bool
    children: list[Comprehension] = field(default_factory=list)
    # Where it is in the source: the receiver's start, and past the call's closing parenthesis;
    # its variable and body (None unless it is the two-argument form ``R.m(x, body)``); and the
    # source span of ``size(...)`` or ``.size()`` around it, when there is one.
    start: int = 0
    end: int = 0
    var: str | None = None
    body: str | None = None
    sized: tuple[int, int] | None = None


def _tokens(source: str) -> tuple[list[tuple[str, str, int]], dict[int, int]]:
    """The tokens of a CEL expression (kind, text, offset; no spaces or comments), and for each
    closing bracket the index of its opening one."""
    tokens: list[tuple[str, str, int]] = []
    for m in _TOKEN.finditer(source):
        kind = m.lastgroup or "punct"
        if kind not in ("space", "comment"):
            tokens.append((kind, m.group(), m.start()))
    match: dict[int, int] = {}
    stack: list[int] = []
    for i, (kind, text, _) in enumerate(tokens):
        if kind != "punct":
            continue
        if text in _OPEN:
            stack.append(i)
        elif text in _CLOSE and stack and tokens[stack[-1]][1] == _CLOSE[text]:
            match[i] = stack.pop()
    return tokens, match


def comprehensions(source: str) -> list[Comprehension]:
    """The comprehension tree of a CEL expression, read from its tokens."""
    tokens, match = _tokens(source)
    top: list[Comprehension] = []
    # Open parentheses: (index of the closing token, the comprehension it opened or None, its variable)
    frames: list[tuple[int, Comprehension | None, str | None]] = []
    closing = {v: k for k, v in match.items()}
    for i, (kind, text, _) in enumerate(tokens):
        while frames and frames[-1][0] < i:
            frames.pop()
        if kind == "punct" and text == "(" and i in closing:
            node: Comprehension | None = None
            var: str | None = None
            if i >= 2 and tokens[i - 1][0] == "ident" and tokens[i - 1][1] in _MACROS and tokens[i - 2][1] == ".":
                start, root = _receiver(tokens, match, i - 3)
                bound_vars = {v for _, _, v in frames if v is not None}
                var = tokens[i + 1][1] if i + 1 < len(tokens) and tokens[i + 1][0] == "ident" else None
                begin = tokens[start][2] if start <= i - 3 else tokens[i - 2][2]
                close = closing[i]
                node = Comprehension(
                    tokens[i - 1][1], source[begin : tokens[i - 2][2]], root, root is not None and root in bound_vars,
                    start=begin, end=tokens[close][2] + 1,
                )  # fmt: skip
                two_args = i + 3 < close and tokens[i + 2][1] == "," and _commas(tokens, closing, i, close) == 1
                if var is not None and two_args:
                    node.var, node.body = var, source[tokens[i + 3][2] : tokens[close][2]]
                node.sized = _sized(tokens, match, start if start <= i - 3 else i - 2, close)
                parent = next((n for _, n, _ in reversed(frames) if n is not None), None)
                (parent.children if parent is not None else top).append(node)
            frames.append((closing[i], node, var))
    return top


def _commas(tokens: list[tuple[str, str, int]], closing: dict[int, int], open_at: int, close: int) -> int:
    """Commas between the parentheses at ``open_at`` and ``close``, outside nested brackets
    (``closing``: each opening bracket's closing one)."""
    n, j = 0, open_at + 1
    while j < close:
        if j in closing:
            j = closing[j]
        elif tokens[j][1] == ",":
            n += 1
        j += 1
    return n


def _sized(tokens: list[tuple[str, str, int]], match: dict[int, int], first: int, last: int) -> tuple[int, int] | None:
    """The source span of ``size(<tokens first..last>)`` or ``<first..last>.size()``, if so."""
    n = len(tokens)
    if (
        first >= 2 and tokens[first - 1][1] == "(" and tokens[first - 2][1] == "size"
        and (first < 3 or tokens[first - 3][1] != ".") and last + 1 < n and match.get(last + 1) == first - 1
    ):  # fmt: skip
        return tokens[first - 2][2], tokens[last + 1][2] + 1
    if (
        last + 4 < n and tokens[last + 1][1] == "." and tokens[last + 2][1] == "size"
        and tokens[last + 3][1] == "(" and tokens[last + 4][1] == ")"
    ):  # fmt: skip
        return tokens[first][2], tokens[last + 4][2] + 1
    return None


def _receiver(tokens: list[tuple[str, str, int]], match: dict[int, int], i: int) -> tuple[int, str | None]:
    """Walk back over the postfix chain ending at token ``i`` (``a.b[0].filter(...)``): where it
    starts and the identifier it starts from (None for a literal or a parenthesised expression)."""
    while i >= 0:
        kind, text, _ = tokens[i]
        if kind == "punct" and text in _CLOSE and i in match:
            j = match[i]
            before = tokens[j - 1] if j >= 1 else None
            if text == ")" and before is not None and before[0] == "ident":
                i = j - 1  # a call: method or function name
                continue
            if text == "]" and before is not None and (before[0] == "ident" or before[1] in (")", "]")):
                i = j - 1  # an index
                continue
            return j, None  # a literal or a parenthesised expression
        if kind == "ident":
            if i >= 2 and tokens[i - 1][1] == ".":
                i -= 2
                continue
            return i, text
        return i, None
    return 0, None


def nesting(nodes: list[Comprehension]) -> tuple[int, list[Comprehension]]:
    """The deepest chain of comprehensions over whole collections (ranges not taken from an
    enclosing comprehension's element), and that chain."""
    best: tuple[int, list[Comprehension]] = (0, [])
    for n in nodes:
        depth, chain = nesting(n.children)
        if not n.bound:
            depth += 1
        if depth > best[0]:
            best = (depth, [n, *chain])
    return best


def estimate_cost(
    nodes: list[Comprehension],
    steps: int,
    largest: int,
    element: float = 1.0,
    native: Collection[int] = (),
) -> int:
    """Upper estimate of the iterations of ``nodes``: a range over ``steps`` has ``steps``
    elements, any other at most ``largest`` (the biggest list or map in the activation).
    ``map`` and ``filter`` also copy their growing result at each element in the binding (so
    they are quadratic there: a ``filter`` over 5,000 step maps takes seconds), at
    ``FILTER_COPY_COST`` per value copied, elements of ``element`` values; not those evaluated
    here (``native``: ids of the nodes), which cost one iteration per element.

    A loop over a stack, not nested functions: a recursive closure is a reference cycle, left
    to the cyclic collector once per evaluation."""
    total = 0
    todo = [(n, 1) for n in nodes]
    while todo:
        n, outer = todo.pop()
        k = max(1, steps if n.root == "steps" and not n.bound else largest)
        inner = outer * k
        total += inner
        if n.macro in ("map", "filter") and id(n) not in native:
            total += outer * math.ceil(k * k * element * FILTER_COPY_COST)
        todo.extend((c, inner) for c in n.children)
    return total


def measure(value: Any, limit: int = 1_000_000) -> tuple[int, int]:
    """How many values ``value`` holds (what converting it into CEL costs) and the length of its
    biggest list or map; past ``limit`` values walked, ``limit`` for both (assume the worst)."""
    largest = 0
    todo = [value]
    seen = 0
    while todo:
        if seen >= limit:
            return limit, max(largest, limit)
        v = todo.pop()
        seen += 1
        if isinstance(v, dict):  # not type(v) is dict: compiled, only isinstance lets values() run in C
            n = len(v)
            if seen + n > limit:
                return limit, max(largest, n, limit)
            if n > largest:
                largest = n
            # A map's scalars are counted here, not pushed: most step maps hold nothing else.
            for x in v.values():
                tx = type(x)
                if tx is str or tx is int or tx is float or tx is bool or x is None:
                    seen += 1
                else:
                    todo.append(x)
        elif isinstance(v, (list, tuple)):
            if len(v) > largest:
                largest = len(v)
            todo.extend(v)
    return seen, largest


class CostBudget:
    """What expressions may still cost on one trajectory (for one policy). The unit is one
    iteration of a comprehension's body; converting a value into CEL costs ``CONVERT_COST``
    of them (measured: about 2 µs a value against 0.8 µs an iteration)."""

    __slots__ = ("_measured", "limit", "spent")

    def __init__(self, limit: int = COST_BUDGET) -> None:
        self.limit = limit
        self.spent = 0
        # id -> (the value, kept so that its id is not reused; values; largest collection)
        self._measured: dict[int, tuple[Any, int, int]] = {}

    def measure(self, value: Any) -> tuple[int, int]:
        """``measure(value)``, once per list or map (the step maps are the same list every call)."""
        if not isinstance(value, (dict, list)):
            return 1, 0
        known = self._measured.get(id(value))
        if known is not None and known[0] is value:
            return known[1], known[2]
        values, largest = measure(value)
        self._measured[id(value)] = (value, values, largest)
        return values, largest


class ExpressionError(ValueError):
    """An expression that does not compile, or names something that does not exist."""


class Expression:
    """One compiled expression and the variables it reads, so callers build only those."""

    __slots__ = (
        "_native", "_native_ids", "_rest", "_rest_reads", "comprehensions", "maps_whole", "program", "source",
        "trajectory_whole", "value_roots", "variables", "whole_roots", "words",
    )  # fmt: skip

    def __init__(self, source: str, allowed: Collection[str]) -> None:
        if len(source) > MAX_SOURCE_CHARS:
            raise ExpressionError(f"CEL expression is {len(source)} characters long, at most {MAX_SOURCE_CHARS}")
        try:
            self.program = cel.compile(source)
        except ValueError as exc:
            first = str(exc).splitlines()
            detail = next(
                (ln.strip() for ln in first if "Syntax error" in ln or "ERROR" in ln), first[0] if first else ""
            )
            raise ExpressionError(f"CEL expression {source!r} does not compile: {detail}") from None
        self.source = source
        bound = set(_MACRO_VARIABLE.findall(source))
        names = set(self.program.variables())
        unknown = sorted(names - bound - set(allowed))
        if unknown:
            raise ExpressionError(
                f"CEL expression {source!r} uses unknown variable {unknown[0]!r} (here: {', '.join(sorted(allowed))})"
            )
        bad = sorted(f for f in self.program.functions() if f[:1].isalpha() and f not in _FUNCTIONS)
        if bad:
            raise ExpressionError(f"CEL expression {source!r} calls unknown function {bad[0]!r}")
        self.variables = frozenset(names & set(allowed))
        # Every identifier in the source: step and trajectory maps are built with only these fields.
        self.words = frozenset(_WORD.findall(source))
        self.comprehensions = comprehensions(source)
        depth, chain = nesting(self.comprehensions)
        if depth > MAX_NESTING:
            shown = " inside ".join(f"{n.range_text}.{n.macro}" for n in reversed(chain))
            raise ExpressionError(
                f"CEL expression {source!r} nests comprehensions over whole collections {depth} deep ({shown}): "
                f"at most {MAX_NESTING}, since each level multiplies the work (len(steps)^{depth} evaluations)"
            )
        self._native, self._rest = _natives(source, self.comprehensions, allowed)
        self._native_ids = frozenset(id(n.node) for n in self._native)
        self._rest_reads = frozenset(self._rest.variables()) if self._rest is not None else frozenset[str]()
        # Where a stand-in may hide that it reads (see the module docstring): none of it, on the
        # hot path of an expression over the steps that names neither.
        self.maps_whole = bool({"step", "steps"} & self.variables) and _reads_whole(
            source, _step_maps(self.comprehensions), ("steps",)
        )
        self.trajectory_whole = "trajectory" in self.variables and _reads_whole(source, ("trajectory",), ())
        self.value_roots = VALUE_ROOTS if self.maps_whole else VALUE_ROOTS & self.words
        reads_values = self.value_roots or "ctx" in self.variables
        self.whole_roots = _whole_roots(source, self.maps_whole) if reads_values else frozenset[str]()

    def cost(self, activation: dict[str, Any], budget: CostBudget) -> tuple[int, int, int]:
        """Estimated cost of one evaluation on ``activation``: (total, values converted,
        comprehension iterations)."""
        values = largest = 0
        for v in activation.values():
            n, big = budget.measure(v)
            values += n
            largest = max(largest, big)
        steps = activation.get("steps")
        n_steps = len(steps) if isinstance(steps, list) else 0
        element = values / largest if largest else 1.0  # values in an element, about
        iterations = (
            estimate_cost(self.comprehensions, n_steps, largest, element, self._native_ids)
            if self.comprehensions
            else 0
        )
        # Evaluated here, the steps are converted once per element and what is kept once more.
        converted = 2 * values if self._native else values
        return CONVERT_COST * converted + iterations, values, iterations

    def run(self, activation: dict[str, Any], budget: CostBudget | None = None) -> Any:
        """Evaluate; raises ``EvaluationError`` with the library's message on any failure, and
        ``BudgetExceeded`` (before evaluating) when the estimated cost would overspend ``budget``."""
        if budget is not None:
            cost, values, iterations = self.cost(activation, budget)
            if budget.spent + cost > budget.limit:
                raise BudgetExceeded(
                    f"{BUDGET_EXCEEDED}: {self.source} would cost about {cost:,} ({values:,} values to convert, "
                    f"{iterations:,} comprehension iterations), and {budget.spent:,} of the {budget.limit:,} "
                    "allowed per trajectory are spent"
                )
            budget.spent += cost
        program = self.program
        if self._rest is not None and (bound := self._bind(activation)) is not None:
            activation, program = bound, self._rest
        try:
            return program.execute(dict(activation))
        except KeyError as missing:
            raise EvaluationError(f"no such key {missing.args[0] if missing.args else ''!r}") from None
        except Exception as exc:  # the binding raises ValueError, TypeError and RuntimeError too
            text = str(exc).splitlines()
            raise EvaluationError(f"{type(exc).__name__}: {text[0] if text else repr(exc)}") from None

    def _bind(self, activation: dict[str, Any]) -> dict[str, Any] | None:
        """The activation of the rewritten expression: each native comprehension's result bound
        to its variable; None when a body fails on some step (then the binding runs it all)."""
        steps = activation.get("steps")
        if not isinstance(steps, list):
            return None
        out = {k: v for k, v in activation.items() if k != "steps" or "steps" in self._rest_reads}
        for n in self._native:
            context = {k: activation[k] for k in n.variables if k in activation}
            value: Any
            try:
                if n.macro == "map":
                    run, var = n.program.execute, n.var
                    value = []
                    for element in steps:
                        context[var] = element
                        value.append(run(context))
                elif n.macro == "filter":
                    value = []
                    for element in steps:
                        keep = n.truth(element, context)
                        if keep is None:
                            return None
                        if keep:
                            value.append(element)
                else:  # exists, all: in order, up to the first step that decides, as the binding goes
                    value = n.macro == "all"
                    for element in steps:
                        keep = n.truth(element, context)
                        if keep is None:
                            return None
                        if keep is not value:
                            value = keep
                            break
            except Exception:  # any failure: the binding decides what it means, short-circuits included
                return None
            out[n.name] = len(value) if n.sized else value
        return out

    def test(self, activation: dict[str, Any], budget: CostBudget | None = None) -> bool:
        """Evaluate to a boolean; anything else is an ``EvaluationError``."""
        value = self.run(activation, budget)
        if not isinstance(value, bool):
            raise EvaluationError(f"expected true or false, got {value!r}")
        return value


def _whole_roots(source: str, maps_whole: bool) -> frozenset[str]:
    """Which of ``args``, ``result`` and ``ctx`` ``source`` may read whole (see ``_WHOLE_READ``);
    a step map read whole (``maps_whole``, see ``_reads_whole``) holds both."""
    whole = {m.group(1) for m in _WHOLE_READ.finditer(source)}
    return frozenset(whole | VALUE_ROOTS if maps_whole else whole)


def _step_maps(nodes: list[Comprehension]) -> set[str]:
    """``step``, and the variables of the comprehensions ranging over the steps."""
    maps = {"step"}
    todo = list(nodes)
    while todo:
        node = todo.pop()
        todo.extend(node.children)
        if node.root == "steps" and not node.bound and node.var is not None:
            maps.add(node.var)
    return maps


def _reads_whole(source: str, maps: Collection[str], lists: Collection[str]) -> bool:
    """Whether ``source`` may read a map of ``maps`` (or of a list of maps in ``lists``) whole,
    not only field by field: ``string(step)``, ``s == t``, ``steps[0] == steps[1]``,
    ``steps.filter(...) == []``, ``steps.map(s, s)``, ``size(trajectory)``. Then the map must
    hold every field (a map of the fields an expression names alone compares equal to another's),
    and its values may hold stand-ins. Over the tokens: each name is followed along its postfix
    chain (an index into a list, ``filter`` of it) until a field is selected, a list macro that
    gives no maps (``all``, ``exists``, ``exists_one``, ``map``) is called or a list is sized;
    any other end is a whole read. An over-estimate: a field named like a macro counts too."""
    tokens, match = _tokens(source)
    closing = {v: k for k, v in match.items()}
    n = len(tokens)
    for i, (kind, text, _) in enumerate(tokens):
        if kind != "ident" or (text not in maps and text not in lists) or (i and tokens[i - 1][1] == "."):
            continue
        declared = i + 1 == n or tokens[i + 1][1] == ","
        if i >= 2 and tokens[i - 1][1] == "(" and tokens[i - 2][1] in _MACROS and declared:
            continue  # where a comprehension declares it
        is_list, j = text in lists, i + 1
        while True:
            nxt = tokens[j][1] if j < n else ""
            called = j + 2 < n and tokens[j + 2][1] == "("
            if nxt == "[" and j in closing:
                if not is_list:
                    break  # a field by its key
                is_list, j = False, closing[j] + 1
            elif nxt == "." and j + 1 < n and tokens[j + 1][0] == "ident":
                name = tokens[j + 1][1]
                if not is_list:
                    if called:
                        return True  # a method of the map (its size)
                    break  # a field
                if name in ("all", "exists", "exists_one", "map", "size"):
                    break  # no maps out
                if name == "filter" and called and j + 2 in closing:
                    j = closing[j + 2] + 1
                    continue
                return True  # another method of the list
            else:
                if not is_list or _sized(tokens, match, i, j - 1) is None:
                    return True  # the map as a value, or sized: its fields counted
                break
    return False


@dataclass(frozen=True, slots=True)
class _Native:
    """A ``steps.filter(var, body)`` or ``steps.map(var, body)`` evaluated here (see the module
    docstring): its body compiled on its own, the activation variables it reads, and the
    variable of the rewritten expression holding its result (its length when ``sized``)."""

    node: Comprehension
    macro: str
    var: str
    program: cel.Program
    variables: frozenset[str]
    name: str
    sized: bool
    # The body decided in Python where it can be (see ``_predicate``), or None.
    predicate: Callable[[Any], bool | None] | None

    def truth(self, step: Any, context: dict[str, Any]) -> bool | None:
        """The body on one step (``context``: the activation it reads), or None when that is no
        boolean; the binding's errors are raised."""
        if self.predicate is not None:
            keep = self.predicate(step)
            if keep is not None:
                return keep
        context[self.var] = step
        keep = self.program.execute(context)
        return keep if keep is True or keep is False else None


# ``var.field == literal`` (or ``!=``): a string without escapes, an int, a boolean or null.
_COMPARISON: Final = re.compile(
    r"""\s*([A-Za-z_][A-Za-z0-9_]*)\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=)\s*"""
    r"""('[^'\\\n]*'|"[^"\\\n]*"|-?[0-9]+(?![0-9.eEuUxX])|(?:true|false|null)(?![A-Za-z0-9_]))\s*"""
)
_JOIN: Final = re.compile(r"&&|\|\|")
_NULL_COMPARABLE: Final[tuple[type, ...]] = (str, bool, int)
_MAX_INT64: Final = 2**63 - 1


def _predicate(body: str, var: str) -> Callable[[Any], bool | None] | None:
    """``body`` as a Python function of one step map, when it is comparisons of ``var``'s fields
    with literals joined all by ``&&`` or all by ``||``: it returns None for a step it cannot
    decide exactly as the library would (not a map, a field missing or of another type than
    its literal), which the library then evaluates."""
    comparisons: list[tuple[str, bool, object]] = []
    joins: set[str] = set()
    pos = 0
    while True:
        m = _COMPARISON.match(body, pos)
        if m is None or m.group(1) != var:
            return None
        literal_text = m.group(4)
        literal: object
        if literal_text[0] in "'\"":
            literal = literal_text[1:-1]
        elif literal_text in ("true", "false"):
            literal = literal_text == "true"
        elif literal_text == "null":
            literal = None
        else:
            literal = int(literal_text)  # within int64: the library refuses any other literal
        comparisons.append((m.group(2), m.group(3) == "==", literal))
        pos = m.end()
        if pos == len(body):
            break
        join = _JOIN.match(body, pos)
        if join is None:
            return None
        joins.add(join.group())
        pos = join.end()
    if len(joins) > 1:
        return None  # mixed: precedence would matter
    every = joins != {"||"}
    missing = object()

    def decide(step: Any) -> bool | None:
        if type(step) is not dict:
            return None
        for key, _, literal in comparisons:
            value = step.get(key, missing)
            kind = type(value)
            if kind is int and not -_MAX_INT64 - 1 <= value <= _MAX_INT64:
                return None
            # null equals only null; a string, boolean or int is unequal to it (and to nothing else
            # of another type is it compared here)
            if kind is not type(literal) and (literal is not None or kind not in _NULL_COMPARABLE):
                return None
        for key, equal, literal in comparisons:
            if (step[key] == literal) is equal:
                if not every:
                    return True
            elif every:
                return False
        return every

    return decide


NATIVE_PREFIX: Final = "__plumb_native_"
_NATIVE_MACROS: Final = frozenset({"filter", "map", "exists", "all"})


def _natives(
    source: str, nodes: list[Comprehension], allowed: Collection[str]
) -> tuple[list[_Native], cel.Program | None]:
    """The comprehensions of ``source`` to evaluate here, and the expression with each replaced
    by its variable: ``filter`` and ``map`` over the whole steps, outside any other comprehension,
    whose body does not read the steps again (that would be quadratic either way, and is charged
    so)."""
    natives: list[_Native] = []
    edits: list[tuple[int, int, str]] = []
    if NATIVE_PREFIX in source:
        return [], None
    for node in nodes:
        if node.macro not in _NATIVE_MACROS or node.range_text != "steps" or node.var is None or node.body is None:
            continue
        if node.sized is not None and node.macro not in ("filter", "map"):
            continue  # the size of a boolean: the binding's error to give
        try:
            program = cel.compile(node.body)
        except ValueError:
            continue
        names = frozenset(program.variables())
        if "steps" in names:
            continue
        name = f"{NATIVE_PREFIX}{len(natives)}"
        natives.append(
            _Native(node, node.macro, node.var, program, frozenset(names & set(allowed)) - {node.var}, name,
                    node.sized is not None, _predicate(node.body, node.var) if node.macro != "map" else None)
        )  # fmt: skip
        edits.append((*(node.sized or (node.start, node.end)), name))
    if not natives:
        return [], None
    rewritten = source
    for begin, end, name in sorted(edits, reverse=True):
        rewritten = rewritten[:begin] + name + rewritten[end:]
    try:
        return natives, cel.compile(rewritten)
    except ValueError:
        return [], None


class EvaluationError(Exception):
    """An expression failed at run time (missing key, type mismatch): the verdict is indeterminate."""


class BudgetExceeded(EvaluationError):
    """The estimated cost of an evaluation would overspend the trajectory's budget; the message
    starts with ``BUDGET_EXCEEDED``.

    Callers catch it under a name of its own, not the ``exc`` of an ``except EvaluationError``
    after it: compiled, a name has the type of its first ``except`` and the second one fails."""
