#!/usr/bin/env bash
# The test suite on a fresh machine (CPU only; GPU tests skip, Triton runs interpreted).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test,triton bash scripts/install.sh
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}
exec python3 -m pytest -q "$@"
