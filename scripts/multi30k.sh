#!/usr/bin/env bash
# Multi30k en->de end to end: fetch the corpus (once; needs the network), prepare, train (GPU
# recommended), score test2016 with sacreBLEU.
# Usage: bash scripts/multi30k.sh [extra --set overrides...]
# MTX: the mtx command (default: the project's .venv, installed by `make install` if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${MTX:-}" ]; then
  [ -x .venv/bin/mtx ] || make --no-print-directory install
  MTX=.venv/bin/mtx
fi
[ -f data/multi30k/train.en ] || $MTX fetch multi30k --output data/multi30k
$MTX prepare --config configs/multi30k.yaml "$@"
time $MTX train --config configs/multi30k.yaml "$@"
$MTX evaluate --config configs/multi30k.yaml "$@" --split test --json
