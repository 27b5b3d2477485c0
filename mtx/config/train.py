"""The train section: the optimiser, schedule, batches and checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mtx.config.fields import AT_LEAST_1, FRACTION, LAYER, NOT_NEGATIVE, POSITIVE, setting
from mtx.config.model import PARTS, Part
from mtx.errors import MtxError

# guided alignment: the pass whose attention is trained (model/transformer.py's full_context)
AlignContext = Literal["full", "causal"]


@dataclass
class TrainConfig:
    """`mtx train` (train/): batches, optimizer, schedule, validation, checkpoints, devices."""

    max_tokens: int = setting(
        4096, "token budget of a batch (longest padded length x sentences, per side)", POSITIVE
    )
    update_freq: int = setting(1, "batches accumulated into one update", POSITIVE)
    lr_scale: float = setting(
        1.0, "factor on the paper's learning-rate formula (0: a learning rate of 0)", NOT_NEGATIVE
    )
    warmup_steps: int = setting(
        4000, "linear warm-up steps of the inverse-sqrt schedule", AT_LEAST_1
    )
    max_steps: int = setting(100_000, "stop after this many updates", POSITIVE)
    max_minutes: float = setting(
        0.0, "stop after this many minutes of training (0: no limit)", NOT_NEGATIVE
    )
    label_smoothing: float = setting(0.1, "epsilon of label-smoothed cross-entropy", FRACTION)
    adam_beta1: float = setting(0.9, "Adam beta1", FRACTION)
    adam_beta2: float = setting(0.98, "Adam beta2", FRACTION)
    adam_eps: float = setting(1e-9, "Adam epsilon", POSITIVE)
    clip_norm: float = setting(
        0.0, "clip the gradient norm to this (0: off, as in the paper)", NOT_NEGATIVE
    )
    seed: int = setting(1, "seeds initialisation, dropout and batch order", NOT_NEGATIVE)
    valid_every: int = setting(1000, "validate and checkpoint every this many updates", POSITIVE)
    bleu_every: int = setting(
        1,
        "translate the validation split with decode.* and score it (BLEU, chrF) at every this "
        "many validations, and at the last (0: never, loss only)",
        NOT_NEGATIVE,
    )
    valid_bleu_lines: int = setting(
        0, "translate only the first N validation lines (0: all)", NOT_NEGATIVE
    )
    best_metric: Literal["loss", "bleu"] = setting(
        "loss", "what best.pt is best by: loss (lowest) or bleu (highest)"
    )
    patience: int = setting(
        0, "stop after this many validations without a better best_metric (0: off)", NOT_NEGATIVE
    )
    best_valid: str = setting(
        "",
        "with several validation sets: the one whose best_metric best.pt and patience follow "
        "(empty: the mean over the sets)",
    )
    tensorboard: bool = setting(
        False, "also write every metric to RUN/tensorboard (pip install tensorboard)"
    )
    keep_last: int = setting(
        5, "step checkpoints (step-N.pt) kept beside last.pt and best.pt", NOT_NEGATIVE
    )
    max_nonfinite: int = setting(
        10, "stop after this many updates in a row with a NaN/inf loss or gradient", POSITIVE
    )
    max_oom: int = setting(
        3, "stop after this many batches in a row run out of GPU memory", POSITIVE
    )
    log_every: int = setting(100, "write a metrics line every this many updates", POSITIVE)
    device: str = setting("auto", "auto (CUDA if present), cpu, cuda or cuda:N")
    precision: Literal["auto", "fp32", "bf16", "fp16", "bf16-weights"] = setting(
        "auto",
        "auto (bf16 autocast on GPUs that have it, else fp32), fp32, bf16, fp16 (autocast "
        "with dynamic loss scaling, for GPUs without bf16), or bf16-weights (bf16 parameters "
        "and activations, fp32 master weights in Adam: train/master.py)",
    )
    compile: Literal["auto", "true", "false"] = setting(
        "auto", "torch.compile the step: auto (on CUDA only), true or false"
    )
    compile_backend: Literal["inductor", "aot_eager", "eager"] = setting(
        "inductor",
        "torch.compile's backend: inductor (generated kernels); aot_eager or eager trace the "
        "step but run torch's own kernels (quick checks that it compiles)",
    )
    compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = setting(
        "default",
        "torch.compile's mode with inductor: default, reduce-overhead (CUDA graphs, one per "
        "batch shape) or max-autotune-no-cudagraphs (searches kernels: slow to compile)",
    )
    pad_to: int = setting(
        8,
        "pad each side of a batch to a length from a bounded set: a multiple of up to this many "
        "tokens, never more than 1/8 of the length (1: exact lengths)",
        POSITIVE,
    )
    static_shapes: bool = setting(
        False,
        "batches of a fixed set of shapes: per padded length L, max_tokens // L pairs (the "
        "last batch of a length filled with empty pairs), both sides padded to L; compiled "
        "with compile_mode reduce-overhead, a CUDA graph per shape (train/compiled.py)",
    )
    workers: int = setting(
        1, "background processes building batches (0: in the training process)", NOT_NEGATIVE
    )
    init_from: str = setting(
        "",
        "fine-tuning: start from this checkpoint's weights, with a fresh optimizer at step 0 "
        "and this run's schedule; model.* keys left out of the config come from it",
    )
    init_keep_optimizer: bool = setting(
        False, "init_from: keep its Adam moments (last.pt, step-N.pt)"
    )
    init_keep_step: bool = setting(
        False, "init_from: continue its step count, and so its learning rate"
    )
    init_parts: list[Part] = setting(
        list(PARTS),
        "init_from: the parts whose weights are taken; the others start from this run's own "
        "initialisation and may differ in shape (a student taking its teacher's embeddings "
        "and encoder)",
    )
    freeze: list[Part] = setting(
        [], "parts left as they are: embeddings (shared with the output layer), encoder, decoder"
    )
    ema: float = setting(
        0.0,
        "exponential moving average of the weights: its decay per update (e.g. 0.9999; 0: "
        "off); validation, best.pt and every checkpoint's weights are the average "
        "(train/ema.py)",
        FRACTION,
    )
    align_weight: float = setting(
        0.0,
        "guided alignment (Garg et al. 2019): weight of the cross-entropy between the guided "
        "heads' encoder-decoder attention and the statistical alignments `mtx align` kept with "
        "the prepared data (0: off; Garg et al.'s 0.05; in full context 0.5 aligned best on the "
        "toy corpus: docs/alignment.md; train/loss.py's alignment_loss)",
        NOT_NEGATIVE,
    )
    align_layer: int = setting(
        -2,
        "guided alignment: the decoder layer trained to align, from 0 (negative: from the "
        "last; -2, the penultimate, as Garg et al.)",
        LAYER,
    )
    align_heads: int = setting(
        1, "guided alignment: how many of that layer's heads (the first) are trained", POSITIVE
    )
    align_context: AlignContext = setting(
        "full",
        "guided alignment: the pass whose attention is trained, and later read: full, an extra "
        "pass of the decoder layers up to align_layer without the causal mask, so that a "
        "target word is aligned once it is seen (Garg et al. 2019; the better on every set "
        "measured: BENCHMARKS.md, docs/alignment.md); causal, the translating pass itself, "
        "where target word t is aligned while it is predicted",
    )
    threads: int = setting(0, "CPU threads for torch (0: torch's default)", NOT_NEGATIVE)
    dist_timeout: float = setting(
        60.0,
        "torchrun: a collective that waits this many seconds fails and ends the job (a process "
        "died or hangs); raise it where rank 0 writes large checkpoints to a slow disk",
        POSITIVE,
    )

    def check(self) -> None:
        t = self
        if t.ema and t.precision == "bf16-weights":
            raise MtxError("train.ema averages fp32 weights: it does not take bf16-weights")
        if t.best_metric == "bleu" and t.bleu_every == 0:
            raise MtxError("train.best_metric bleu needs train.bleu_every above 0")
        if set(t.freeze) == set(PARTS):
            raise MtxError("train.freeze: every part is frozen, so nothing would be trained")
        if (t.init_keep_optimizer or t.init_keep_step) and not t.init_from:
            raise MtxError(
                "train.init_keep_optimizer and train.init_keep_step need train.init_from"
            )
        if not t.init_parts:
            raise MtxError("train.init_parts: name at least one part (or leave out init_from)")
        if set(t.init_parts) != set(PARTS) and not t.init_from:
            raise MtxError("train.init_parts needs train.init_from")
        if set(t.init_parts) != set(PARTS) and t.init_keep_optimizer:
            raise MtxError(
                "train.init_keep_optimizer keeps the Adam moments of every part: it needs "
                "train.init_parts to name them all"
            )
