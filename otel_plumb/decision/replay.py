"""Replay stored property failures: re-send each failing transformed case exactly as stored
(input and option presentation) with its original, judge it again, and check that the stored
seed regenerates the same transformation from the contract alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from otel_plumb.decision import DECGUARD_COMPAT_VERSION
from otel_plumb.decision.backends import Backend, create_backend
from otel_plumb.decision.compare import compare, judge
from otel_plumb.decision.contract import LoadedContract, load_contract
from otel_plumb.decision.engine import Pair, decide_mutation, decide_safely
from otel_plumb.decision.errors import ContractError, ReportError
from otel_plumb.decision.model import Case, CaseError, Request, Result
from otel_plumb.decision.render import describe_example
from otel_plumb.decision.report import StoredReport, load_report
from otel_plumb.decision.rng import case_rng
from otel_plumb.decision.transforms import Mutation, NotApplicable, make_transform


def _select(stored: StoredReport, ids: Sequence[str] | None) -> list[Pair]:
    assert stored.run is not None
    pairs = stored.run.pairs
    if not ids:
        return [pair for pair in pairs if pair.failed()]
    by_id = {pair.id: pair for pair in pairs}
    missing = [i for i in ids if i not in by_id]
    if missing:
        hint = (
            f"ids look like '<property>/<case id>/<sample>', e.g. {pairs[0].id!r}" if pairs else "the report has none"
        )
        raise ReportError(f"no transformed case {missing[0]!r} in the report; {hint}")
    return [by_id[i] for i in ids]


async def _regenerated(pair: Pair, stored: StoredReport, loaded: LoadedContract, case: Case, prop: Any) -> bool | None:
    """None when the generator is not reproducible (paraphrases): the stored text is used."""
    assert stored.run is not None
    if pair.property == "paraphrase":
        return None
    transform = make_transform(pair.property, prop, loaded.contract.spec(), stored.run.fuzz)
    try:
        mutations = await transform.generate(case, case_rng(stored.run.seed, pair.property, case.id))
    except NotApplicable:
        return False
    if pair.sample >= len(mutations):
        return False
    m = mutations[pair.sample]
    return (list(m.steps), m.input, m.presentation) == (list(pair.steps), pair.input, pair.presentation)


def _example(
    kind: str,
    mutation: Mutation,
    stored_violations: Sequence[str],
    stored_error: CaseError | None,
    outcome: Any,
    original: Any,
    prop: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": kind,
        "input": mutation.input,
        "presentation": None if mutation.presentation is None else [list(p) for p in mutation.presentation],
        "stored_violations": list(stored_violations),
        "stored_error": stored_error.to_json() if stored_error else None,
        "result": None,
        "error": None,
        "comparison": None,
        "violations": [],
    }
    if isinstance(outcome, CaseError):
        out["error"] = outcome.to_json()
        out["reproduced"] = stored_error is not None and outcome.kind == stored_error.kind
        return out
    out["result"] = outcome.to_json()
    if stored_error is None and isinstance(original, Result):
        comparison = compare(original, outcome, prop)
        out["comparison"] = comparison.to_json()
        out["violations"] = judge(prop, comparison)
    out["reproduced"] = bool(out["violations"])
    return out


async def replay_failures(
    report: str | Path,
    *,
    ids: Sequence[str] | None = None,
    contract: str | Path | None = None,
    backend: str | Backend | None = None,
) -> dict[str, Any]:
    stored = load_report(report)
    if stored.run is None:
        raise ReportError(f"{report}: a '{stored.mode}' report has no property results to replay")
    loaded = load_contract(contract if contract is not None else stored.data["contract"]["path"])
    spec = loaded.contract.spec()
    if (spec.name, spec.type, spec.labels) != (stored.spec.name, stored.spec.type, stored.spec.labels):
        raise ReportError(f"contract {loaded.path} describes {spec.name!r}, but the report is for {stored.spec.name!r}")
    tolerance = loaded.contract.evaluation.probability_tolerance
    selected = _select(stored, ids)
    records = stored.records_by_id()
    if isinstance(backend, Backend):
        instance, owned = backend, False
    else:
        name = backend or stored.data["backend"]["name"]
        try:
            config = loaded.contract.backend_config(name)
        except ContractError as exc:
            raise ContractError(f"{exc}; pass --backend to choose one") from exc
        instance, owned = create_backend(config, decision=spec, name=name), True
    outcomes = []
    try:
        enabled = loaded.contract.properties.configured()
        for pair in selected:
            prop = enabled.get(pair.property) or getattr(stored.run.config, pair.property)
            case = records[pair.case_id].case
            original = await decide_safely(instance, Request(case.id, spec, case.input), tolerance)
            examples = [
                ("transformed", Mutation(pair.steps, pair.input, pair.presentation), pair.violations, pair.error)
            ]
            if pair.reduced is not None:
                r = pair.reduced
                examples.append(("reduced", Mutation(r.steps, r.input, r.presentation), r.violations, None))
            replayed = []
            for kind, mutation, violations, error in examples:
                outcome = await decide_mutation(instance, spec, pair.id, mutation, tolerance)
                replayed.append(_example(kind, mutation, violations, error, outcome, original, prop))
            outcomes.append(
                {
                    "id": pair.id,
                    "property": pair.property,
                    "case_id": pair.case_id,
                    "regenerated": await _regenerated(pair, stored, loaded, case, prop),
                    "original": original.to_json() if isinstance(original, Result) else None,
                    "original_error": original.to_json() if isinstance(original, CaseError) else None,
                    "examples": replayed,
                    "reproduced": any(e["reproduced"] for e in replayed),
                }
            )
        info = instance.info().to_json()
    finally:
        if owned:
            await instance.aclose()
    status = "fail" if any(o["reproduced"] for o in outcomes) else "pass"
    return {
        "replay_version": "0.1",
        "decguard_version": DECGUARD_COMPAT_VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": str(report),
        "contract_path": str(loaded.path),
        "contract_hash": loaded.hash,
        "contract_changed": loaded.hash != stored.data["contract"]["hash"],
        "backend": info,
        "status": status,
        "exit_code": 1 if status == "fail" else 0,
        "outcomes": outcomes,
    }


def render_replay(report: Mapping[str, Any]) -> str:
    lines = [
        f"otel-plumb decision · replay {report['source']} · {len(report['outcomes'])} case(s)",
        f"  backend   {report['backend']['name']}: {report['backend']['provider']}",
        f"  contract  {report['contract_path']}"
        + ("  (changed since the report was made)" if report["contract_changed"] else ""),
    ]
    if not report["outcomes"]:
        lines += ["", "Nothing to replay: the report has no property failures."]
    for o in report["outcomes"]:
        regen = {True: "yes", False: "NO", None: "n/a (stored text used)"}[o["regenerated"]]
        lines += [
            "",
            f"  {o['id']}: {'REPRODUCED' if o['reproduced'] else 'not reproduced'} · regenerated from seed: {regen}",
        ]
        if o["original_error"] is not None:
            lines.append(f"    original errored: {o['original_error']['message']}")
        for e in o["examples"]:
            lines.append(f"    {e['kind']}: {describe_example(e['presentation'], e['input'])}")
            if e["error"] is not None:
                lines.append(f"      error: {e['error']['kind']}: {e['error']['message']}")
            elif e["stored_error"] is not None:
                lines.append(f"      holds now (stored error: {e['stored_error']['kind']})")
            else:
                lines.append(f"      {'; '.join(e['violations'])}" if e["violations"] else "      holds now")
    lines += [
        "",
        "FAIL: at least one failure reproduced" if report["status"] == "fail" else "PASS: no failure reproduced",
    ]
    return "\n".join(lines)
