"""Checks cannot stall the process: CEL expressions are bounded at load and by a cost budget per
trajectory, and ``arg_matches`` regexes run on RE2 (linear time) or are refused at load."""

from __future__ import annotations

import fnmatch
import time

import pytest
import re2
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from test_check_support import one, policy, step, trajectory

from otel_plumb.check import BUDGET_EXCEEDED, PolicyError, budget_exceeded
from otel_plumb.check.expr import COST_BUDGET, MAX_NESTING, Expression, ExpressionError, measure
from otel_plumb.check.policy import glob_regex
from otel_plumb.check.regex import Regex
from otel_plumb.cli.main import cli

THREE_DEEP = "steps.all(a, steps.all(b, steps.all(c, a.index + b.index + c.index >= 0)))"
TWO_DEEP = "steps.all(a, steps.all(b, a.index + b.index >= 0))"
CATASTROPHIC = r"^([a-z0-9]+\s?)*$"


def steps(n: int) -> list[dict[str, object]]:
    return [step(f"t{i % 7}", args={"q": "x"}) for i in range(n)]


def timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


# ---- CEL ----------------------------------------------------------------------------------


def test_three_deep_comprehension_over_steps_is_refused_at_load_with_the_line(tmp_path):
    body = f'policy: p\ninvariants:\n  - {{id: ok, must_call: a}}\n  - id: cube\n    expr: "{THREE_DEEP}"\n'
    with pytest.raises(PolicyError) as info:
        policy(tmp_path, body)
    assert info.value.line == 5
    assert "3 deep" in info.value.message and f"at most {MAX_NESTING}" in info.value.message
    assert "steps.all inside steps.all inside steps.all" in info.value.message


@pytest.mark.parametrize("where", ["when", "arg_satisfies"])
def test_the_nesting_limit_holds_in_guards_and_argument_expressions(tmp_path, where):
    expr = THREE_DEEP.replace("a.index", "args.n")
    inv = (f'{{id: x, must_call: a, when: "{THREE_DEEP}"}}' if where == "when"
           else f'{{id: x, arg_satisfies: {{tool: a, expr: "{expr}"}}}}')  # fmt: skip
    with pytest.raises(PolicyError, match="3 deep"):
        policy(tmp_path, f"policy: p\ninvariants:\n  - {inv}\n")


@pytest.mark.parametrize(
    "source",
    [
        # ranges over an enclosing element are part of it, not another pass over a whole collection
        "steps.all(s, s.args.items.all(i, i.tags.all(t, t != 'x')))",
        # sequential comprehensions do not multiply
        "steps.exists(a, a.index > 0) && steps.all(b, b.index >= 0) && size(steps.filter(c, c.index > 1)) > 0",
        # a filter's range and its body are siblings, so this is two deep
        "steps.filter(s, steps.exists(t, t.index == s.index)).all(u, u.index >= 0)",
        # comprehension words inside strings are text
        "steps.all(s, s.name != 'steps.all(a, steps.all(b, steps.all(c, true)))')",
    ],
)
def test_expressions_within_the_limits_load(source):
    Expression(source, ["steps"])


def test_very_long_expressions_are_refused():
    with pytest.raises(ExpressionError, match="characters long"):
        Expression(" || ".join(["true"] * 3000), ["steps"])


def test_three_deep_stall_before_and_two_deep_now_on_200_steps(tmp_path):
    """The 3-deep expression took 6.4 s on 200 steps in the binding (8 million evaluations of its
    body); it is refused at load now. The 2-deep one is well inside the budget and runs."""
    traj = trajectory(*steps(200))
    v, took = timed(lambda: one(tmp_path, f'{{id: sq, expr: "{TWO_DEEP}"}}', traj))
    print(f"2-deep over 200 steps: {v.verdict} in {took * 1000:.1f} ms")
    assert v.verdict == "pass" and took < 1.0


def test_an_expression_over_the_budget_is_indeterminate_fast_and_counted(tmp_path):
    traj = trajectory(*steps(2000))  # 2000^2 = 4 million iterations, over the budget
    v, took = timed(lambda: one(tmp_path, f'{{id: sq, expr: "{TWO_DEEP}"}}', traj))
    print(f"2-deep over 2000 steps: {v.verdict} in {took * 1000:.1f} ms: {v.message}")
    assert v.verdict == "indeterminate" and took < 1.0
    assert v.message.startswith(BUDGET_EXCEEDED) and f"{COST_BUDGET:,}" in v.message
    assert budget_exceeded(v)
    assert not budget_exceeded(one(tmp_path, "{id: ok, expr: 'size(steps) > 0'}", traj))


def test_filter_over_the_steps_is_linear_and_one_the_binding_runs_is_charged_quadratic(tmp_path):
    """``filter`` copies its growing result at each element in the binding (seconds over 5,000
    step maps). Over the steps it is evaluated per step instead, and runs; a second ``filter``
    chained on it runs in the binding, is charged for the copies, and is refused before it runs."""
    expr = "size(steps.filter(s, s.kind == 'tool')) > 0"
    traj = trajectory(*steps(5000))
    v, took = timed(lambda: one(tmp_path, f'{{id: f, expr: "{expr}"}}', traj))
    print(f"filter over 5000 steps: {v.verdict} in {took * 1000:.1f} ms")
    assert v.verdict == "pass" and took < 1.0
    chained = "size(steps.filter(s, s.kind == 'tool').filter(t, t.error == null)) > 0"
    v, took = timed(lambda: one(tmp_path, f'{{id: f, expr: "{chained}"}}', traj))
    assert v.verdict == "indeterminate" and budget_exceeded(v) and took < 1.0
    assert one(tmp_path, f'{{id: f, expr: "{chained}"}}', trajectory(*steps(500))).verdict == "pass"


def test_the_budget_is_per_trajectory_across_the_calls_an_argument_check_evaluates(tmp_path):
    # Each evaluation is 1,500 iterations; 1,500 calls would be 2.25 million in all.
    traj = trajectory(*[step("pay", args={"n": i}) for i in range(1500)])
    inv = "{id: x, arg_satisfies: {tool: pay, expr: 'steps.exists(s, s.index >= 0)'}}"
    v, took = timed(lambda: one(tmp_path, inv, traj))
    print(f"arg_satisfies over 1500 calls x 1500 steps: {v.verdict} in {took * 1000:.1f} ms")
    # The budget ran out after about a hundred of the 1,500 evaluations (all of them: over 4 s).
    assert v.verdict == "indeterminate" and budget_exceeded(v)
    assert v.step_index is not None and v.step_index < 200 and took < 5.0
    # a fresh trajectory has a fresh budget
    small = trajectory(*[step("pay", args={"n": i}) for i in range(50)])
    assert one(tmp_path, inv, small).verdict == "pass"


def test_a_guard_over_the_budget_is_indeterminate(tmp_path):
    traj = trajectory(*steps(2000))
    v = one(tmp_path, f'{{id: g, must_call: t1, when: "{TWO_DEEP}"}}', traj)
    assert v.verdict == "indeterminate" and budget_exceeded(v)


# ---- regexes ------------------------------------------------------------------------------


def test_a_catastrophic_regex_runs_in_linear_time(tmp_path):
    """Python's ``re`` took 18.4 s on a 29-character argument with this pattern; RE2 is linear."""
    inv = f"{{id: m, arg_matches: {{tool: q, arg: text, regex: '{CATASTROPHIC}'}}}}"
    for n in (29, 10_000, 1_000_000):
        traj = trajectory(step("q", args={"text": "a" * n + "!"}))
        v, took = timed(lambda: one(tmp_path, inv, traj))  # noqa: B023
        print(f"{CATASTROPHIC} on {n + 1} characters: {v.verdict} in {took * 1000:.2f} ms")
        assert v.verdict == "fail" and took < 1.0
    assert one(tmp_path, inv, trajectory(step("q", args={"text": "ab cd ef"}))).verdict == "pass"


@pytest.mark.parametrize(
    ("regex", "why"),
    [(r"(a)\1", "invalid escape sequence"), (r"foo(?=bar)", "invalid perl operator"),
     (r"(?<!x)y", "invalid perl operator"), ("a{5000}", "invalid repetition size")],
)  # fmt: skip
def test_check_policy_refuses_what_re2_cannot_compile_with_the_line(tmp_path, regex, why):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "policy: b\ninvariants:\n  - {id: a, must_call: x}\n  - id: m\n    arg_matches:\n      tool: x\n"
        f"      arg: y\n      regex: '{regex}'\n"
    )
    result = CliRunner().invoke(cli, ["check-policy", str(bad)])
    assert result.exit_code == 2, result.output
    assert f"{bad}:8: regex {regex!r} does not compile with RE2: {why}" in result.output


def test_re2_search_semantics_as_before(tmp_path):
    inv = r"{id: m, arg_matches: {tool: send, arg: to, regex: '@example\.com$'}}"
    assert one(tmp_path, inv, trajectory(step("send", args={"to": "a@example.com"}))).verdict == "pass"
    assert one(tmp_path, inv, trajectory(step("send", args={"to": "a@example.com.evil"}))).verdict == "fail"
    assert one(tmp_path, inv, trajectory(step("send", args={"to": "ünï@example.com"}))).verdict == "pass"


@pytest.mark.parametrize("pattern", ["invoice-*", "a?c", "[!x]yz", "[]a]b", "x[", "a.b*", "*", "[^a]", "[a-c]*"])
def test_applies_to_globs_match_as_fnmatch(pattern):
    regex = Regex(glob_regex(pattern))
    for name in ["invoice-1", "invoice-", "abc", "ayz", "xyz", "]b", "ab", "x[", "a.bzz", "aXb", "", "^", "b",
                 "line\nbreak", "cab"]:  # fmt: skip
        assert regex.found(name) == fnmatch.fnmatchcase(name, pattern), (pattern, name)


PATTERNS = [r"@example\.com$", r"^a", r"\Ab\z", r"é+", r"[^a-z]", r"(x|y)z?", r"", r"\d{2,}", r"^$", r"."]


@given(st.sampled_from(PATTERNS), st.text(max_size=12))
def test_found_says_what_the_library_search_says(pattern, text):
    """``Regex.found`` asks RE2 for the match directly; on any text (non-ASCII, empty, line
    breaks) it says what the library's ``search`` says, and so does its fallback."""
    expected = re2.compile(pattern).search(text) is not None
    regex = Regex(pattern)
    assert regex.found(text) == expected
    assert regex._match is not None  # the direct path is the one measured
    regex._match = None
    assert regex.found(text) == expected


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3) | st.binary(max_size=2),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=2), inner, max_size=5)
    | st.tuples(inner, inner),
    max_leaves=40,
)


def _values_and_largest(value: object) -> tuple[int, int]:
    """What converting ``value`` into CEL costs, counted plainly: every value, nested or not,
    and the length of the biggest list or map."""
    if isinstance(value, dict):
        inner = [_values_and_largest(v) for v in value.values()]
    elif isinstance(value, list | tuple):
        inner = [_values_and_largest(v) for v in value]
    else:
        return 1, 0
    return 1 + sum(n for n, _ in inner), max([len(value), *(big for _, big in inner)])


@given(values, st.integers(1, 60))
def test_the_cost_of_converting_a_value_is_its_count_of_values_or_the_limit(value, limit):
    values_, largest = _values_and_largest(value)
    if values_ <= limit:
        assert measure(value, limit) == (values_, largest)
    else:  # past the limit, the worst is assumed
        n, big = measure(value, limit)
        assert n == limit and big >= limit
