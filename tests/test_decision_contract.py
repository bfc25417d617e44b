"""Contract and dataset validation: strict keys named with file and line, cross-field rules,
the normalised hash (extensions left out while unset), and datasets where nothing is skipped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from decguard.contracts import contract_hash as dg_hash
from decguard.contracts import parse_contract as dg_parse_contract
from decguard.datasets import load_dataset as dg_load_dataset
from decguard.errors import DecGuardError
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_plumb.decision.contract import contract_hash, load_contract, parse_contract
from otel_plumb.decision.dataset import load_dataset
from otel_plumb.decision.errors import ContractError, DatasetError

BASE: dict[str, Any] = {
    "schema_version": "0.1",
    "decision": {"type": "choice", "name": "route", "options": ["billing", "technical"]},
    "backend": {"provider": "mock"},
}


def write(tmp_path: Path, doc: dict[str, Any] | str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"evaluation": {"calibration_bin": 5}}, "evaluation.calibration_bin (line 11): unknown field"),
        ({"properties": {"option_order": {"samples": 2}}}, "set at least one of max_tv_distance"),
        ({"properties": {"monotonic": {"field": "n"}}}, "properties.monotonic applies to score decisions, not choice"),
        (
            {"properties": {"inversion": {"rewrites": [{"find": "a", "replace": "b"}], "max_flip_rate": 0}}},
            "applies to noul decisions",
        ),
        ({"requirements": {"min_coverage": 0.5}}, "needs evaluation.confidence_threshold"),
        ({"requirements": {"max_ordinal_mae": 1}}, "only applies to score decisions"),
        ({"schema_version": 0.1}, "quote it in YAML"),
        ({"backends": {"default": {"provider": "mock"}}}, "reserved"),
        ({"policy": {"routes": [{"action": "fallback", "backend": "other"}]}}, "unknown backend 'other'"),
        ({"properties": {"label_format": {"aliases": {"refund": ["money"]}, "max_tv_distance": 0}}}, "unknown labels"),
    ],
)
def test_invalid_contracts_are_refused_with_the_field(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    path = write(tmp_path, {**BASE, **change})
    with pytest.raises(ContractError) as caught:
        load_contract(path)
    assert message in str(caught.value) and str(path) in str(caught.value)
    with pytest.raises(DecGuardError):  # DecGuard refuses the same documents
        dg_parse_contract({**BASE, **change})


def test_duplicate_keys_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="duplicate key"):
        load_contract(write(tmp_path, "schema_version: '0.1'\nschema_version: '0.1'\n"))
    with pytest.raises(ContractError, match="a contract must be a mapping"):
        load_contract(write(tmp_path, "- 1\n"))


def test_extensions_validate_and_stay_out_of_the_hash_while_unset(tmp_path: Path) -> None:
    doc = {**BASE, "properties": {"option_order": {"max_tv_distance": 0.1}}}
    plain = parse_contract(doc)
    assert contract_hash(plain) == dg_hash(dg_parse_contract(doc))
    extended = parse_contract(
        {**doc, "properties": {"option_order": {"max_flip_rate_upper": 0.2}}, "fuzz": {"original_samples": 3}}
    )
    assert extended.properties.option_order is not None
    assert contract_hash(extended) != contract_hash(plain)
    with pytest.raises(ContractError):
        parse_contract({**doc, "fuzz": {"original_samples": 0}})


def test_reformatting_does_not_change_the_hash(tmp_path: Path) -> None:
    a = load_contract(write(tmp_path, yaml.safe_dump(BASE, sort_keys=True)))
    (tmp_path / "c.json").write_text(json.dumps(BASE, indent=4))
    b = load_contract(tmp_path / "c.json")
    assert a.hash == b.hash


CASE = st.fixed_dictionaries(
    {"input": st.one_of(st.text(max_size=20), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))},
    optional={
        "id": st.text(min_size=1, max_size=6),
        "expected": st.sampled_from(["billing", "technical"]),
        "metadata": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
    },
)


@settings(max_examples=60, deadline=None)
@given(st.lists(CASE, max_size=6), st.booleans())
def test_dataset_loader_agrees_with_decguard(
    tmp_path_factory: pytest.TempPathFactory, rows: list[dict[str, Any]], as_json: bool
) -> None:
    folder = tmp_path_factory.mktemp("ds")
    path = folder / ("d.json" if as_json else "d.jsonl")
    path.write_text(json.dumps(rows) if as_json else "".join(json.dumps(r) + "\n" for r in rows))
    spec = parse_contract(BASE).spec()
    try:
        theirs = dg_load_dataset(path, dg_parse_contract(BASE).spec())
    except Exception:
        with pytest.raises(DatasetError):
            load_dataset(path, spec)
        return
    ours = load_dataset(path, spec)
    assert ours.hash == theirs.hash
    assert [(c.id, c.input, c.expected, c.metadata) for c in ours.cases] == [
        (c.id, c.input, c.expected, c.metadata) for c in theirs.cases
    ]


def test_dataset_errors_name_the_line(tmp_path: Path) -> None:
    spec = parse_contract(BASE).spec()
    path = tmp_path / "d.jsonl"
    path.write_text('{"id": "a", "input": "x"}\n{"id": "a", "input": "y"}\n')
    with pytest.raises(DatasetError, match="line 2: duplicate case id 'a'"):
        load_dataset(path, spec)
    path.write_text('{"id": "a", "input": "x", "expected": "refund"}\n')
    with pytest.raises(DatasetError, match="line 1: expected 'refund' is not one of the contract labels"):
        load_dataset(path, spec)
    path.write_text('{"id": "a", "input": "x", "extra": 1}\n')
    with pytest.raises(DatasetError, match="extra: unknown field"):
        load_dataset(path, spec)
    path.write_text("\n")
    with pytest.raises(DatasetError, match="no cases"):
        load_dataset(path, spec)


def test_shipped_triage_contract_validates_and_runs_on_its_mock_backend(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from otel_plumb.cli.decision import decision

    contract = Path(__file__).resolve().parent.parent / "configs" / "decisions" / "triage.yaml"
    validated = CliRunner().invoke(decision, ["validate", str(contract)])
    assert validated.exit_code == 0 and "default=openai, mock=mock" in validated.output
    out = tmp_path / "r.json"
    result = CliRunner().invoke(decision, ["test", "--all", "-b", "mock", str(contract), "-o", str(out)])
    assert result.exit_code == 1
    report = json.loads(out.read_text())
    option_order = report["properties"]["summaries"][0]
    assert option_order["property"] == "option_order" and option_order["n_flips"] > 0
