#!/usr/bin/env bash
# Multi30k en->de end to end: prepare, train (GPU recommended), score test2016 with sacreBLEU.
# Usage: bash scripts/multi30k.sh [extra --set overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
MTX=${MTX:-.venv/bin/mtx}
$MTX prepare --config configs/multi30k.yaml "$@"
time $MTX train --config configs/multi30k.yaml "$@"
$MTX evaluate --config configs/multi30k.yaml "$@" --split test --json
