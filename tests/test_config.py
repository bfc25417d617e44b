"""The processor config: defaults, errors with file/line/key, ${env:NAME}, and the run flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from otel_plumb.cli.run import run
from otel_plumb.processor import ConfigError, load_config
from otel_plumb.processor.config import exposure_errors


def test_no_file_gives_the_spec_defaults() -> None:
    cfg = load_config(None)
    assert cfg.receivers.grpc.endpoint == "127.0.0.1:4317"
    assert cfg.receivers.http.endpoint == "127.0.0.1:4318"
    assert cfg.metrics.endpoint == "127.0.0.1:9464"
    assert cfg.exporters.otlp is None
    assert cfg.receivers.max_message_mib == 16


CONFIGS = Path(__file__).resolve().parent.parent / "configs"
# The processor's configs are the YAML files at the top of configs/ (its folders hold Collector
# pipelines, policies, Prometheus rules, Grafana files, decision contracts).
EXAMPLES = sorted(CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_config_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKEND_TOKEN", "s3cret")
    monkeypatch.setenv("OTEL_PLUMB_TOKEN", "s3cret")
    cfg = load_config(path)
    assert exposure_errors(cfg) == []
    assert all(Path(p).is_absolute() or Path(p).exists() for p in cfg.policies)


def test_the_examples_are_all_there() -> None:
    assert {p.name for p in EXAMPLES} >= {"otel-plumb.yaml", "otel-plumb.production.yaml", "docker.yaml"}


def test_the_laptop_example_needs_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """No environment variable, no backend, loopback only, and its policies exist."""
    for name in ("BACKEND_TOKEN", "PLUMB_TOKEN", "OTEL_PLUMB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    cfg = load_config(CONFIGS / "otel-plumb.yaml")
    assert cfg.exporters.otlp is None
    for endpoint in (cfg.receivers.grpc.endpoint, cfg.receivers.http.endpoint, cfg.metrics.endpoint):
        assert endpoint.startswith("127.0.0.1:")
    assert [Path(p).resolve() for p in cfg.policies] == [CONFIGS / "policies" / "ap.yaml"]
    assert cfg.verdict_log.path is not None
    assert Path(cfg.verdict_log.path).resolve() == CONFIGS.parent / ".otel-plumb" / "verdicts.jsonl"
    assert cfg.assembly.idle_timeout == 2.0


def test_the_production_example_is_protected_and_absolute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKEND_TOKEN", "s3cret")
    cfg = load_config(CONFIGS / "otel-plumb.production.yaml")
    otlp = cfg.exporters.otlp
    assert otlp is not None and otlp.endpoint.startswith("grpcs://")
    assert otlp.headers["authorization"] == "Bearer s3cret"
    for listener in (cfg.receivers.grpc, cfg.receivers.http, cfg.metrics):
        assert listener.tls is not None and listener.auth is not None
        assert not listener.endpoint.startswith("127.")
    files = [*cfg.policies, otlp.state_dir, otlp.dead_letter_file, cfg.verdict_log.path]
    assert all(f is not None and Path(f).is_absolute() for f in files)


def test_unknown_key_names_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("receivers:\n  grpc:\n    endpoint: 127.0.0.1:4317\n    max_msg: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}:4: receivers.grpc.max_msg: unknown key"


def test_bad_values_name_their_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "assembly:\n  idle_timeout: soon\n"
        "exporters:\n  otlp:\n    endpoint: tcp://x:1\n"
        "receivers:\n  http: {endpoint: nowhere}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    lines = str(err.value).splitlines()
    assert any(line.startswith(f"{path}:2: assembly.idle_timeout: ") and "not a duration" in line for line in lines)
    assert any(line.startswith(f"{path}:5: exporters.otlp.endpoint: ") for line in lines)
    assert any(line.startswith(f"{path}:7: receivers.http.endpoint: ") for line in lines)


def test_durations_and_env_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLUMB_UNSET", raising=False)
    monkeypatch.setenv("PLUMB_PORT", "5317")
    path = tmp_path / "c.yaml"
    path.write_text(
        "assembly: {idle_timeout: 500ms, max_wait: 5m}\n"
        "receivers: {grpc: {endpoint: '127.0.0.1:${env:PLUMB_PORT}'},\n"
        "            http: {endpoint: '${env:PLUMB_UNSET:-0.0.0.0:4318}'}}\n"
        "verdict_log: {path: '/tmp/$${env:LITERAL}'}\n"
    )
    cfg = load_config(path)
    assert cfg.assembly.idle_timeout == 0.5 and cfg.assembly.max_wait == 300
    assert cfg.receivers.grpc.endpoint == "127.0.0.1:5317"
    assert cfg.receivers.http.endpoint == "0.0.0.0:4318"
    assert cfg.verdict_log.path == "/tmp/${env:LITERAL}"


def test_unset_env_variable_is_an_error_with_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLUMB_TOKEN", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text(
        "exporters:\n  otlp:\n    endpoint: grpc://127.0.0.1:4317\n    headers:\n      x: '${env:PLUMB_TOKEN}'\n"
    )
    with pytest.raises(ConfigError, match=rf"^{path}:5: environment variable PLUMB_TOKEN is not set"):
        load_config(path)


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("exporters:\n  otlp: {endpoint: 'grpc://127.0.0.1:1', mode: passthrough}\n")
    cfg = load_config(path, {"exporters.otlp.endpoint": "http://127.0.0.1:4318", "metrics.endpoint": ""})
    assert cfg.exporters.otlp is not None
    assert cfg.exporters.otlp.endpoint == "http://127.0.0.1:4318" and cfg.exporters.otlp.mode == "passthrough"
    assert cfg.metrics.endpoint == ""


def test_run_refuses_a_bad_config_or_policy_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("recievers: {}\n")
    result = CliRunner().invoke(run, ["--config", str(path)])
    assert result.exit_code == 2 and f"{path}:1: recievers: unknown key" in result.output
    policy = tmp_path / "p.yaml"
    policy.write_text("policy: p\ninvariants:\n  - {id: a, must_cal: x}\n")
    result = CliRunner().invoke(run, ["--policy", str(policy), "--grpc", "127.0.0.1:0"])
    assert result.exit_code == 2 and str(policy) in result.output
    result = CliRunner().invoke(run, ["--export-otlp", "ftp://x"])
    assert result.exit_code == 2 and "exporters.otlp.endpoint" in result.output


def test_json_logs_are_one_object_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import logging

    from otel_plumb.processor.config import LoggingConfig
    from otel_plumb.processor.logs import configure_logging

    configure_logging(LoggingConfig.model_validate({"level": "info", "json": True}))
    try:
        logging.getLogger("otel_plumb.processor").info("verdict: trace %s %s", "abc", "violating")
        logging.getLogger("otel_plumb.processor").debug("not shown at info")
    finally:
        logging.getLogger("otel_plumb").handlers.clear()
        logging.getLogger("otel_plumb").propagate = True
        logging.getLogger("otel_plumb").setLevel(logging.NOTSET)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["level"] == "info" and record["message"] == "verdict: trace abc violating"
    assert record["logger"] == "otel_plumb.processor" and record["time"].endswith("Z")
