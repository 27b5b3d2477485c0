"""One training update: the forward pass, the label-smoothed loss, the backward pass and Adam.

One update (`train_step`) consumes `update_freq` token-budget batches on each process,
normalises the summed label-smoothed loss by the number of target tokens of the whole update,
clips the gradient norm if asked, and sets the learning rate from the paper's schedule. The
loss stays on the device (the trainer reads it back only when logging), and every count the
step needs (tokens, whether a source is padded) comes with the host batch, so the step never
waits for the device (tests/test_step.py counts the operations that would). An update with a
non-finite loss or gradient is skipped on the device: the fused Adam step is told `found_inf`.

`LossModel` is the model and its loss as one module, what the step runs, what DDP wraps and
what `train.compile` compiles (compiled.py): in eager mode the output projection and the loss
go a chunk of target tokens at a time (loss.py's output_loss); compiled, they are written
plainly and the compiler fuses them.

`build_step` assembles all of it once (precision, LossModel, DDP, compilation, Adam) into a
`Step`: the trainer, `mtx bench train` and the GPU report run the same update through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from mtx.config import Config
from mtx.data.batching import Batch
from mtx.device import auto_dtype
from mtx.model.base import EncoderDecoder
from mtx.model.capture import Heads, capture_cross_attention
from mtx.tokens import PAD_ID
from mtx.train import compiled
from mtx.train.loss import alignment_loss, label_smoothed_nll, output_loss
from mtx.train.master import MasterWeights
from mtx.train.schedule import rate


@dataclass
class Precision:
    """How a step computes: autocast to `dtype` (None: plain fp32), for fp16 the dynamic loss
    scaler that keeps small gradients from underflowing, and for bf16-weights the bf16
    working copy of the model with its fp32 master (master.py)."""

    device: torch.device
    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None
    master: MasterWeights | None = None

    @classmethod
    def choose(
        cls, device: torch.device, name: str, model: torch.nn.Module | None = None
    ) -> Precision:
        """bf16 autocast on GPUs that support it for "auto", else what `name` says
        (bf16-weights: a working copy of `model`)."""
        if name == "auto":
            name = "bf16" if auto_dtype(device) == torch.bfloat16 else "fp32"
        if name == "bf16":
            return cls(device, torch.bfloat16)
        if name == "fp16":
            return cls(device, torch.float16, torch.amp.GradScaler(device.type))
        if name == "bf16-weights":
            return cls(device, master=MasterWeights(model))
        return cls(device)

    @property
    def name(self) -> str:
        if self.master is not None:
            return "bf16-weights"
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)


def make_optimizer(model: torch.nn.Module, cfg: Config) -> torch.optim.Adam:
    """Adam as in the paper; fused, so that a non-finite update is skipped on the device."""
    return torch.optim.Adam(
        model.parameters(),
        lr=0.0,
        betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
        eps=cfg.train.adam_eps,
        fused=True,
    )


class LossModel(torch.nn.Module):
    """(smoothed loss sum, NLL sum) of a batch: the model's decoder states at the target
    tokens, projected by the shared embedding matrix and scored against the targets."""

    def __init__(
        self, model: torch.nn.Module, label_smoothing: float, guide: Guide | None = None
    ) -> None:
        super().__init__()
        self.model = model
        self.eps = label_smoothing
        self.guide = guide  # guided alignment: which heads, and the weight of their loss
        self.chunked = True  # output_loss; False: whole logits, for a compiler to fuse
        # True: every source masked, so that a compiler traces one graph, not one for padded
        # batches and one for unpadded ones (src_padded is then never read, so not guarded)
        self.mask_always = False

    def forward(self, src, tgt_in, tgt_out, tgt_index, src_padded: bool, align=None) -> Losses:
        """The batch's `Losses`; with `align` (a batch's align_index and align_weight, guided
        alignment), the loss adds the guide's weight x the alignment loss of its heads'
        encoder-decoder attention (read beside the model: model/capture.py)."""
        padded = True if self.mask_always else src_padded
        if align is None:
            return Losses(*self.token_loss(src, tgt_in, tgt_out, tgt_index, padded), None)
        heads, model = self.guide.heads, self.model
        layer = heads.index(len(model.cross_attention_modules()))
        if heads.reading == "full":  # an extra pass without the causal mask (Garg et al.)
            memory, mask = model.encode(src, padded)
            states = model.states(tgt_in, memory, mask).flatten(0, 1).index_select(0, tgt_index)
            loss, nll = self.states_loss(states, tgt_out, tgt_index)
            with capture_cross_attention(model, [layer], stop=True, graph=True) as seen:
                model.full_context(tgt_out, memory, mask, layer + 1)
        else:  # the translating pass itself
            with capture_cross_attention(model, [layer], graph=True) as seen:
                loss, nll = self.token_loss(src, tgt_in, tgt_out, tgt_index, padded)
        aligned = alignment_loss(heads.pick(seen[layer]), *align)
        return Losses(loss + self.guide.weight * aligned, nll, aligned.detach())

    def token_loss(self, src, tgt_in, tgt_out, tgt_index, padded: bool):
        hidden = self.model(src, tgt_in, tgt_index, padded, project=False)  # (N, d)
        return self.states_loss(hidden, tgt_out, tgt_index)

    def states_loss(self, hidden, tgt_out, tgt_index):
        """(smoothed loss, NLL) of the decoder's states (N, d) at the flat target positions
        `tgt_index`."""
        target = tgt_out.flatten()[tgt_index]  # (N,)
        if self.chunked:
            weight, bias = self.model.output_weight(), self.model.output_bias()
            return output_loss(hidden, weight, target, self.eps, PAD_ID, bias)
        logits = self.model.output_projection(hidden)  # (N, V)
        return label_smoothed_nll(logits, target, self.eps, PAD_ID)


class Losses(NamedTuple):
    """What the loss model gives for a batch, summed over its target tokens (on the device)."""

    loss: torch.Tensor  # () label-smoothed loss (+ the weighted alignment loss, if guided)
    nll: torch.Tensor  # () negative log-likelihood
    align: torch.Tensor | None  # () the alignment loss, detached (None: not guided)


@dataclass(frozen=True)
class Guide:
    """Guided alignment (train.align_*): the heads trained to align (model/capture.py's
    `Heads`, as decoding reads them), and the weight of their loss."""

    heads: Heads
    weight: float

    @classmethod
    def of(cls, cfg: Config) -> Guide | None:
        t = cfg.train
        return cls(Heads.guide(cfg), t.align_weight) if t.align_weight else None


def forward_loss(loss_model, batch: Batch, precision: Precision) -> Losses:
    """The `Losses` of a batch (still on the host when passed in); the output projection runs
    only at target tokens, and a source without padding goes unmasked."""
    src, tgt_in, tgt_out, tgt_index = (
        x.to(precision.device, non_blocking=True)
        for x in (batch.src, batch.tgt_in, batch.tgt_out, batch.tgt_index)
    )
    align = None
    if batch.align_index is not None:
        align = tuple(
            x.to(precision.device, non_blocking=True)
            for x in (batch.align_index, batch.align_weight)
        )
    with precision.autocast():
        if align is None:
            return loss_model(src, tgt_in, tgt_out, tgt_index, batch.src_padded)
        return loss_model(src, tgt_in, tgt_out, tgt_index, batch.src_padded, align)


@dataclass
class UpdateStats:
    """What one update reports: device tensors, read back only when the trainer logs
    (metrics.py's Window), and counts of the host."""

    loss: torch.Tensor  # () summed label-smoothed loss (0 if the update was skipped)
    nll: torch.Tensor  # () summed negative log-likelihood (0 if skipped)
    skipped: torch.Tensor  # () bool: a non-finite loss or gradient skipped the update
    align: torch.Tensor | None  # () summed alignment loss, guided alignment only (0 if skipped)
    grad_norm: torch.Tensor  # () the gradient norm before clipping (0 if skipped)
    tgt_tokens: int  # this process's real target tokens
    src_tokens: int  # this process's real source tokens
    padded_tokens: int  # this process's tokens of both sides, padding included
    lr: float  # the learning rate of the update


def train_step(
    loss_model,
    optimizer,
    batches: list[Batch],
    cfg: Config,
    step: int,
    precision: Precision,
    ntokens: int | None = None,
    world: int = 1,
) -> UpdateStats:
    """One update from `batches` with `loss_model` (a LossModel, wrapped by DDP or compiled;
    a bare model is wrapped here).

    `ntokens` is the number of target tokens of the whole update, all processes together
    (default: those of `batches`). DistributedDataParallel averages gradients over the `world`
    processes, so each scales its loss by world / ntokens: the sum is the gradient of the
    update's per-token loss, as one process with all the batches would compute it.
    """
    if isinstance(loss_model, EncoderDecoder):  # a bare model
        loss_model = LossModel(loss_model, cfg.train.label_smoothing, Guide.of(cfg))
    lr = rate(step, cfg.model.d_model, cfg.train.warmup_steps, cfg.train.lr_scale)
    for group in optimizer.param_groups:
        group["lr"] = lr
    local_tokens = sum(b.tgt_tokens for b in batches)  # counted on the host
    factor = world / (ntokens or local_tokens)
    loss_sum, nll_sum, align_sum = backward(loss_model, batches, precision, factor)
    norm, skipped = apply_update(optimizer, precision, cfg.train.clip_norm, loss_sum, world)
    return UpdateStats(
        loss=torch.where(skipped, 0.0, loss_sum),
        nll=torch.where(skipped, 0.0, nll_sum),
        skipped=skipped,
        align=None if align_sum is None else torch.where(skipped, 0.0, align_sum),
        grad_norm=torch.where(skipped, 0.0, norm.float()),
        tgt_tokens=local_tokens,
        src_tokens=sum(b.src_tokens for b in batches),
        padded_tokens=sum(b.padded_tokens for b in batches),
        lr=lr,
    )


def backward(loss_model, batches: list[Batch], precision: Precision, factor: float) -> tuple:
    """The forward and backward passes of every batch, each loss scaled by `factor` (and by
    the fp16 loss scale); the summed losses, NLL and alignment loss (None: not guided), on the
    device."""
    scaler = precision.scaler
    if precision.master is not None:
        precision.master.clear_grads()  # of an update that ran out of memory
    loss_sum = nll_sum = torch.zeros((), device=precision.device)
    align_sum = None
    for i, b in enumerate(batches):
        # Gradients are averaged across processes once, on the update's last batch.
        last = i == len(batches) - 1
        no_sync = getattr(loss_model, "no_sync", None)
        with no_sync() if no_sync is not None and not last else contextlib.nullcontext():
            loss, nll, aligned = forward_loss(loss_model, b, precision)
            (scaler.scale(loss * factor) if scaler else loss * factor).backward()
        loss_sum, nll_sum = loss_sum + loss.detach(), nll_sum + nll.detach()
        if aligned is not None:
            align_sum = aligned if align_sum is None else align_sum + aligned
    return loss_sum, nll_sum, align_sum


def apply_update(optimizer, precision: Precision, clip_norm: float, loss_sum, world: int):
    """Adam's step on the accumulated gradients, skipped on the device when the loss or the
    gradient is not finite; (the gradient norm before clipping, whether it was skipped)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if precision.master is not None:
        precision.master.take_grads()
    scaler = precision.scaler
    if scaler:
        scaler.unscale_(optimizer)  # records inf/NaN for the scaler's update() below
    if clip_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, clip_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    finite = torch.isfinite(norm)  # the same on every process: gradients are already averaged
    if world == 1:
        finite = finite & torch.isfinite(loss_sum)
    skipped = ~finite
    # The fused Adam kernels read `found_inf` on the device and leave parameters, moments and
    # step count untouched when it is 1 (the mechanism torch.amp.GradScaler uses): no sync.
    optimizer.found_inf = skipped.float()
    optimizer.step()
    if scaler:
        scaler.update()  # halve the scale after an overflow, grow it after a long calm
    optimizer.zero_grad(set_to_none=True)
    if precision.master is not None:
        precision.master.give_weights()
    return norm, skipped


@dataclass
class Step:
    """One training update, ready to run: `step(batches, n)` is update number n (from 1) on
    this process's `batches` (see train_step for `ntokens`)."""

    cfg: Config
    model: torch.nn.Module  # the bare model (what checkpoints save)
    precision: Precision
    optimizer: torch.optim.Adam
    module: compiled.StepModule  # LossModel, DDP-wrapped when joined, compiled when asked
    world: int = 1  # processes sharing every update

    def __call__(self, batches: list[Batch], step: int, ntokens: int | None = None) -> UpdateStats:
        args = (self.cfg, step, self.precision, ntokens, self.world)
        return self.module.run(
            lambda module: train_step(module, self.optimizer, batches, *args), self.optimizer
        )

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return self.precision.scaler

    @property
    def working_model(self) -> torch.nn.Module:
        """The model the step computes with: `model`, or bf16-weights' bf16 copy of it."""
        return self.model if self.precision.master is None else self.precision.master.work

    def weights_loaded(self) -> None:
        """After weights were loaded into `model` (a resume): bf16-weights' working copy
        follows them."""
        if self.precision.master is not None:
            self.precision.master.give_weights()


def build_step(
    cfg: Config,
    model: torch.nn.Module,
    device: torch.device,
    world: int = 1,
    ddp: bool = False,
    warn: Callable[[str], None] = print,
) -> Step:
    """The update of `model` (on `device`, weights loaded and parts frozen) as `cfg` says:
    precision, the label-smoothed loss, DistributedDataParallel if `ddp` (in torchrun's
    process group of `world` processes), train.compile, and a fresh Adam."""
    t = cfg.train
    precision = Precision.choose(device, t.precision, model)
    work = model if precision.master is None else precision.master.work
    module: torch.nn.Module = LossModel(work, t.label_smoothing, Guide.of(cfg))
    if ddp:
        module = torch.nn.parallel.DistributedDataParallel(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            broadcast_buffers=False,
            gradient_as_bucket_view=True,
        )
    compile_it = compiled.wanted(t.compile, device) and not t.align_weight  # eager: guided
    step_module = compiled.StepModule(
        module, compile_it, warn, t.compile_backend, t.compile_mode,
        t.static_shapes,
    )  # fmt: skip
    return Step(cfg, model, precision, make_optimizer(model, cfg), step_module, world)
