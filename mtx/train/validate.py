"""Validation: the label-smoothed loss, NLL and perplexity of the validation split."""

from __future__ import annotations

import math

import torch

from mtx.config import Config
from mtx.data.batching import BatchDataset, lengths, token_batches
from mtx.train.distributed import Dist
from mtx.train.step import Precision, forward_loss


@torch.no_grad()
def validate(model, valid_ds, cfg: Config, precision: Precision, dist: Dist) -> dict[str, float]:
    """Label-smoothed loss, NLL and perplexity per target token on the validation split (each
    process takes every world-th batch; the sums are added up across processes)."""
    model.eval()
    batches = token_batches(*lengths(valid_ds), cfg.train.max_tokens)[dist.rank :: dist.world]
    loss_sum = nll_sum = torch.zeros((), device=precision.device, dtype=torch.float64)
    ntokens = 0
    for b in BatchDataset(valid_ds, batches):
        ntokens += len(b["tgt_index"])
        loss, nll = forward_loss(model, b, cfg, precision)
        loss_sum, nll_sum = loss_sum + loss, nll_sum + nll
    model.train()
    loss_sum, nll_sum, ntokens = dist.sum([loss_sum.item(), nll_sum.item(), float(ntokens)])
    nll = nll_sum / max(ntokens, 1)
    return {
        "valid_loss": loss_sum / max(ntokens, 1),
        "valid_nll": nll,
        "valid_ppl": math.exp(min(nll, 100.0)),
    }
