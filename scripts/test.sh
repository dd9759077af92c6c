#!/usr/bin/env bash
# The test suite on a fresh machine (CPU only; GPU tests skip, Triton runs interpreted).
# Installs into the checkout's virtual environment first (scripts/install.sh: skipped when up
# to date), with the test, triton, fabric, plot and docs extras.
#
# Without arguments: the suite on TEST_WORKERS pytest-xdist workers (default 2; one test file
# per worker at a time), then the tests marked `serial` (they measure time or wait for
# timeouts) alone. With arguments: one plain pytest run of exactly those.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
EXTRAS=${EXTRAS:-test,triton,fabric,plot,docs} bash scripts/install.sh
VENV=${LIGHTNING_FULLGRAPH_VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
PY="$VENV/bin/python"
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}
if [ $# -gt 0 ]; then
  exec "$PY" -m pytest -q "$@"
fi
WORKERS=${TEST_WORKERS:-2}
status=0
"$PY" -m pytest -q -n "$WORKERS" --dist loadfile -m "not serial" || status=$?
# pytest's 5: nothing collected (not a failure of the first part).
"$PY" -m pytest -q -m serial || { s=$?; [ "$s" -eq 5 ] || status=$s; }
# CI (which reaches the package registry): a smoke subset on the oldest tested PyG and
# Lightning releases as well.
if [ "${LIGHTNING_FULLGRAPH_CI:-0}" = "1" ]; then
  bash scripts/smoke_versions.sh || status=$?
fi
exit "$status"
