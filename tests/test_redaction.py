"""Redaction of what the processor emits: the built-in patterns, the four actions, rules merged
from the global section and the policies, and (property) that no secret placed anywhere in a
trajectory survives into a record or a JSON, HTML or JUnit report while the verdicts stay those
of the unredacted run."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from otel_plumb.check import CompiledPolicy, decide, load_policy
from otel_plumb.check.errors import PolicyError
from otel_plumb.model import Decided, Step, Trajectory, Verdict
from otel_plumb.redact import Redaction, RedactionConfig, RedactionRules, Redactor
from otel_plumb.redact.patterns import luhn_ok
from otel_plumb.report import html, junit
from otel_plumb.report.json_report import build_report, report_body
from otel_plumb.report.records import decided_record

KEY = b"k" * 32


def redactor(**section: Any) -> Redactor:
    return Redactor([RedactionConfig.model_validate(section)], KEY)


def step(index: int, name: str, args: Any = None, result: Any = None, error: str | None = None) -> Step:
    return Step(
        index=index, kind="tool", name=name, span_id=f"{index:016x}", parent_span_id="f" * 16, trace_id="a" * 32,
        start_ns=index, end_ns=index + 1, convention="genai", args=args,
        args_status="captured" if args is not None else "absent", result=result,
        result_status="captured" if result is not None else "absent", error=error,
    )  # fmt: skip


def decided(*steps: Step, verdicts: list[Verdict] | None = None, policies: list[str] | None = None) -> Decided:
    t = Trajectory(key="a" * 32, trace_ids=["a" * 32], steps=list(steps))
    return Decided(t, verdicts or [], policies or [], "violating" if verdicts else "conformant")


def luhn_number(prefix: str, length: int) -> str:
    """A card number that passes the Luhn check (made here, not read from the program)."""
    for last in "0123456789":
        candidate = prefix + "7" * (length - len(prefix) - 1) + last
        if luhn_ok(candidate):
            return candidate
    raise AssertionError("unreachable")


# ---- built-in patterns -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("email", "jane.doe+billing@example.co.uk"),
        ("card_number", "4111 1111 1111 1111"),
        ("card_number", "5555-5555-5555-4444"),
        ("card_number", "378282246310005"),
        ("api_key", "sk-live-SECRET-42"),
        ("api_key", "AKIAIOSFODNN7EXAMPLE"),
        ("api_key", "ghp_" + "a1B2" * 9),
        ("bearer_token", "Bearer eyJhbGciOiJIUzI1NiJ9.abc"),
        ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.SflKxwRJSMeKKF2QT4fwpM"),
        ("us_ssn", "078-05-1120"),
    ],
)
def test_each_builtin_pattern_is_masked_inside_text(name: str, secret: str) -> None:
    r = redactor(patterns=[name]).scrub()
    out = r.text(f"customer wrote: {secret}; thanks")
    assert secret not in out
    assert out == f"customer wrote: [redacted:{name}]; thanks"


@pytest.mark.parametrize(
    "harmless",
    [
        "order 4111 1111 1111 1112 shipped",  # 16 digits failing the Luhn check
        "invoice INV-7001 for 4820.00 GBP",
        "ask@ or @home",
        "the sk- prefix alone",
    ],
)
def test_text_without_secrets_is_left_alone(harmless: str) -> None:
    r = redactor(patterns=["email", "card_number", "api_key", "bearer_token", "jwt", "us_ssn"]).scrub()
    assert r.text(harmless) == harmless


def test_a_pattern_of_ones_own_and_each_action() -> None:
    text = "ticket ACME-123456 and ACME-654321"
    assert redactor(patterns=[{"name": "ticket", "regex": r"ACME-\d{6}"}]).scrub().text(text) == (
        "ticket [redacted:ticket] and [redacted:ticket]"
    )
    assert redactor(patterns=[{"name": "ticket", "regex": r"ACME-\d{6}", "action": "drop"}]).scrub().text(text) == (
        "ticket  and "
    )
    cut = redactor(patterns=[{"name": "ticket", "regex": r"ACME-\d{6}", "action": {"truncate": 5}}]).scrub().text(text)
    assert cut == "ticket ACME-… [6 characters redacted] and ACME-… [6 characters redacted]"
    hashed = redactor(patterns=[{"name": "ticket", "regex": r"ACME-\d{6}", "action": "hash"}]).scrub().text(text)
    first, second = hashed.split(" and ")
    assert "123456" not in hashed and "654321" not in hashed
    assert first.removeprefix("ticket ") != second and second.startswith("[hmac:")


def test_hash_is_keyed_and_equal_values_stay_equal() -> None:
    section = RedactionConfig.model_validate({"patterns": [{"name": "email", "action": "hash"}]})
    a = Redactor([section], b"a" * 32).scrub()
    b = Redactor([section], b"b" * 32).scrub()
    assert a.text("x@example.com") == a.text("x@example.com") != a.text("y@example.com")
    assert a.text("x@example.com") != b.text("x@example.com")


# ---- paths -------------------------------------------------------------------------------------


def test_path_rules_replace_values_and_the_same_value_elsewhere() -> None:
    card = "CARDREF-99817"
    r = redactor(
        paths=[
            {"path": "card.number", "tools": ["refund"], "action": "hash"},
            {"path": "**.password", "action": "drop"},
            {"path": "items.*.ssn", "action": "mask"},
            {"path": "note", "in": ["result"], "action": {"truncate": 4}},
        ]
    )
    steps = [
        step(0, "refund", args={"card": {"number": card}, "auth": {"user": {"password": "hunter2!"}},
                                "items": [{"ssn": "A1"}, {"ssn": "B2"}]},
             result={"note": "refunded to card"}),
        step(1, "lookup", args={"card": {"number": "kept-here"}}, error=f"declined {card}"),
    ]  # fmt: skip
    v = Verdict("no-refund", "p", "fail", "high", 0, steps[0].span_id, f"refund to {card} refused", card, {"n": card})
    before = json.dumps(decided_record(decided(*steps, verdicts=[v])), sort_keys=True)
    out = r.decided(decided(*steps, verdicts=[v]))
    a0, a1 = out.trajectory.steps[0].args, out.trajectory.steps[1].args
    token = a0["card"]["number"]
    assert token.startswith("[hmac:") and card not in json.dumps(decided_record(out))
    assert a0["auth"] == {"user": {}}
    assert a0["items"] == [{"ssn": "[redacted:items.*.ssn]"}, {"ssn": "[redacted:items.*.ssn]"}]
    assert out.trajectory.steps[0].result == {"note": "refu… [12 characters redacted]"}
    assert a1 == {"card": {"number": "kept-here"}}  # another tool: the path rule names refund only
    assert out.trajectory.steps[1].error == f"declined {token}"
    assert out.verdicts[0].message == f"refund to {token} refused"
    assert out.verdicts[0].expected == token and out.verdicts[0].got == {"n": token}
    # The decision checked and handed on inside the process is untouched.
    assert json.dumps(decided_record(decided(*steps, verdicts=[v])), sort_keys=True) == before


def test_short_path_values_are_replaced_where_they_stand_only() -> None:
    r = redactor(paths=[{"path": "pin"}])
    v = Verdict("i", "p", "fail", "low", 0, None, "step 42 took 42 ms")
    out = r.decided(decided(step(0, "t", args={"pin": 42}), verdicts=[v]))
    assert out.trajectory.steps[0].args == {"pin": "[redacted:pin]"}
    assert out.verdicts[0].message == "step 42 took 42 ms"


def test_a_policy_adds_rules_for_its_trajectories_and_the_stricter_action_wins() -> None:
    global_rules = RedactionConfig.model_validate({"patterns": [{"name": "email", "action": "mask"}]})
    strict = RedactionRules.model_validate({"patterns": [{"name": "email", "action": "drop"}], "paths": ["x"][:0]})
    redaction = Redaction(global_rules, {"strict": strict, "plain": None}, KEY)
    text = "mail bob@example.com"
    d_plain = decided(step(0, "t", args={"m": text}), policies=["plain"])
    d_strict = decided(step(0, "t", args={"m": text}), policies=["plain", "strict"])
    assert redaction.decided(d_plain).trajectory.steps[0].args == {"m": "mail [redacted:email]"}
    assert redaction.decided(d_strict).trajectory.steps[0].args == {"m": "mail "}


def test_bad_sections_are_refused_with_what_is_wrong() -> None:
    with pytest.raises(ValidationError, match="no built-in pattern 'passport'"):
        RedactionConfig.model_validate({"patterns": ["passport"]})
    with pytest.raises(ValidationError, match="not RE2 syntax"):
        RedactionConfig.model_validate({"patterns": [{"name": "x", "regex": r"(a)\1"}]})
    with pytest.raises(ValidationError, match="extra"):
        RedactionConfig.model_validate({"paths": [{"path": "a", "acton": "mask"}]})
    with pytest.raises(ValidationError, match="empty segment"):
        RedactionConfig.model_validate({"paths": [{"path": "a..b"}]})


def test_a_policy_redaction_section_is_validated_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "policy: p\nredaction:\n  patterns:\n    - name: email\n      action: scramble\n"
        "invariants:\n  - {id: i, must_call: t}\n"
    )
    with pytest.raises(PolicyError) as exc:
        load_policy(path)
    assert exc.value.line in (4, 5)
    assert "action" in str(exc.value)


# ---- property: nothing secret is emitted, verdicts unchanged -----------------------------------

POLICY = """\
policy: refunds
redaction:
  patterns: [email, card_number, api_key, bearer_token]
  paths:
    - {path: card.number, action: hash}
    - {path: "**.password", action: drop}
invariants:
  - id: refund-to-known-card
    severity: critical
    arg_equals: {tool: refund, arg: card.number, step: {tool: lookup, result: card.number}}
  - id: no-notify-before-refund
    severity: high
    precedes: {first: refund, then: notify}
  - id: small-refunds
    severity: medium
    arg_satisfies: {tool: refund, expr: "args.amount < 100"}
  - id: note-no-keys
    severity: low
    arg_matches: {tool: notify, arg: note, regex: "^[a-z ]*$"}
"""


@pytest.fixture(scope="module")
def refund_policy(tmp_path_factory: pytest.TempPathFactory) -> CompiledPolicy:
    path = tmp_path_factory.mktemp("policy") / "refunds.yaml"
    path.write_text(POLICY)
    return load_policy(path)


def _secrets(rng: random.Random) -> dict[str, str]:
    n = rng.randrange(10**6, 10**7)
    return {
        "email": f"user{n}@example.com",
        "card": luhn_number(rng.choice(["4", "51", "37"]), rng.choice([15, 16])),
        "key": f"sk-live-{n:x}SECRET",
        "bearer": f"Bearer tok{n}abcdefgh",
        "path": f"CARDREF{n}",
        "password": f"pw{n}pw",
    }


@st.composite
def trajectories(draw: st.DrawFn) -> tuple[Trajectory, list[str]]:
    rng = random.Random(draw(st.integers(0, 2**32)))
    secrets = _secrets(rng)
    texts = list(secrets.values())[:4]

    def free_text() -> str:
        words = draw(st.lists(st.sampled_from(["refund", "for", "ok", *texts]), max_size=5))
        return " ".join(words)

    steps = []
    names = draw(st.lists(st.sampled_from(["lookup", "refund", "notify"]), min_size=1, max_size=6))
    for i, name in enumerate(names):
        card = secrets["path"] if draw(st.booleans()) else secrets["card"]
        args: dict[str, Any] = {
            "card": {"number": card},
            "amount": draw(st.integers(0, 200)),
            "note": free_text(),
            "auth": {"password": secrets["password"]},
            "history": [free_text() for _ in range(draw(st.integers(0, 2)))],
        }
        result = {"card": {"number": card}, "echo": free_text()} if name == "lookup" else free_text() or None
        error = free_text() or None if draw(st.booleans()) else None
        steps.append(step(i, name, args=args, result=result, error=error))
    return Trajectory(key="a" * 32, trace_ids=["a" * 32], steps=steps, problems=[free_text()]), list(secrets.values())


def _verdict_shape(d: Decided) -> list[tuple[Any, ...]]:
    return [(v.policy, v.invariant, v.verdict, v.severity, v.step_index, v.span_id) for v in d.verdicts]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trajectories())
def test_no_secret_reaches_any_report_and_verdicts_are_unchanged(
    refund_policy: CompiledPolicy, case: tuple[Trajectory, list[str]]
) -> None:
    trajectory, secrets = case
    redaction = Redaction(None, {refund_policy.name: refund_policy.redaction}, KEY)
    real = decide([refund_policy], trajectory)
    emitted = redaction.decided(real)
    assert emitted.status == real.status
    assert _verdict_shape(emitted) == _verdict_shape(real)
    report = build_report(report_body([refund_policy], [emitted]))
    outputs = {
        "record": json.dumps(decided_record(emitted), ensure_ascii=False),
        "json": json.dumps(report, ensure_ascii=False),
        "html": html.render(report),
        "junit": junit.render(report),
    }
    for where, text in outputs.items():
        for secret in secrets:
            assert secret not in text, f"{secret!r} in the {where} output"
    # The unredacted run does carry them (so the check above could fail).
    assert any(s in json.dumps(decided_record(real)) for s in secrets)
