#!/usr/bin/env bash
# The main job on the embedded default: GCN on Cora, 4 processes, accuracy and traffic.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec lightning-fullgraph train --dataset cora --model gcn --devices 4 --epochs 200 "$@"
