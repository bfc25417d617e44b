"""Arguments are what the tool was called with: framework call wrappers around them are taken
off, and a wrapper that cannot be taken off is never passed off as the arguments."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.model import SpanRecord
from otel_plumb.normalise import normalise

PARAMS = {"order_id": {"type": "string"}, "amount": {"type": "number"}, "currency": {"type": "string"}}
scalar = st.one_of(st.text(max_size=12), st.integers(-10**6, 10**6), st.booleans(),
                   st.floats(allow_nan=False, allow_infinity=False, width=32))  # fmt: skip
tool_args = st.dictionaries(st.sampled_from(sorted(PARAMS)), scalar, min_size=1)
# Keys a wrapper may add around the arguments: anything but the tool's own parameter names.
other_key = st.text(min_size=1, max_size=10).filter(lambda k: k not in PARAMS)


def known_wrappers(args: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.just({"args": [], "sanitize_inputs_outputs": True, "kwargs": args}),  # smolagents
        st.just({"kwargs": args}),
        st.just({"input_str": repr(args), "tags": ["seq:step:1"], "metadata": {"langgraph_node": "tools"}}),
        st.just({"input_str": json.dumps(args), "tags": [], "metadata": {}, "inputs": args}),
        st.just({"input": json.dumps(args)}),
    )


def any_wrapper(args: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Known wrappers, and arbitrary nestings of the arguments under keys that are not parameters."""
    return st.recursive(
        known_wrappers(args),
        lambda inner: st.one_of(
            st.dictionaries(other_key, scalar, max_size=3).flatmap(
                lambda extra: st.builds(lambda k, v: {**extra, k: v}, other_key, inner)
            ),
            st.lists(inner, min_size=1, max_size=2),
        ),
        max_leaves=4,
    )


def tool_span(input_value: str, *, schema: bool, scope: str = "openinference.instrumentation.smolagents") -> Any:
    attributes: dict[str, Any] = {"openinference.span.kind": "TOOL", "tool.name": "refund", "input.value": input_value}
    if schema:
        attributes["tool.parameters"] = json.dumps(PARAMS)
    return normalise(SpanRecord("a" * 32, "b" * 16, "c" * 16, "SimpleTool", attributes=attributes, scope_name=scope))


@settings(max_examples=300, deadline=None)
@given(tool_args.flatmap(lambda a: st.tuples(st.just(a), any_wrapper(a))))
def test_a_wrapper_of_any_shape_never_yields_arguments_that_are_not_the_tools_own(
    case: tuple[dict[str, Any], Any],
) -> None:
    args, wrapper = case
    out = tool_span(json.dumps(wrapper), schema=True)
    assert out.args_status != "captured" or out.args == args, (wrapper, out.args)


@settings(max_examples=200, deadline=None)
@given(tool_args.flatmap(lambda a: st.tuples(st.just(a), known_wrappers(a))))
def test_known_wrappers_are_taken_off_with_or_without_a_schema(case: tuple[dict[str, Any], Any]) -> None:
    args, wrapper = case
    for schema in (True, False):
        out = tool_span(json.dumps(wrapper), schema=schema, scope="openinference.instrumentation.langchain")
        assert out.args_status == "captured" and out.args == args, (wrapper, out.args)


def test_positional_arguments_without_names_are_undecodable() -> None:
    out = tool_span(json.dumps({"args": ["ORD-1", 4.0], "kwargs": {}}), schema=False)
    assert out.args_status == "undecodable" and out.args is None
    assert any("positional arguments without their names" in p for p in out.problems)


def test_real_arguments_named_like_wrapper_keys_are_kept_when_the_schema_names_them() -> None:
    params = {"args": {"type": "array"}, "kwargs": {"type": "object"}, "mode": {"type": "string"}}
    attributes = {"openinference.span.kind": "TOOL", "tool.name": "call", "tool.parameters": json.dumps(params),
                  "input.value": json.dumps({"args": [1], "kwargs": {"a": 1}, "mode": "x"})}  # fmt: skip
    out = normalise(SpanRecord("a" * 32, "b" * 16, "c" * 16, "call", attributes=attributes))
    assert out.args == {"args": [1], "kwargs": {"a": 1}, "mode": "x"}
