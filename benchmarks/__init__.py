"""Investigations behind BENCHMARKS.md's figures, run from a checkout as modules (this folder
is not installed): `python -m benchmarks.reference` (training against torch's own
nn.Transformer), `python -m benchmarks.architectures` (each architecture variant trained and
scored), `python -m benchmarks.per_update` (how much mtx learns per update, beside fairseq),
`python -m benchmarks.gpu_report` (every GPU measurement in one call; the recipe of a GPU call
is scripts/gpu_report.sh), `python -m benchmarks.page` (`mtx serve`'s page in a real browser),
and the others docs/benchmarks.md lists.

They use the harness of the benchmarks that `mtx bench` runs (mtx/bench/harness.py).
BENCHMARKS.md holds the current figure of each, with its command and machine.
"""
