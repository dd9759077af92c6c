#!/usr/bin/env bash
# The main job on the embedded default: GCN on Cora, one process per CPU core (at most 4; pass
# --devices N for another number), accuracy and traffic.
# Installs into the checkout's virtual environment first (scripts/install.sh: skipped when up
# to date); arguments are added to `lightning-fullgraph train` (see --help).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
VENV=${LIGHTNING_FULLGRAPH_VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
exec "$VENV/bin/lightning-fullgraph" train --dataset cora --model gcn --epochs 200 "$@"
