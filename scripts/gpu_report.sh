#!/usr/bin/env bash
# The GPU report on a lent GPU machine, in one call (benchmarks/gpu_report.py: every GPU
# measurement of BENCHMARKS.md, under 9 minutes). The machine has torch but not `datasets`,
# and the data do not travel with the checkout, so prepare both here first and carry `.whl`
# and `.gpu` (data/multi30k: `mtx fetch multi30k`):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 -d .whl datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
#   mkdir -p .gpu/multi30k && cp data/multi30k/*.{en,de} .gpu/multi30k/
#
# then run there, from the repository root:   bash scripts/gpu_report.sh $OUT [--minutes 3] ...
# (the checkout itself is on the path: mtx and benchmarks need no installing).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu_report.sh OUT [gpu_report options]}
shift
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -m benchmarks.gpu_report --data .gpu/multi30k --out "$OUT" --work /tmp/gw "$@"
