#!/usr/bin/env bash
# The test suite on a fresh machine (CPU only; GPU tests skip, Triton runs interpreted).
# Installs into the checkout's virtual environment first (scripts/install.sh: skipped when up
# to date), with the test, triton, fabric and plot extras; arguments go to pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
EXTRAS=${EXTRAS:-test,triton,fabric,plot} bash scripts/install.sh
VENV=${LIGHTNING_FULLGRAPH_VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}
exec "$VENV/bin/python" -m pytest -q "$@"
