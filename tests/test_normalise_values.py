import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.model.placeholders import PLACEHOLDERS
from otel_plumb.normalise import decode, is_placeholder
from otel_plumb.normalise.values import _long_digit_run


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ('{"city": "Paris", "days": 3}', {"city": "Paris", "days": 3}),
        (json.dumps(json.dumps({"a": [1, 2]})), {"a": [1, 2]}),  # double-encoded
        (json.dumps(json.dumps(json.dumps({"a": 1}))), {"a": 1}),  # triple
        ("{'city': 'Paris', 'ok': True, 'n': None}", {"city": "Paris", "ok": True, "n": None}),  # Python repr
        ("[1, 'two']", [1, "two"]),
        ("Paris", "Paris"),  # plain strings are data as they are
        ('"Paris"', "Paris"),
        ('{"id": 123456789012345678901234567890}', {"id": 123456789012345678901234567890}),  # exact, not a float
        ("[-9223372036854775809]", [-9223372036854775809]),
        ('"{not json"', "{not json"),  # an inner string that merely starts with '{' stays a string
        ({"already": "a map"}, {"already": "a map"}),  # OTLP kvlist
        ([1, 2], [1, 2]),
        (7, 7),
        (b'{"a": 1}', {"a": 1}),
    ],
)
def test_decodable_values_are_captured(raw, value):
    d = decode(raw)
    assert d.status == "captured" and d.value == value and d.reason is None


@pytest.mark.parametrize(
    "raw", ["<REDACTED>", "[REDACTED]", "***", "********", " <redacted> ", '"<REDACTED>"', json.dumps('"***"')]
)
def test_placeholders_are_redacted_never_data(raw):
    d = decode(raw)
    assert d.status == "redacted" and d.value is None


@pytest.mark.parametrize("raw", ['{"city": "Par', "{city: Paris}", "[1, 2", "{'a': os.system('x')}"])
def test_garbage_is_undecodable_with_a_reason(raw):
    d = decode(raw)
    assert d.status == "undecodable" and d.value is None and d.reason


def test_absent_and_non_utf8_bytes():
    assert decode(None).status == "absent"
    assert decode("   ").status == "absent"
    d = decode(b"\xff\xfe{")
    assert d.status == "undecodable" and "UTF-8" in (d.reason or "")


def test_every_listed_placeholder_is_recognised_in_any_case():
    assert all(is_placeholder(p) and is_placeholder(p.upper()) and is_placeholder(f" {p} ") for p in PLACEHOLDERS)


def test_placeholder_detection_is_exact():
    assert is_placeholder("[REDACTED]") and is_placeholder("***")
    assert not is_placeholder("redacted data follows") and not is_placeholder("**") and not is_placeholder("")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(st.lists(json_values, max_size=4) | st.dictionaries(st.text(max_size=8), json_values, max_size=4))
def test_json_containers_round_trip_once_or_twice_encoded(value):
    # Bare JSON scalars ("3", "true") are kept as the strings they are: only objects and arrays are unwrapped.
    for encoded in (json.dumps(value), json.dumps(json.dumps(value))):
        d = decode(encoded)
        assert d.status == "captured" and d.value == value


@given(st.one_of(st.text(), st.binary(), json_values))
def test_decode_never_raises(raw):
    d = decode(raw)
    assert d.status in ("captured", "absent", "redacted", "undecodable")
    assert (d.reason is not None) == (d.status in ("redacted", "undecodable"))


digit_texts = st.lists(
    st.sampled_from([b"1", b"9", b"0", b"x", b".", b",", b"{", b" "])
    | st.binary(max_size=4)
    | st.integers(0, 10**25).map(lambda n: str(n).encode()),
    max_size=30,
).map(b"".join)


@given(digit_texts)
def test_a_long_digit_run_is_found_exactly_when_there_is_one(data):
    # The look at the bytes, for texts of many short values (orjson would make an integer
    # beyond 64 bits a float).
    assert _long_digit_run(data) == (re.search(rb"[0-9]{19}", data) is not None)


@pytest.mark.parametrize(
    "raw",
    [
        "[1234567890, 1234567890, 123456789012345678]",  # 38 digits, no run of 19: orjson's path
        '{"id": 1234567890123456789}',  # a run of 19: json's path, exact
        '{"ids": [9' + "0" * 40 + ", 7]}",
        '{"a": {"b": [-9223372036854775809]}}',  # one below the smallest 64-bit integer
        "[18446744073709551615, 18446744073709551616]",  # the largest unsigned 64-bit integer, and one more
        "[1e19, 2.5]",  # large floats written as floats
        "[" + "1, " * 2000 + "1" * 25 + "]",  # the last of many short values: its bytes are looked at
        '{"rows": [' + '{"n": 1.5}, ' * 600 + '{"n": ' + "7" * 30 + "}]}",
        '[{"text": "' + "x" * 400 + '", "n": ' + "7" * 30 + "}]",  # few values in many bytes: walked
        "[0.0012345678901234567, 0.13436424411240122]",  # long fractions: orjson's floats, as json's
    ],
    ids=["no-run", "run-of-19", "run-of-41", "below-int64", "beyond-uint64", "floats", "long-array", "many-rows",
         "long-text", "fractions"],
)
def test_integers_decode_exactly_whichever_parser_reads_them(raw):
    d = decode(raw)
    assert d.status == "captured" and d.value == json.loads(raw)
    assert [type(v) for v in _scalars(d.value)] == [type(v) for v in _scalars(json.loads(raw))]


def _scalars(value):
    if isinstance(value, dict):
        return [s for v in value.values() for s in _scalars(v)]
    if isinstance(value, list):
        return [s for v in value for s in _scalars(v)]
    return [value]


@settings(max_examples=200)
@given(
    st.recursive(
        st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=3), inner, max_size=6),
        max_leaves=40,
    ),
    st.integers(0, 1200),
)
def test_json_numbers_decode_as_json_reads_them(value, padding):
    # Behind up to 1,200 other values, in a list of its own: looked for in the value, or in the
    # bytes when the values are many and short.
    raw = json.dumps([[0] * padding, value])
    d = decode(raw)
    assert d.status == "captured"
    assert d.value == json.loads(raw)
    assert [type(v) for v in _scalars(d.value)] == [type(v) for v in _scalars(json.loads(raw))]


# Arguments inside a call wrapper whose text cannot be read: the wrapper is never passed off as
# the arguments (a check on `to` would fail on "no argument to"); the verdict is indeterminate.
# A tool span as the Langfuse SDK records it (tests/fixtures/conventions/langfuse.jsonl).
def _langfuse_tool(input_value):
    from otel_plumb.model import SpanRecord
    from otel_plumb.normalise import normalise

    attributes = {"langfuse.observation.type": "tool", "langfuse.observation.input": input_value}
    return normalise(SpanRecord("a" * 32, "b" * 16, "c" * 16, "send_email", attributes=attributes,
                                scope_name="langfuse-sdk"))  # fmt: skip


@pytest.mark.parametrize(
    ("inner", "status"),
    [
        ("<REDACTED>", "redacted"),
        ("***", "redacted"),
        (json.dumps("<REDACTED>"), "redacted"),
        ('{"to": "a@example.com", "bo', "undecodable"),  # inner JSON cut off
        ('[{"to": "a@example.com"', "undecodable"),
        ("{to: a@example.com}", "undecodable"),
    ],
)
def test_a_wrapped_input_that_cannot_be_read_is_not_passed_off_as_the_arguments(inner, status, tmp_path):
    from otel_plumb.assemble import build_trajectory
    from otel_plumb.check import load_policy
    from otel_plumb.normalise.values import unwrap_call

    d = unwrap_call({"input": inner})
    assert d is not None and d.status == status and d.value is None and d.reason
    out = _langfuse_tool(json.dumps({"input": inner}))
    assert out.args_status == status and out.args is None
    assert status != "undecodable" or any("call wrapper" in p for p in out.problems)

    policy = tmp_path / "p.yaml"
    policy.write_text(
        "policy: t\ninvariants:\n"
        "  - {id: m, arg_matches: {tool: send_email, arg: to, regex: '@example\\.com$'}}\n"
        "  - {id: e, arg_equals: {tool: send_email, arg: to, value: b@example.com}}\n"
    )
    verdicts = load_policy(policy).evaluate(build_trajectory("a" * 32, [out]))
    assert [v.verdict for v in verdicts] == ["indeterminate", "indeterminate"], [v.message for v in verdicts]


@pytest.mark.parametrize(
    ("wrapped", "args"),
    [
        ({"input": "Paris"}, {"input": "Paris"}),  # plain text: kept, it may be the one argument
        ({"input": json.dumps({"to": "a@example.com"})}, {"to": "a@example.com"}),
        ({"input": {"to": "a@example.com"}}, {"input": {"to": "a@example.com"}}),  # a mapping: no wrapper
    ],
)
def test_a_wrapped_input_that_can_be_read_is_unchanged(wrapped, args):
    out = _langfuse_tool(json.dumps(wrapped))
    assert out.args_status == "captured" and out.args == args


@pytest.mark.parametrize(
    "wrapped",
    [
        {"args": ["<REDACTED>"], "kwargs": {}},
        {"args": [], "kwargs": "<REDACTED>"},
        {"args": "[REDACTED]"},
        {"input_str": "<REDACTED>", "tags": [], "metadata": {}},
    ],
)
def test_a_call_wrapper_holding_only_placeholders_is_redacted(wrapped):
    from otel_plumb.normalise.values import unwrap_call

    d = unwrap_call(wrapped)
    assert d is not None and d.status == "redacted" and d.value is None
