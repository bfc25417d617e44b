"""The same DecGuard contracts run by ``decguard`` 0.1.1 itself and by otel-plumb: same contract
hash, same decisions, transformations, comparisons, gate statuses and rates. Only timings, our
added fields and our extra minimisations (monotonic) may differ."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner
from decguard.backends.base import DecisionBackend
from decguard.contracts import load_contract as dg_load_contract
from decguard.decisions import Prediction
from decguard.engine import run_test as dg_run_test
from decguard.errors import BackendTimeout
from decguard.fuzz.paraphrase import Paraphraser as DgParaphraser
from decguard.fuzz.replay import replay as dg_replay
from decguard.production.engine import run_check as dg_run_check
from decguard.regression.diff import load_and_diff as dg_diff
from decguard.reports.model import write_report as dg_write_report
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.cli.decision import decision
from otel_plumb.decision.contract import load_contract
from otel_plumb.decision.diff import diff_reports
from otel_plumb.decision.engine import run_contract
from otel_plumb.decision.production import run_check
from otel_plumb.decision.replay import replay_failures
from otel_plumb.decision.report import EXTENSION_KEYS, build_report, load_report, write_report

FIXTURES = Path(__file__).parent / "decision_fixtures"
CONTRACTS = ["triage_choice.yaml", "eligibility_noul.yaml", "severity_score.yaml"]
VOLATILE = {
    "created_at",
    "latency_ms",
    "mean_ms",
    "p50_ms",
    "p90_ms",
    "p95_ms",
    "p99_ms",
    "max_ms",
    "decguard_version",
    "latency_p50_ms",
    "latency_p95_ms",
    "source",
    "path",
}


def differences(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Where two JSON documents differ, ignoring timings, paths and the keys we add."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out = []
        for key in set(ours) | set(theirs):
            if key in EXTENSION_KEYS or key in VOLATILE:
                continue
            if key not in ours or key not in theirs:
                out.append(f"{path}.{key}: only in {'ours' if key in ours else 'decguard'}")
            else:
                out += differences(ours[key], theirs[key], f"{path}.{key}")
        return out
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return [f"{path}: {len(ours)} vs {len(theirs)} entries"]
        return [d for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) for d in differences(a, b, f"{path}.{i}")]
    if path.endswith(".message") and "latency" in str(ours):
        return []
    return [] if ours == theirs else [f"{path}: {ours!r} vs {theirs!r}"]


def ours_report(contract: Path, mode: str = "all") -> dict[str, Any]:
    return build_report(asyncio.run(run_contract(load_contract(contract), mode=mode)))


def theirs_report(contract: Path, mode: str = "all") -> dict[str, Any]:
    return json.loads(dg_run_test(contract, mode=mode).model_dump_json())


def without_monotonic_reductions(report: dict[str, Any]) -> dict[str, Any]:
    """Our minimiser also shrinks monotonic deltas; DecGuard does not minimise that property."""
    for summary in report["properties"]["summaries"]:
        if summary["property"] == "monotonic":
            summary["n_reduced"] = 0
    for pair in report["properties"]["pairs"]:
        if pair["property"] == "monotonic":
            pair["reduced"] = None
    return report


@pytest.mark.parametrize("name", CONTRACTS)
def test_same_contract_hash(name: str) -> None:
    assert load_contract(FIXTURES / name).hash == dg_load_contract(FIXTURES / name).hash


@pytest.mark.parametrize("name", CONTRACTS)
def test_same_report_as_decguard(name: str) -> None:
    ours = without_monotonic_reductions(ours_report(FIXTURES / name))
    theirs = theirs_report(FIXTURES / name)
    assert differences(ours, theirs) == []
    assert ours["status"] == theirs["status"] == "fail"
    # The contracts exercise what they are meant to: failures, minimisation, skips.
    props = ours["properties"]
    assert any(pair["violations"] for pair in props["pairs"])
    if name == "triage_choice.yaml":
        assert any(pair["reduced"] for pair in props["pairs"])


def test_noul_inversion_and_aliases_findings() -> None:
    report = ours_report(FIXTURES / "eligibility_noul.yaml")
    summaries = {s["property"]: s for s in report["properties"]["summaries"]}
    # The mock answers from rules: "is eligible" -> 0.9/0.1, negated -> 0.3/0.7 (inverted: 0.7/0.3).
    inversion = summaries["inversion"]
    assert inversion["n_evaluated"] == 4 and inversion["n_skipped"] == 1 and inversion["n_flips"] == 0
    assert inversion["max_tv_distance"] == pytest.approx(0.2)
    # The mock cannot read aliases (yes/no shown for eligible/ineligible): DecGuard records the
    # answers as invalid responses, and so do we.
    errored = [p for p in report["properties"]["pairs"] if p["property"] == "label_format" and p["error"]]
    assert errored and summaries["label_format"]["errors_by_kind"] == {"invalid_response": len(errored)}
    assert all("alias" in p["steps"][0] and p["error"]["kind"] == "invalid_response" for p in errored)
    checks = {c["gate"]: c["status"] for c in report["checks"]}
    assert checks["label_format.max_error_rate"] == "fail" and checks["inversion.max_flip_rate"] == "pass"
    skipped = [s for s in report["properties"]["skipped"] if s["property"] == "inversion"]
    assert skipped == [{"property": "inversion", "case_id": "n4", "reason": "no rewrite matches the text"}]


def test_score_monotonic_findings() -> None:
    report = ours_report(FIXTURES / "severity_score.yaml")
    mono = next(s for s in report["properties"]["summaries"] if s["property"] == "monotonic")
    assert mono["n_skipped"] == 1  # s5 has no affected_users
    assert mono["max_level_decrease"] is not None and mono["max_level_decrease"] > 0.05
    reduced = [p for p in report["properties"]["pairs"] if p["property"] == "monotonic" and p["reduced"]]
    assert reduced, "a smaller delta that still lowers the level is found"
    for pair in reduced:
        assert pair["reduced"]["steps"][0]["delta"] < pair["steps"][0]["delta"]
        assert pair["reduced"]["violations"]


def test_each_reads_the_others_report_and_diff_matches(tmp_path: Path) -> None:
    contract = FIXTURES / "triage_choice.yaml"
    theirs = dg_run_test(contract, mode="all")
    dg_write_report(theirs, tmp_path / "theirs.json")
    dg_write_report(dg_run_test(contract, mode="all", backend="fair"), tmp_path / "theirs_fair.json")
    ours = load_report(tmp_path / "theirs.json")  # a DecGuard report verifies in otel-plumb
    assert ours.data["status"] == "fail"
    mine = diff_reports(ours, load_report(tmp_path / "theirs_fair.json"), contract=load_contract(contract))
    reference = json.loads(
        dg_diff(tmp_path / "theirs.json", tmp_path / "theirs_fair.json", contract=contract).model_dump_json()
    )
    assert differences(mine, reference) == []
    assert mine["counts"]["answer_flips"] > 0 and mine["status"] == reference["status"]


def test_replay_matches_decguard(tmp_path: Path) -> None:
    contract = FIXTURES / "triage_choice.yaml"
    write_report(ours_report(contract), tmp_path / "ours.json")
    dg_write_report(dg_run_test(contract, mode="all"), tmp_path / "theirs.json")
    mine = asyncio.run(replay_failures(tmp_path / "ours.json"))
    reference = json.loads(dg_replay(tmp_path / "theirs.json").model_dump_json())
    assert differences(mine, reference) == []
    assert mine["status"] == "fail" and all(o["regenerated"] in (True, None) for o in mine["outcomes"])


def test_production_check_matches_decguard(tmp_path: Path) -> None:
    records = [
        {
            "id": f"r{i}",
            "decision": "ticket_route",
            "selected": sel,
            "outcome": out,
            "probabilities": probs,
            "metadata": {"channel": ch},
            "action": act,
            "latency_ms": 10.0 + i,
        }
        for i, (sel, out, probs, ch, act) in enumerate(
            [
                ("billing", "billing", {"billing": 0.8, "technical": 0.1, "account": 0.1}, "email", "accept"),
                ("technical", "account", {"billing": 0.2, "technical": 0.5, "account": 0.3}, "chat", "abstain"),
                ("account", "account", {"billing": 0.1, "technical": 0.2, "account": 0.7}, "chat", "accept"),
                ("billing", None, {"billing": 0.4, "technical": 0.35, "account": 0.25}, "email", "fallback"),
            ]
        )
    ]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    contract_text = (FIXTURES / "triage_choice.yaml").read_text() + (
        "production:\n  segments: [channel]\n  requirements: {min_accuracy: 0.9, max_fallback_rate: 0.5}\n"
        "  segment_warnings: {max_ece: 0.1}\n"
    )
    contract = tmp_path / "contract.yaml"
    contract.write_text(contract_text.replace("triage_paraphrases.jsonl", str(FIXTURES / "triage_paraphrases.jsonl")))
    mine = run_check(contract, dataset=tmp_path / "records.jsonl")
    reference = json.loads(dg_run_check(contract, dataset=tmp_path / "records.jsonl").model_dump_json())
    assert differences(mine, reference) == []
    assert mine["status"] == "fail" and len(mine["segments"]) == 2


def test_cli_exit_codes_match_decguard(tmp_path: Path) -> None:
    from decguard.cli import app
    from typer.testing import CliRunner as TyperRunner

    bad = tmp_path / "bad.yaml"
    bad.write_text((FIXTURES / "triage_choice.yaml").read_text().replace("min_accuracy", "min_acuracy"))
    cases = [
        ["validate", str(FIXTURES / "triage_choice.yaml")],
        ["test", str(FIXTURES / "triage_choice.yaml")],
        ["test", str(FIXTURES / "triage_choice.yaml"), "-b", "fair", "--no-healthcheck"],
        ["test", str(FIXTURES / "triage_choice.yaml"), "--fail-on-warn"],
        ["fuzz", str(FIXTURES / "severity_score.yaml"), "-p", "whitespace", "--seed", "3"],
        ["fuzz", str(FIXTURES / "severity_score.yaml"), "-p", "option_order"],
        ["validate", str(bad)],
        ["test", str(FIXTURES / "missing.yaml")],
        ["test"],
    ]
    for args in cases:
        ours = CliRunner().invoke(decision, args)
        theirs = TyperRunner().invoke(app, args)
        assert ours.exit_code == theirs.exit_code, (args, ours.output, theirs.output)
    assert "min_acuracy (line" in CliRunner().invoke(decision, ["validate", str(bad)]).output
    # DecGuard accepts a seed past 2**63 and writes a report it then refuses to load; we refuse the seed.
    big = ["fuzz", str(FIXTURES / "severity_score.yaml"), "-p", "whitespace", "--seed", str(2**64)]
    assert CliRunner().invoke(decision, big).exit_code == 2
    assert TyperRunner().invoke(app, [*big, "-o", str(tmp_path / "big.json")]).exit_code in (0, 1)
    assert TyperRunner().invoke(app, ["report", str(tmp_path / "big.json")]).exit_code == 2


def test_run_applies_the_policy_like_decguard(tmp_path: Path) -> None:
    from decguard.cli import app
    from typer.testing import CliRunner as TyperRunner

    doc = (
        (FIXTURES / "triage_choice.yaml")
        .read_text()
        .replace("triage_paraphrases.jsonl", str(FIXTURES / "triage_paraphrases.jsonl"))
    )
    doc += (
        "policy:\n  routes:\n    - {when: {confidence_gte: 0.75}, action: accept}\n"
        "    - {when: {confidence_gte: 0.5}, action: fallback, backend: fair}\n    - {action: human_review}\n"
    )
    contract = tmp_path / "policy.yaml"
    contract.write_text(doc)
    for text in ("My invoice is wrong", "Password reset please", "Something else entirely"):
        ours = CliRunner().invoke(decision, ["run", str(contract), text, "-f", "json"])
        theirs = TyperRunner().invoke(app, ["run", str(contract), text, "-f", "json"])
        assert ours.exit_code == theirs.exit_code == 0
        assert differences(json.loads(ours.output), json.loads(theirs.output)) == []
    assert CliRunner().invoke(decision, ["run", str(FIXTURES / "severity_score.yaml"), "x"]).exit_code == 2


def test_rejudge_and_diff_cli_match_decguard(tmp_path: Path) -> None:
    from decguard.cli import app
    from typer.testing import CliRunner as TyperRunner

    contract = FIXTURES / "triage_choice.yaml"
    dg_write_report(dg_run_test(contract, mode="all"), tmp_path / "base.json")
    dg_write_report(dg_run_test(contract, mode="all", backend="fair"), tmp_path / "cand.json")
    edited = tmp_path / "edited.yaml"
    edited.write_text(
        contract.read_text()
        .replace("max_tv_distance: 0.05\n    max_flip_rate: 0.1", "max_tv_distance: 0.5\n    max_flip_rate: 0.5")
        .replace("triage_paraphrases.jsonl", str(FIXTURES / "triage_paraphrases.jsonl"))
        .replace("triage_choice.jsonl", str(FIXTURES / "triage_choice.jsonl"))
    )
    for args in (
        ["report", str(tmp_path / "base.json"), "-c", str(edited), "-f", "json"],
        ["diff", str(tmp_path / "base.json"), str(tmp_path / "cand.json"), "-c", str(contract), "-f", "json"],
        ["diff", str(tmp_path / "base.json"), str(tmp_path / "cand.json"), "-s", "channel", "-f", "json"],
    ):
        ours = CliRunner().invoke(decision, args)
        theirs = TyperRunner().invoke(app, args)
        assert ours.exit_code == theirs.exit_code, (args, ours.output[-500:])
        assert differences(json.loads(ours.output), json.loads(theirs.output)) == [], args
    rejudged = json.loads(
        CliRunner().invoke(decision, ["report", str(tmp_path / "base.json"), "-c", str(edited), "-f", "json"]).output
    )
    option_order = {c["gate"]: c["status"] for c in rejudged["checks"]}
    assert option_order["option_order.max_flip_rate"] == "pass"


def test_production_baseline_matches_decguard(tmp_path: Path) -> None:
    from decguard.production.report import write_production_report

    def records(shift: float) -> str:
        rows = []
        for i in range(12):
            p = min(0.95, 0.5 + shift + 0.03 * (i % 5))
            probs = {"billing": p, "technical": (1 - p) / 2, "account": (1 - p) / 2}
            rows.append(
                {
                    "id": f"r{i}",
                    "decision": "ticket_route",
                    "probabilities": probs,
                    "selected": "billing",
                    "outcome": "billing" if i % 3 else "technical",
                    "timestamp": "2026-01-01T00:00:00Z",
                    "metadata": {"tier": i % 2 == 0},
                }
            )
        return "".join(json.dumps(r) + "\n" for r in rows)

    (tmp_path / "base.jsonl").write_text(records(0.0))
    (tmp_path / "now.jsonl").write_text(records(0.3))
    contract = tmp_path / "c.yaml"
    contract.write_text(
        (FIXTURES / "triage_choice.yaml")
        .read_text()
        .replace("triage_paraphrases.jsonl", str(FIXTURES / "triage_paraphrases.jsonl"))
        + "production:\n  segments: [tier]\n  requirements: {max_confidence_tv_distance: 0.2, max_ece_increase: 0.5}\n"
    )
    dg_base = dg_run_check(contract, dataset=tmp_path / "base.jsonl")
    write_production_report(dg_base, tmp_path / "base_report.json")
    for baseline in (tmp_path / "base.jsonl", tmp_path / "base_report.json"):
        mine = run_check(contract, dataset=tmp_path / "now.jsonl", baseline=baseline)
        reference = json.loads(
            dg_run_check(contract, dataset=tmp_path / "now.jsonl", baseline=baseline).model_dump_json()
        )
        assert differences(mine, reference) == []
        assert mine["drift"]["confidence_tv_distance"] is not None and mine["status"] == "fail"


class KeywordPlugin(DecisionBackend):
    """A backend written for DecGuard: favours the option whose name appears in the text."""

    provider = "keyword"

    @classmethod
    def from_config(cls, config: Any, *, name: str, decision: Any) -> KeywordPlugin:
        return cls(name=name, model=config.model or "kw")

    def predict(self, request: Any) -> Prediction:
        text = str(request.input).casefold()
        if "timeout" in text:
            raise BackendTimeout("slow")
        labels = request.decision.labels
        hits = [1.0 if label.strip('"[]').casefold() in text else 0.1 for label in labels]
        return Prediction(probabilities={label: h / sum(hits) for label, h in zip(labels, hits, strict=True)})


class ShoutingParaphraser(DgParaphraser):
    """A paraphraser written for DecGuard."""

    provider = "shout"

    @classmethod
    def from_config(cls, source: Any, *, base_dir: Path) -> ShoutingParaphraser:
        return cls()

    def paraphrase(self, text: str, *, case_id: str, n: int, seed: int) -> list[str]:
        return [text.upper() + "!"]


def test_decguard_plugins_run_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    import decguard.backends.registry as dg_registry
    import decguard.fuzz.paraphrase as dg_paraphrase

    import otel_plumb.decision.backends as our_registry
    import otel_plumb.decision.paraphrase as our_paraphrase

    entries = {
        ("decguard.backends", "keyword"): EntryPoint("keyword", f"{__name__}:KeywordPlugin", "decguard.backends"),
        ("decguard.paraphrasers", "shout"): EntryPoint(
            "shout", f"{__name__}:ShoutingParaphraser", "decguard.paraphrasers"
        ),
    }

    def entry_points(*, group: str, name: str | None = None) -> list[EntryPoint]:
        return [e for (g, n), e in entries.items() if g == group and name in (None, n)]

    for module in (dg_registry, dg_paraphrase, our_registry, our_paraphrase):
        monkeypatch.setattr(module, "entry_points", entry_points)
    (tmp_path / "cases.jsonl").write_text(
        "".join(
            json.dumps({"id": f"k{i}", "input": t, "expected": e}) + "\n"
            for i, (t, e) in enumerate(
                [
                    ("billing problem", "billing"),
                    ("technical issue", "technical"),
                    ("timeout here", "account"),
                    ("my account", "account"),
                ]
            )
        )
    )
    contract = tmp_path / "c.yaml"
    contract.write_text(
        'schema_version: "0.1"\ndecision: {type: choice, name: route, options: [billing, technical, account]}\n'
        "backend: {provider: keyword}\ndataset: cases.jsonl\nrequirements: {max_error_rate: 0.3}\n"
        "properties:\n  label_format: {styles: [quoted, bracketed], max_tv_distance: 0}\n"
        "  paraphrase: {source: {provider: shout}, max_tv_distance: 0.5}\n"
    )
    ours = ours_report(contract)
    theirs = theirs_report(contract)
    assert differences(ours, theirs) == []
    assert ours["metrics"]["counts"]["errors_by_kind"] == {"timeout": 1} and ours["backend"]["provider"] == "keyword"
    assert next(p["input"] for p in ours["properties"]["pairs"] if p["property"] == "paraphrase") == "BILLING PROBLEM!"


async def _systemone(request: web.Request) -> web.Response:
    """A stand-in System One server: answers depend on the state and on the criteria order."""
    body = await request.json()
    ((name, question),) = body["questions"].items()
    text = json.dumps(body["state"], sort_keys=True)
    weight = (sum(map(ord, text)) % 7) / 10
    if question["type"] == "noul":
        answer: dict[str, Any] = {"type": "noul", "noul": 0.2 if "not" in text else 0.3 + weight}
    else:
        options = list(question["criteria"])
        raw = [1.0 + (2.0 if i == 0 else 0.0) + weight * i for i in range(len(options))]
        probs = [r / sum(raw) for r in raw]
        if question["type"] == "choice":
            best = options[max(range(len(options)), key=probs.__getitem__)]
            answer = {"type": "choice", "choice": best, "probabilities": dict(zip(options, probs, strict=True))}
        else:
            answer = {
                "type": "score",
                "probabilities": {str(i): p for i, p in enumerate(probs)},
                "legend": {str(i): level for i, level in enumerate(options)},
            }
    return web.json_response(
        {"model": "jev-1", "id": "req-1", "answers": {name: answer}, "usage": {"input_tokens": 3, "cost": 0.1}}
    )


SYSTEMONE_CONTRACTS = {
    "choice": (
        "decision: {type: choice, name: route, description: Route it., options: [billing, technical, account]}\n"
        "properties:\n  option_order: {max_tv_distance: 0.05}\n  label_format: {styles: [upper], max_tv_distance: 0}\n",
        [("My invoice", "billing"), ("App crash", "technical")],
    ),
    "noul": (
        "decision: {type: noul, name: ok, description: Is it eligible, labels: [eligible, ineligible]}\n"
        "properties:\n  inversion: {rewrites: [{find: ' is ', replace: ' is not '}], max_flip_rate: 0}\n",
        [("This is fine", "eligible"), ("It is late", "ineligible")],
    ),
    "score": (
        "decision: {type: score, name: sev, description: How bad is it, levels: [1, 2, 3]}\nfuzz: {text_field: t}\n"
        "properties:\n  monotonic: {field: n, deltas: [5], max_flip_rate: 0}\n",
        [({"t": "down", "n": 3}, "3"), ({"t": "slow", "n": 1}, "1")],
    ),
}


@pytest.mark.parametrize("kind", sorted(SYSTEMONE_CONTRACTS))
async def test_systemone_backend_matches_decguard(tmp_path: Path, kind: str) -> None:
    from aiohttp.test_utils import TestServer

    app = web.Application()
    app.router.add_post("/v1/systemone", _systemone)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        text, cases = SYSTEMONE_CONTRACTS[kind]
        (tmp_path / "cases.jsonl").write_text(
            "".join(
                json.dumps({"id": f"s{i}", "input": inp, "expected": exp}) + "\n" for i, (inp, exp) in enumerate(cases)
            )
        )
        contract = tmp_path / "c.yaml"
        contract.write_text(
            f'schema_version: "0.1"\n{text}dataset: cases.jsonl\n'
            f"backend: {{provider: systemone, model: jev, url: '{server.make_url('/v1/systemone')}'}}\n"
        )
        ours = build_report(await run_contract(load_contract(contract), mode="all"))
        theirs = json.loads((await asyncio.to_thread(dg_run_test, contract, mode="all")).model_dump_json())
    finally:
        await server.close()
    assert differences(without_monotonic_reductions(ours), theirs) == []
    assert ours["metrics"]["counts"]["errored"] == 0 and ours["backend"]["details"]["served_models"] == ["jev-1"]
    assert ours["results"][0]["result"]["metadata"]["usage"] == {"input_tokens": 3, "cost": 0.1}


def test_decguard_format_reports_load_in_decguard(tmp_path: Path) -> None:
    from decguard.reports.model import load_report as dg_load_report

    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        decision, ["test", "--all", str(FIXTURES / "triage_choice.yaml"), "--decguard-format", "-o", str(out)]
    )
    assert result.exit_code == 1
    theirs = dg_load_report(out)
    assert theirs.status.value == "fail" and load_report(out).data["status"] == "fail"
    assert "flip_interval" not in out.read_text()
    assert CliRunner().invoke(decision, ["report", str(out), "--decguard-format", "-f", "json"]).exit_code == 1
    contract = tmp_path / "c.yaml"
    contract.write_text(
        (FIXTURES / "severity_score.yaml")
        .read_text()
        .replace("max_flip_rate: 0\n", "max_flip_rate: 0\n    max_flip_rate_upper: 0.5\n")
        .replace("severity_score.json", str(FIXTURES / "severity_score.json"))
    )
    refused = CliRunner().invoke(decision, ["fuzz", str(contract), "--decguard-format"])
    assert refused.exit_code == 2 and "max_flip_rate_upper" in refused.output


WORDS = st.text(alphabet="abcdefgh ij.!?\n\té", min_size=0, max_size=40)


@settings(max_examples=15, deadline=None)
@given(
    kind=st.sampled_from(["choice", "noul", "score"]),
    labels=st.lists(st.text(alphabet="abcxyzAB", min_size=1, max_size=6), min_size=2, max_size=8, unique=True),
    texts=st.lists(WORDS, min_size=1, max_size=5),
    seed=st.integers(0, 2**40),
    bias=st.sampled_from([0.0, 0.25, 1.0]),
    props=st.sets(
        st.sampled_from(
            ["option_order", "label_format", "irrelevant_context", "repeated_context", "whitespace", "paraphrase"]
        ),
        min_size=1,
    ),
)
def test_random_contracts_agree_with_decguard(
    tmp_path_factory: pytest.TempPathFactory,
    kind: str,
    labels: list[str],
    texts: list[str],
    seed: int,
    bias: float,
    props: set[str],
) -> None:
    folder = tmp_path_factory.mktemp("random")
    if kind == "noul":
        labels = labels[:2]
        props.add("inversion")
    if kind == "score":
        props.discard("option_order")
        props.add("monotonic")
    config = {
        "option_order": {"samples": 4, "max_tv_distance": 0.01, "max_flip_rate": 0.2},
        "label_format": {"samples": 3, "max_js_divergence": 0.001},
        "irrelevant_context": {"insertions": 2, "max_abs_delta": 0.05},
        "repeated_context": {"max_confidence_delta": 0.05, "level": "warning"},
        "whitespace": {"edits": 4, "max_tv_distance": 0.1},
        "paraphrase": {"max_tv_distance": 0.0},
        "inversion": {"rewrites": [{"find": "a", "replace": "not a"}], "max_flip_rate": 0},
        "monotonic": {"field": "n", "deltas": [1, 7], "max_level_decrease": 0.01, "max_flip_rate": 0},
    }
    decision_ = {"choice": {"options": labels}, "noul": {"labels": labels}, "score": {"levels": labels}}[kind]
    doc = {
        "schema_version": "0.1",
        "decision": {"type": kind, "name": "d", **decision_},
        "backend": {"provider": "mock", "seed": seed, "position_bias": bias},
        "dataset": "cases.json",
        "requirements": {"min_accuracy": 0.5},
        "properties": {name: config[name] for name in props},
        "fuzz": {"seed": seed, "text_field": "t", "max_minimize_calls": 5},
    }
    cases = [
        {"id": f"c{i}", "input": {"t": t, "n": i} if kind == "score" else t, "expected": labels[i % len(labels)]}
        for i, t in enumerate(texts)
    ]
    (folder / "cases.json").write_text(json.dumps(cases))
    (folder / "c.yaml").write_text(json.dumps(doc))
    ours = without_monotonic_reductions(ours_report(folder / "c.yaml"))
    theirs = theirs_report(folder / "c.yaml")
    assert differences(ours, theirs) == []
