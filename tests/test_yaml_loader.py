"""One YAML loader for every file kind (processor config, policies and context files, campaigns,
decision contracts): the same rules and line-accurate errors everywhere."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from otel_plumb import yamlfile
from otel_plumb.campaign.config import CampaignError, load_campaign
from otel_plumb.check import PolicyError, load_policy
from otel_plumb.check.checks import Run
from otel_plumb.cli.main import cli
from otel_plumb.decision.contract import ContractError, load_contract
from otel_plumb.model.trajectory import Step, Trajectory
from otel_plumb.processor.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "accounts_payable"

POLICY = "policy: p\ninvariants:\n  - {id: ok, must_call: a}\n"
CONFIG = "receivers:\n  grpc: {endpoint: '127.0.0.1:4317'}\nassembly:\n  idle_timeout: 2s\n"
CONTRACT = (
    "schema_version: '0.1'\ndecision:\n  type: choice\n  name: route\n"
    "  options: [billing, technical]\nbackend: {provider: mock}\n"
)


def campaign_text(tmp_path: Path) -> str:
    (tmp_path / "ap.yaml").write_text((EXAMPLE / "ap.yaml").read_text())
    (tmp_path / "cases.jsonl").write_text('{"id": "c1", "input": "hello", "context": {}}\n')
    return ("campaign: t\nseed: 42\ndataset: cases.jsonl\npolicies: [ap.yaml]\n"
            "arms:\n  a: {python: {callable: 'agent:run_naive'}}\ntraces: {receiver: embedded}\n")  # fmt: skip


def bomb(levels: int = 9) -> str:
    """Billion laughs: 9 levels of 9 aliases each, 10^9 strings once expanded."""
    out = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    prev = "a"
    for i in range(levels):
        name = chr(ord("b") + i)
        out += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
        prev = name
    return out


def load_kind(kind: str, tmp_path: Path, text: str) -> Any:
    """Write ``text`` as a file of ``kind`` and load it with that kind's loader."""
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    loaders: dict[str, Callable[[Path], Any]] = {
        "policy": load_policy, "config": load_config, "campaign": load_campaign, "contract": load_contract,
    }  # fmt: skip
    return loaders[kind](path)


ERRORS = (PolicyError, ConfigError, CampaignError, ContractError)
KINDS = ["policy", "config", "campaign", "contract"]


def valid(kind: str, tmp_path: Path) -> str:
    return {"policy": POLICY, "config": CONFIG, "campaign": campaign_text(tmp_path), "contract": CONTRACT}[kind]


def line_of(exc: Exception) -> int | None:
    """The line an error names, whichever kind of file raised it."""
    line = getattr(exc, "line", None)
    if line is not None:
        return int(line)
    text = str(exc)
    import re

    m = re.search(r"\.yaml:(\d+):", text) or re.search(r"line (\d+)", text)
    return int(m.group(1)) if m else None


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_loads_its_valid_file(kind, tmp_path):
    load_kind(kind, tmp_path, valid(kind, tmp_path))


@pytest.mark.parametrize("kind", KINDS)
def test_duplicate_keys_are_refused_in_every_kind_with_the_line(kind, tmp_path):
    text = valid(kind, tmp_path)
    first = text.splitlines()[0]
    doubled = text + first + "\n"  # the first key again, on the last line
    with pytest.raises(ERRORS) as info:
        load_kind(kind, tmp_path, doubled)
    assert f"duplicate key {first.split(':')[0]!r}" in str(info.value)
    assert line_of(info.value) == doubled.count("\n"), str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_duplicate_nested_keys_are_refused_too(kind, tmp_path):
    text = valid(kind, tmp_path) + "extra:\n  x: 1\n  x: 2\n"
    n = text.count("\n")
    with pytest.raises(ERRORS) as info:
        load_kind(kind, tmp_path, text)
    assert "duplicate key 'x'" in str(info.value) and line_of(info.value) == n


def test_duplicate_keys_in_a_policy_context_file_are_refused(tmp_path):
    (tmp_path / "truth.yaml").write_text("INV-1: {amount: 1}\nINV-1: {amount: 2}\n")
    text = "policy: p\ntask: {attribute: invoice.id}\ncontext: {file: truth.yaml}\n" + POLICY.split("\n", 1)[1]
    with pytest.raises(PolicyError) as info:
        load_kind("policy", tmp_path, text)
    assert info.value.line == 3 and "truth.yaml' line 2: duplicate key 'INV-1'" in info.value.message


@pytest.mark.parametrize("kind", KINDS)
def test_billion_laughs_is_refused_fast_and_small_in_every_kind(kind, tmp_path):
    text = valid(kind, tmp_path) + bomb()
    start = time.perf_counter()
    with pytest.raises(ERRORS) as info:
        load_kind(kind, tmp_path, text)
    took = time.perf_counter() - start
    tracemalloc.start()
    try:
        with pytest.raises(ERRORS):
            load_kind(kind, tmp_path, text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"{kind}: billion laughs refused in {took * 1000:.0f} ms, peak {peak / 2**20:.1f} MiB: {info.value}")
    assert "aliases expand to more than" in str(info.value)
    assert took < 1.0 and peak < 32 * 2**20


def test_billion_laughs_in_a_context_file_and_through_check_policy(tmp_path):
    (tmp_path / "truth.yaml").write_text(bomb())
    bad = tmp_path / "p.yaml"
    bad.write_text("policy: p\ntask: {attribute: invoice.id}\ncontext: {file: truth.yaml}\n" + POLICY.split("\n", 1)[1])
    start = time.perf_counter()
    result = CliRunner().invoke(cli, ["check-policy", str(bad)])
    took = time.perf_counter() - start
    assert result.exit_code == 2 and "aliases expand to more than" in result.output and took < 2.0
    bad.write_text(POLICY + bomb())
    result = CliRunner().invoke(cli, ["check-policy", str(bad)])
    assert result.exit_code == 2 and f"{bad}:" in result.output and "aliases expand" in result.output


def test_merge_key_bombs_are_refused_too():
    text = "a: &a {x0: 1, x1: 2, x2: 3}\n"
    prev = "a"
    for i in range(20):
        name = f"m{i}"
        text += f"{name}: &{name} {{<<: [" + ",".join([f"*{prev}"] * 9) + "]}\n"
        prev = name
    start = time.perf_counter()
    with pytest.raises(yamlfile.YamlError, match="aliases expand"):
        yamlfile.parse(text)
    assert time.perf_counter() - start < 1.0


def test_a_few_aliases_are_fine():
    doc = yamlfile.parse("base: &b {a: 1}\nx: *b\ny: [*b, *b]\n")
    assert doc.data == {"base": {"a": 1}, "x": {"a": 1}, "y": [{"a": 1}, {"a": 1}]}


@pytest.mark.parametrize("kind", ["policy", "config", "campaign"])
def test_an_oversize_file_is_refused(kind, tmp_path):
    text = valid(kind, tmp_path) + "# " + "x" * (yamlfile.MAX_BYTES + 10) + "\n"
    start = time.perf_counter()
    with pytest.raises(ERRORS, match="larger than 10 MiB"):
        load_kind(kind, tmp_path, text)
    assert time.perf_counter() - start < 1.0


def test_an_oversize_contract_is_refused_at_its_own_limit(tmp_path):
    with pytest.raises(ContractError, match="larger than 1,000,000 bytes"):
        load_kind("contract", tmp_path, CONTRACT + "# " + "x" * 1_000_000 + "\n")


def test_deep_nesting_and_cycles_are_refused_with_a_clear_error():
    with pytest.raises(yamlfile.YamlError, match="nested too deeply"):
        yamlfile.parse("[" * 5000 + "]" * 5000)
    with pytest.raises(yamlfile.YamlError, match="nested too deeply"):
        yamlfile.parse("a: &a [*a]\n")


def test_only_plain_data():
    with pytest.raises(yamlfile.YamlError, match="unsupported tag"):
        yamlfile.parse("a: !!python/object/apply:os.system [echo]\n")
    with pytest.raises(yamlfile.YamlError, match="could not determine a constructor"):
        yamlfile.parse("a: !!python/name:os.system ''\n")
    with pytest.raises(yamlfile.YamlError, match="unsupported tag"):
        yamlfile.parse("a: !!set {x}\n")
    with pytest.raises(yamlfile.YamlError, match="a key must be a plain value"):
        yamlfile.parse("? [1]\n: 2\n")


def test_merge_keys_and_dates_one_way_in_every_kind(tmp_path):
    doc = yamlfile.parse("base: &b {a: 1, b: 2}\nx:\n  <<: *b\n  b: 3\nwhen: 2024-01-02\nat: 2024-01-02 10:00:00\n")
    assert doc.data["x"] == {"a": 1, "b": 3} and doc.data["when"] == "2024-01-02"
    assert doc.data["at"] == "2024-01-02T10:00:00"
    assert doc.lines[("x", "b")] == 4 and doc.lines[("x", "a")] == 1
    # A merge key in a processor config (the receivers share one anchor) ...
    cfg = tmp_path / "c.yaml"
    cfg.write_text("x-common: &common {enabled: false}\n")
    with pytest.raises(ConfigError, match="x-common: unknown key"):
        load_config(cfg)
    cfg.write_text("receivers:\n  grpc: &off {enabled: false}\n  http: {<<: *off, endpoint: '127.0.0.1:9'}\n")
    loaded = load_config(cfg)
    assert not loaded.receivers.http.enabled and loaded.receivers.http.endpoint == "127.0.0.1:9"
    # ... and a date where text is expected is that text, in a campaign as in a policy.
    camp = campaign_text(tmp_path).replace("campaign: t", "campaign: 2024-01-02")
    assert load_kind("campaign", tmp_path, camp).spec.campaign == "2024-01-02"
    pol = POLICY + "  - {id: d, arg_equals: {tool: a, arg: day, value: 2024-01-02}}\n"
    assert load_kind("policy", tmp_path, pol).invariants[1].check.expected(*_nowhere()) == ("2024-01-02", None)


def test_env_expansion_in_the_processor_config(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUMB_TEST_ENDPOINT", "127.0.0.1:5317")
    monkeypatch.setenv("PLUMB_TEST_LEVEL", "debug")
    monkeypatch.delenv("PLUMB_TEST_UNSET", raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "receivers:\n  grpc: {endpoint: '${env:PLUMB_TEST_ENDPOINT}'}\n"
        "  http: {endpoint: '${env:PLUMB_TEST_UNSET:-127.0.0.1:5318}'}\n"
        "logging: {level: '${env:PLUMB_TEST_LEVEL}'}\n"
        "exporters:\n  otlp:\n    endpoint: grpc://127.0.0.1:4317\n    headers: {x-literal: '$${env:NOT_EXPANDED}'}\n"
    )
    loaded = load_config(cfg)
    assert loaded.receivers.grpc.endpoint == "127.0.0.1:5317"
    assert loaded.receivers.http.endpoint == "127.0.0.1:5318"
    assert loaded.logging.level == "debug"
    assert loaded.exporters.otlp is not None
    assert loaded.exporters.otlp.headers == {"x-literal": "${env:NOT_EXPANDED}"}
    cfg.write_text("receivers:\n  grpc:\n    endpoint: '${env:PLUMB_TEST_UNSET}'\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:3: environment variable PLUMB_TEST_UNSET is not set"):
        load_config(cfg)
    # never in keys, and not in other file kinds
    cfg.write_text("${env:PLUMB_TEST_LEVEL}: {}\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(cfg)
    pol = POLICY + "  - {id: e, arg_equals: {tool: a, arg: x, value: '${env:PLUMB_TEST_LEVEL}'}}\n"
    assert load_kind("policy", tmp_path, pol).invariants[1].check.expected(*_nowhere())[0] == "${env:PLUMB_TEST_LEVEL}"


def _nowhere() -> tuple[Run, Step]:
    """A run and a step for an ``arg_equals`` whose expected value is a constant."""
    step = Step(0, "tool", "a", "s", None, "t", 0, 1, "test")
    return Run(Trajectory(key="t", trace_ids=["t"], steps=[step], complete=True), {}, complete=True), step


def test_an_empty_file_is_what_each_kind_says_it_is(tmp_path):
    assert load_kind("config", tmp_path, "") is not None  # defaults
    with pytest.raises(PolicyError, match="the file is empty"):
        load_kind("policy", tmp_path, "")
    with pytest.raises(CampaignError, match="a campaign file is a YAML mapping"):
        load_kind("campaign", tmp_path, "")
    with pytest.raises(ContractError, match="a contract must be a mapping"):
        load_kind("contract", tmp_path, "")


def test_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_bytes(POLICY.encode() + b"  - {id: x, must_call: \xff}\n")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.line == 4 and "not valid UTF-8" in info.value.message
