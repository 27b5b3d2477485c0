"""The benchmarks `mtx bench` runs, and the one harness every benchmark uses (harness.py).

    mtx bench train ...     train.py      training tokens/s, model FLOPs, MFU, peak memory
    mtx bench decode ...    decode.py     decoding speed against Hugging Face and CTranslate2
                                          (peers.py runs the peers as mtx decodes)
    mtx bench serve ...     serve.py      `mtx serve` under load against the batch CLI
                                          (server.py starts a real server on 127.0.0.1)
    mtx bench prepare ...   prepare.py    `mtx prepare` of a WMT-size corpus: stages, memory

Each takes an `Options` (its flags, mtx/cli/bench.py) and returns or prints its report. They
are part of the package, so an installed mtx benchmarks itself; the investigations that
produced BENCHMARKS.md's other figures live in the checkout's benchmarks/ folder, which is not
installed, and use the same harness.
"""
