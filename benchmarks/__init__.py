"""mtx's benchmark suite: one harness (harness.py) and the benchmarks that use it.

    mtx bench train ...     train.py      training tokens/s, model FLOPs, MFU, peak memory
    mtx bench decode ...    decode.py     decoding speed against Hugging Face and CTranslate2
    mtx bench serve ...     serve.py      `mtx serve` under load against the batch CLI
    mtx bench prepare ...   prepare.py    `mtx prepare` of a WMT-size corpus: stages, memory

and, run as modules: `python -m benchmarks.reference` (training against torch's own
nn.Transformer), `python -m benchmarks.architectures` (each architecture variant trained and
scored), `python -m benchmarks.per_update` (how much mtx learns per update, beside fairseq)
and `python -m benchmarks.gpu_report` (every GPU measurement in one call; the recipe of a GPU
call is scripts/gpu_report.sh). `python -m benchmarks.page` checks `mtx serve`'s page in a real
browser. BENCHMARKS.md holds the current figure of each, with its command and machine.
"""
