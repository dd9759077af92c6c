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

# The internals each release is reached for: PyG's (MessagePassing hooks and inspector, the
# gcn_norm router under dynamo and TorchScript, the engine's exchange on 2 gloo ranks) and
# Lightning's (strategy arguments, launchers, signal connector, RNG states, data sources,
# Fabric's CLI, a Trainer fit on Cora on 2 ranks). About 1 min each on 2 busy cores once the
# C++ kernels are built (the main suite builds them first; a first build waits here).
PYG_TESTS=(tests/test_compat.py tests/kernels/test_gcn.py tests/kernels/test_dynamo.py
           tests/kernels/test_torchscript.py
           "tests/engine/test_exactness.py::test_partitioned_equals_single_process[2-hybrid]")
LIGHTNING_TESTS=(tests/test_compat.py tests/strategies/test_arguments.py
                 tests/strategies/test_isolation.py tests/test_fabric.py
                 "tests/strategies/test_fullgraph.py::test_trainer_matches_single_process[2-auto-sage-automatic]")

# Called as `run ... || status=$?`, where bash ignores `set -e`: every step checks its own
# status, so a failed download fails the run instead of testing the environment's releases.
run() {  # run NAME PACKAGE REQUIREMENT TESTS...
  local name=$1 package=$2 requirement=$3
  shift 3
  local dir="$CACHE/$name"
  if [ ! -f "$dir/.installed" ] || [ "$(cat "$dir/.installed")" != "$requirement" ]; then
    rm -rf "$dir" && mkdir -p "$dir" || return 1
    "$PY" -m pip install --quiet --no-deps --target "$dir" "$requirement" || {
      echo "[smoke] could not install $requirement into $dir" >&2; rm -rf "$dir"; return 1; }
    echo "$requirement" > "$dir/.installed" || return 1
  fi
  # The package must be imported from $dir, in the required range (not the environment's).
  PYTHONPATH="$dir" "$PY" - "$package" "$requirement" "$dir" <<'PYEOF' || return 1
import importlib, sys
from packaging.requirements import Requirement
package, requirement, where = sys.argv[1:]
module = importlib.import_module(package)
version = module.__version__
print(f"[smoke] {requirement}: {package} {version} from {module.__file__}", flush=True)
if not module.__file__.startswith(where) or version not in Requirement(requirement).specifier:
    sys.exit(f"[smoke] {package} {version} is not {requirement} from {where}")
PYEOF
  PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q -p no:cacheprovider --durations=5 "$@"
}

status=0
run pyg-2.7 torch_geometric "torch_geometric>=2.7,<2.8" "${PYG_TESTS[@]}" || status=$?
run lightning-2.5 lightning "lightning>=2.5,<2.6" "${LIGHTNING_TESTS[@]}" || status=$?
exit "$status"
