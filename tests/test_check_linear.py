"""The linear paths of the checks give what the direct ones give: CEL ``filter``/``map`` over the
steps evaluated per step against the binding running the whole expression."""

from __future__ import annotations

from typing import Any

import cel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.check.expr import CostBudget, EvaluationError, Expression

EXPRESSIONS = [
    "size(steps.filter(s, s.kind == 'tool')) > 0",
    "steps.filter(s, s.kind == 'tool').size() == 2",
    "size(steps.filter(s, s.kind == 'tool' && s.error == null)) <= ctx.limit",
    "steps.filter(s, s.name == 'pay').all(p, p.error == null)",
    "steps.map(s, s.name).exists(n, n == 'refund')",
    "size(steps.map(s, s.index)) == size(steps)",
    "steps.map(s, s.tokens * 2).all(t, t >= 0)",
    # a body that fails on some steps (tokens is null), and errors absorbed by || and &&
    "size(steps.filter(s, s.tokens > 10)) > 0 || true",
    "ctx.limit < 0 && size(steps.filter(s, s.tokens > 10)) > 0",
    "size(steps.filter(s, s.tokens > 10)) > 0",
    # a predicate that is not a boolean
    "size(steps.filter(s, s.name)) > 0",
    "size(steps.filter(s, s.kind == 'tool')) + size(steps.filter(s, s.kind == 'llm')) == size(steps)",
    # exists and all, decided by the first step that decides, errors before it included
    "steps.exists(s, s.kind == 'tool' && s.error == null)",
    "steps.all(s, s.kind != 'agent') && ctx.limit >= 0",
    "steps.exists(s, s.tokens > 10)",
    "steps.all(s, s.tokens < 30)",
    "!steps.exists(s, s.name == 'refund') || steps.all(s, s.error == null)",
    "steps.exists(s, s.name)",
]

step_maps = st.lists(
    st.fixed_dictionaries(
        {
            "index": st.integers(0, 50),
            "kind": st.sampled_from(["tool", "llm", "agent", "other"]),
            "name": st.sampled_from(["pay", "refund", "lookup", "chat"]),
            "error": st.one_of(st.none(), st.just("503")),
            "tokens": st.one_of(st.none(), st.integers(0, 40)),
        }
    ),
    max_size=12,
)


def _direct(source: str, activation: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "value", cel.compile(source).execute(dict(activation))
    except Exception:
        return "error", None


def _linear(expression: Expression, activation: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "value", expression.run(activation, CostBudget())
    except EvaluationError:
        return "error", None


@pytest.mark.parametrize("source", EXPRESSIONS)
def test_every_expression_here_takes_the_linear_path(source: str) -> None:
    # the rewritten program exists, so what the property below compares is that path
    assert Expression(source, ("steps", "ctx"))._rest is not None


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(EXPRESSIONS), step_maps, st.integers(-1, 5))
def test_filter_and_map_over_the_steps_give_what_the_binding_gives(source: str, steps: list[Any], limit: int) -> None:
    expression = Expression(source, ("steps", "ctx"))
    activation = {"steps": steps, "ctx": {"limit": limit}}
    assert _linear(expression, activation) == _direct(source, activation)


# Bodies decided in Python (a field compared with a literal, joined by && or by ||), over step
# maps whose fields hold every type a step map can: each step the predicate cannot decide
# exactly goes to the binding, so the result is the binding's.
literals = st.sampled_from(["'tool'", '"pay"', "''", "3", "-1", "0", "true", "false", "null", "9223372036854775807"])
comparisons = st.tuples(st.sampled_from(["kind", "name", "tokens", "flag", "absent"]), st.sampled_from(["==", "!="]),
                        literals)  # fmt: skip
any_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False),
    st.sampled_from(["tool", "pay", ""]), st.text(max_size=3), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)  # fmt: skip
loose_steps = st.lists(
    st.dictionaries(st.sampled_from(["kind", "name", "tokens", "flag"]), any_values, max_size=4), max_size=8
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(comparisons, min_size=1, max_size=3), st.sampled_from([" && ", " || "]), loose_steps,
    st.sampled_from(["size(steps.filter(s, {})) >= 1", "steps.exists(s, {})", "steps.all(s, {})"]),
)  # fmt: skip
def test_bodies_decided_in_python_give_what_the_binding_gives(
    parts: list[tuple[str, str, str]], join: str, steps: list[Any], template: str
) -> None:
    body = join.join(f"s.{field} {op} {literal}" for field, op, literal in parts)
    source = template.format(body)
    expression = Expression(source, ("steps",))
    assert expression._native[0].predicate is not None
    activation = {"steps": steps}
    assert _linear(expression, activation) == _direct(source, activation)


@pytest.mark.parametrize(
    "body",
    ["s.kind == 'a' && s.name == 'b' || s.x == 1", "s.kind == 'a\\'b'", "s.n == 1.0", "s.n == 1u", "t.kind == 'a'",
     "s.kind in ['a']", "(s.kind == 'a')"],
)  # fmt: skip
def test_other_bodies_go_to_the_binding(body: str) -> None:
    expression = Expression(f"size(steps.filter(s, {body})) >= 0", ("steps", "t"))
    assert all(n.predicate is None for n in expression._native)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("s.kind=!'\"&|09 tnrufl")), max_size=40), st.lists(any_values, max_size=3))
def test_reading_a_body_never_raises(body: str, values: list[Any]) -> None:
    """Any text: no predicate (the binding evaluates it) or one that answers any step."""
    from otel_plumb.check.expr import _predicate

    decide = _predicate(body, "s")
    if decide is not None:
        for value in [*values, *({"kind": v} for v in values)]:
            assert decide(value) in (True, False, None)
