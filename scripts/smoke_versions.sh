#!/usr/bin/env bash
# A smoke subset of the tests against the oldest tested minor releases of PyG and Lightning
# (lightning_fullgraph.compat.TESTED_VERSIONS; the full suite runs on the newest).
# Each older release is installed without dependencies into its own directory under
# ~/.cache/lightning_fullgraph/versions/ (kept between runs) and put in front of the
# environment's packages with PYTHONPATH; torch and everything else stay as installed.
# scripts/test.sh runs this under CI (LIGHTNING_FULLGRAPH_CI=1).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VENV=${LIGHTNING_FULLGRAPH_VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
PY="$VENV/bin/python"
CACHE=${LIGHTNING_FULLGRAPH_VERSIONS_DIR:-$HOME/.cache/lightning_fullgraph/versions}
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}

# With PyG 2.7 the first model traced by dynamo or TorchScript, and a Trainer's start, take
# about 70 s more (tests/kernels/test_dynamo.py, test_torchscript.py and the Trainer fit pass
# too): left out of CI's time.
PYG_TESTS=(tests/test_compat.py tests/kernels/test_gcn.py
           "tests/engine/test_exactness.py::test_partitioned_equals_single_process[2-hybrid]")
LIGHTNING_TESTS=(tests/test_compat.py tests/strategies/test_arguments.py
                 tests/strategies/test_isolation.py tests/test_fabric.py
                 "tests/strategies/test_fullgraph.py::test_trainer_matches_single_process[2-auto-sage-automatic]")

run() {  # run NAME REQUIREMENT TESTS...
  local name=$1 requirement=$2
  shift 2
  local dir="$CACHE/$name"
  if [ ! -f "$dir/.installed" ] || [ "$(cat "$dir/.installed")" != "$requirement" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    "$PY" -m pip install --quiet --no-deps --target "$dir" "$requirement"
    echo "$requirement" > "$dir/.installed"
  fi
  echo "[smoke] $requirement: $(PYTHONPATH="$dir" "$PY" -c \
    'import torch_geometric, lightning; print("torch_geometric", torch_geometric.__version__, "lightning", lightning.__version__)')"
  PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q -p no:cacheprovider "$@"
}

status=0
run pyg-2.7 "torch_geometric>=2.7,<2.8" "${PYG_TESTS[@]}" || status=$?
run lightning-2.5 "lightning>=2.5,<2.6" "${LIGHTNING_TESTS[@]}" || status=$?
exit "$status"
