"""Operations per training update, the proxy for a GPU's kernel launches, counted on the CPU.

    python scripts/ops_per_update.py --config configs/base.yaml [--compiled] [--set KEY=VALUE]

Eager: the ATen operations one update dispatches (forward, loss, backward, gradient norm,
Adam), counted by a TorchDispatchMode, by kind, views apart (they launch nothing); each of the
others is at least one kernel launch on a GPU.
`--compiled`: the same update through train.compile (inductor, CPU): the compiled graphs
called and the kernels inductor generated for them (counted by torch.profiler, with
torch._inductor.config.cpp.enable_kernel_profile), and the ATen operations still dispatched
(the graphs' library calls such as matrix products, and the optimizer). One update of a small synthetic batch (train.max_tokens 512 unless
set): the counts do not depend on the batch's size, except the chunked eager loss, whose
operations grow by about 15 per 900 target tokens of a 37k vocabulary.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mtx.bench import synthetic_batches
from mtx.config import load_config
from mtx.model.build import make_model
from mtx.train import compiled
from mtx.train.step import LossModel, Precision, make_optimizer, train_step

VIEWS = {"aten::view", "aten::t", "aten::transpose", "aten::permute", "aten::detach", "aten::as_strided",
         "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select", "aten::reshape",
         "aten::_unsafe_view", "aten::alias", "aten::resolve_conj", "aten::resolve_neg",
         "aten::to"}  # fmt: skip  # no kernel (aten::to: a tensor already where it goes)


class Count(TorchDispatchMode):
    """Operations by name, and views (no kernel: a new shape over the same memory) apart."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view or func._schema.name == "aten::detach":
            self.views += 1
        else:
            self.ops[func._schema.name] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], help="a config override")
    ap.add_argument("--compiled", action="store_true", help="count the compiled step's kernels")
    args = ap.parse_args()
    cfg = load_config(args.config, ["train.max_tokens=512", "train.device=cpu", *args.set])
    if args.compiled:  # before compiling: generated CPU kernels then show in the profiler
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    vocab = cfg.data.vocab_size
    batches = synthetic_batches(cfg, vocab, 3, 20)
    torch.manual_seed(0)
    model = make_model(cfg.model, vocab)
    optimizer = make_optimizer(model, cfg)
    fp32 = Precision(torch.device("cpu"))
    step = compiled.StepModule(LossModel(model, cfg.train.label_smoothing), args.compiled)

    def update(n: int) -> None:
        step.run(lambda m: train_step(m, optimizer, [batches[n]], cfg, n + 1, fp32), optimizer)

    update(0)  # warm-up (and compiling)
    if not args.compiled:
        with Count() as count:
            update(1)
        total = sum(count.ops.values())
        print(f"{args.config}: {total} ATen operations per eager update (and {count.views} views)")
        for name, n in count.ops.most_common(12):
            print(f"  {n:5d}  {name}")
        return
    from torch.profiler import ProfilerActivity, profile

    update(1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        update(2)
    events = prof.events()
    kernels = sum(e.name.startswith(("cpp_fused", "graph_")) for e in events)
    graphs = sum("CompiledFxGraph" in e.name for e in events)
    top = Counter(
        e.name
        for e in events
        if e.name.startswith("aten::")
        and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))
        and e.name not in VIEWS
    )
    print(
        f"{args.config}: compiled: {graphs} compiled graphs, {kernels} generated kernels and "
        f"{sum(top.values())} ATen operations (the graphs' library calls, the optimizer) "
        "per update"
    )
    for name, n in top.most_common(8):
        print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()
