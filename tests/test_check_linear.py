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
