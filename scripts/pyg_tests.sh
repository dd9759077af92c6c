#!/usr/bin/env bash
# PyG's own layer tests, with this library's kernels off and then switched on globally.
#
#   bash scripts/pyg_tests.sh PYG_CHECKOUT [pytest args...]
#
# PYG_CHECKOUT: a clone of https://github.com/pyg-team/pytorch_geometric at the release the
# environment has installed (PyG's tests are not in its sdist, so CI, which reaches only the
# package registries, cannot fetch them). Runs test/nn/conv and test/nn/models of that
# checkout against the installed torch_geometric twice: as they are, and with K.use("cpp")
# before every test (scripts/pyg_kernels_on.py; PYG_KERNELS=torch|triton picks another
# backend). Exits non-zero when either run fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYG=${1:?usage: bash scripts/pyg_tests.sh PYG_CHECKOUT [pytest args...]}
shift
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -d "$PYG/test/nn/conv" ] || { echo "$PYG has no test/nn/conv: not a PyG checkout" >&2; exit 2; }
cd "$PYG"
status=0
echo "== PyG's tests, kernels off" >&2
"$PY" -m pytest -q -p no:cacheprovider test/nn/conv test/nn/models "$@" || status=1
echo "== PyG's tests, kernels on (K.use(\"${PYG_KERNELS:-cpp}\") before every test)" >&2
PYTHONPATH="$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}" \
  "$PY" -m pytest -q -p no:cacheprovider -p pyg_kernels_on test/nn/conv test/nn/models "$@" \
  || status=1
exit $status
