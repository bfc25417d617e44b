"""Relative paths in the processor config resolve against the config file's directory (as
Prometheus does for rule_files), flags against the working directory; and the example config
runs as written, from another directory, as ``otel-plumb run`` does it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_live_support import agent_provider, run_agent, start_cli

from otel_plumb.configtypes import resolve_paths
from otel_plumb.processor.config import ProcessorConfig, load_config

ROOT = Path(__file__).resolve().parent.parent

EVERY_PATH = """\
receivers:
  grpc:
    tls: {cert_file: tls/s.crt, key_file: tls/s.key, client_ca_file: tls/ca.crt}
    auth:
      bearer_tokens: [{token_file: secrets/grpc-token}, {token: not-a-path}]
  http:
    tls: {cert_file: /abs/s.crt, key_file: ../up/s.key}
    auth: {bearer_tokens: [{token_file: secrets/http-token}]}
policies: [policies/a.yaml, ./policies/../b.yaml, /etc/otel-plumb/c.yaml]
exporters:
  otlp:
    endpoint: grpcs://backend:4317
    state_dir: state
    dead_letter_file: state/dead.otlp
    tls: {ca_file: tls/backend-ca.crt, cert_file: tls/c.crt, key_file: tls/c.key}
metrics:
  endpoint: 127.0.0.1:9464
  tls: {cert_file: tls/m.crt, key_file: tls/m.key}
  auth: {bearer_tokens: [{token_file: secrets/scrape}]}
verdict_log: {path: out/verdicts.jsonl}
"""


def _write(where: Path) -> Path:
    where.mkdir(parents=True)
    (where / "c.yaml").write_text(EVERY_PATH)
    return where / "c.yaml"


def _paths(cfg: ProcessorConfig) -> dict[str, str | None]:
    grpc, http, metrics, otlp = cfg.receivers.grpc, cfg.receivers.http, cfg.metrics, cfg.exporters.otlp
    assert grpc.tls and grpc.auth and http.tls and http.auth and metrics.tls and metrics.auth and otlp and otlp.tls
    return {
        "grpc.cert": grpc.tls.cert_file, "grpc.key": grpc.tls.key_file, "grpc.ca": grpc.tls.client_ca_file,
        "grpc.token": grpc.auth.bearer_tokens[0].token_file, "http.cert": http.tls.cert_file,
        "http.key": http.tls.key_file, "http.token": http.auth.bearer_tokens[0].token_file,
        "policy.a": cfg.policies[0], "policy.b": cfg.policies[1], "policy.c": cfg.policies[2],
        "state_dir": otlp.state_dir, "dead_letter": otlp.dead_letter_file, "export.ca": otlp.tls.ca_file,
        "export.cert": otlp.tls.cert_file, "export.key": otlp.tls.key_file, "metrics.cert": metrics.tls.cert_file,
        "metrics.key": metrics.tls.key_file, "metrics.token": metrics.auth.bearer_tokens[0].token_file,
        "verdict_log": cfg.verdict_log.path,
    }  # fmt: skip


EXPECTED = {
    "grpc.cert": "conf/tls/s.crt", "grpc.key": "conf/tls/s.key", "grpc.ca": "conf/tls/ca.crt",
    "grpc.token": "conf/secrets/grpc-token", "http.cert": "/abs/s.crt", "http.key": "up/s.key",
    "http.token": "conf/secrets/http-token", "policy.a": "conf/policies/a.yaml", "policy.b": "conf/b.yaml",
    "policy.c": "/etc/otel-plumb/c.yaml", "state_dir": "conf/state", "dead_letter": "conf/state/dead.otlp",
    "export.ca": "conf/tls/backend-ca.crt", "export.cert": "conf/tls/c.crt", "export.key": "conf/tls/c.key",
    "metrics.cert": "conf/tls/m.crt", "metrics.key": "conf/tls/m.key", "metrics.token": "conf/secrets/scrape",
    "verdict_log": "conf/out/verdicts.jsonl",
}  # fmt: skip


def test_every_relative_path_resolves_against_the_config_files_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "conf")
    elsewhere = tmp_path / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    expected = {k: v if v.startswith("/") else str(tmp_path / v) for k, v in EXPECTED.items()}
    assert _paths(load_config(path)) == expected
    # Named relative to the working directory, the file's paths stay correct from there.
    relative = load_config(os.path.relpath(path))
    assert {k: str((elsewhere / v).resolve()) if v else v for k, v in _paths(relative).items()} == expected
    # A token given inline is a token, not a path.
    assert relative.receivers.grpc.auth and relative.receivers.grpc.auth.bearer_tokens[1].token == "not-a-path"


def test_flags_are_relative_to_the_working_directory(tmp_path: Path) -> None:
    path = _write(tmp_path / "conf")
    cfg = load_config(path, {"verdict_log.path": "here.jsonl", "policies": ["p.yaml"]})
    assert cfg.verdict_log.path == "here.jsonl"
    assert cfg.policies == ["p.yaml"]
    assert cfg.exporters.otlp and cfg.exporters.otlp.state_dir == str(tmp_path / "conf" / "state")


def test_errors_keep_their_lines_after_resolution(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("verdict_log:\n  path: v.jsonl\n  rotate: true\npolicies: [1, [x]]\n")
    with pytest.raises(ValueError) as err:
        load_config(path)
    assert f"{path}:3: verdict_log.rotate: unknown key" in str(err.value)
    assert f"{path}:4: policies.1: " in str(err.value)


_SEGMENT = st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..")
)


@given(base=st.lists(_SEGMENT, max_size=3), relative=st.lists(_SEGMENT, min_size=1, max_size=4))
def test_resolution_joins_relative_paths_and_keeps_absolute_ones(base: list[str], relative: list[str]) -> None:
    base_dir = os.path.join("/srv", *base)
    rel = os.path.join(*relative)
    data = {"policies": [rel, "/" + rel], "verdict_log": {"path": rel}, "metrics": {"endpoint": rel}}
    resolved = resolve_paths(ProcessorConfig, data, base_dir)
    assert resolved["policies"] == [os.path.join(base_dir, rel), "/" + rel]
    assert resolved["verdict_log"]["path"] == os.path.join(base_dir, rel)
    assert resolved["metrics"]["endpoint"] == rel  # not a path
    assert data["policies"][0] == rel  # the file's data is not changed in place


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


async def test_the_example_config_runs_as_written_from_another_directory(tmp_path: Path) -> None:
    """``otel-plumb run --config configs/otel-plumb.yaml`` with the file and its policies as
    in the repository (copied, so the run writes under tmp_path), from an unrelated working
    directory, with no environment variable of its own; only the ports come from flags, so
    the test cannot collide with anything listening on the example's."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "configs" / "policies", repo / "configs" / "policies")
    shutil.copy(ROOT / "configs" / "otel-plumb.yaml", repo / "configs" / "otel-plumb.yaml")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("BACKEND_TOKEN", "PLUMB_TOKEN")}
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg")
    args = ["--config", "../repo/configs/otel-plumb.yaml",
            "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]  # fmt: skip
    proc, ports, log = await asyncio.to_thread(start_cli, args, env, None, cwd)
    try:
        deadline = time.monotonic() + 20
        while not await asyncio.to_thread(_healthy, ports["metrics"]):
            assert proc.poll() is None, "".join(log)
            assert time.monotonic() < deadline, "no /healthz within 20 s:\n" + "".join(log)
            await asyncio.sleep(0.05)
        # The verdict log (../.otel-plumb/verdicts.jsonl in the file) lands beside configs/.
        agent, _ = agent_provider(ports["grpc"])
        await asyncio.to_thread(run_agent, agent)
        verdicts = repo / ".otel-plumb" / "verdicts.jsonl"
        while not (verdicts.exists() and verdicts.read_text().strip()):
            assert proc.poll() is None, "".join(log)
            assert time.monotonic() < deadline + 30, "no verdict logged:\n" + "".join(log)
            await asyncio.sleep(0.05)
        record = json.loads(verdicts.read_text().splitlines()[0])
        assert {v["policy"] for v in record["verdicts"]} == {"ap-controls"}  # configs/policies/ap.yaml's name
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
    assert code == 0, "".join(log)
    assert not (cwd / ".otel-plumb").exists() and list(cwd.iterdir()) == []
