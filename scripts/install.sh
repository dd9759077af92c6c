#!/usr/bin/env bash
# Installs lightning-fullgraph and what it needs on a fresh machine (idempotent).
# torch is pinned to the CPU build first: an unpinned requirement would pull CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
  "$PY" -m pip install --quiet "torch==$TORCH_VERSION"
fi
EXTRAS=${EXTRAS:-test}
# No build isolation: an isolated build env would resolve its own (CUDA) torch.
"$PY" -m pip install --quiet --no-build-isolation -e ".[$EXTRAS]"
