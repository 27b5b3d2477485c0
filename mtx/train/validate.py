"""Validation: the label-smoothed loss, NLL and perplexity of each validation set, and its
BLEU and chrF: the set translated with the run's decode.* settings (decode/translator.py)
into its target language and scored by sacreBLEU against the raw references (evaluate.py).

With several sets (directions of a multilingual model, or a fine-tuning run's new and old
data), each set's figures are reported as valid_loss/NAME, valid_bleu/NAME, ...; valid_loss,
valid_bleu, ... are then their mean, or one set's figures when train.best_valid names it:
what best.pt and train.patience follow.
"""

from __future__ import annotations

import math

import torch

from mtx.config import Config
from mtx.data.batching import BatchDataset, lengths, token_batches
from mtx.decode.translator import Translator
from mtx.evaluate import score
from mtx.train.distributed import Dist
from mtx.train.step import LossModel, Precision, forward_loss


@torch.no_grad()
def validate(model, valid_ds, cfg: Config, precision: Precision, dist: Dist) -> dict[str, float]:
    """Label-smoothed loss, NLL and perplexity per target token on the validation split (each
    process takes every world-th batch; the sums are added up across processes)."""
    model.eval()
    t = cfg.train
    batches = token_batches(*lengths(valid_ds), t.max_tokens, pad_to=t.pad_to)
    loss_model = LossModel(model, t.label_smoothing)
    loss_sum = nll_sum = torch.zeros((), device=precision.device, dtype=torch.float64)
    ntokens = 0
    for b in BatchDataset(valid_ds, batches[dist.rank :: dist.world], t.pad_to):
        ntokens += b.tgt_tokens
        loss, nll = forward_loss(loss_model, b, precision)
        loss_sum, nll_sum = loss_sum + loss, nll_sum + nll
    model.train()
    loss_sum, nll_sum, ntokens = dist.sum([loss_sum.item(), nll_sum.item(), float(ntokens)])
    nll = nll_sum / max(ntokens, 1)
    return {
        "valid_loss": loss_sum / max(ntokens, 1),
        "valid_nll": nll,
        "valid_ppl": math.exp(min(nll, 100.0)),
    }


def combine(per_set: dict[str, dict[str, float]], best_valid: str) -> dict[str, float]:
    """One validation's record: with one set, its figures; with several, each set's as
    KEY/NAME and, as KEY, their mean or `best_valid`'s set's (the names are checked in
    Config.validate and the trainer)."""
    if len(per_set) == 1:
        return dict(next(iter(per_set.values())))
    out: dict[str, float] = {}
    for name, result in per_set.items():
        out |= {f"{k}/{name}": v for k, v in result.items()}
    if best_valid:
        return out | per_set[best_valid]
    for key in next(iter(per_set.values())):
        values = [r[key] for r in per_set.values() if key in r]
        out[key] = sum(values) / len(values)
    if "valid_nll" in out:
        out["valid_ppl"] = math.exp(min(out["valid_nll"], 100.0))
    return out


def translate_shared(
    model,
    sources: list[str],
    spm_proto: bytes,
    cfg: Config,
    precision: Precision,
    dist: Dist,
    tgt_lang: str | None = None,
) -> list[str]:
    """The detokenized translations of `sources` with the model being trained, on every
    process. Process r translates lines r, r + world, ...: a sentence's translation does not
    depend on the others in its batch, so the result is the same as one process's."""
    translator = Translator(model, cfg, spm_proto, as_is=True).into(tgt_lang)
    model.eval()
    model.pack("fp32")  # copies of the current weights, dropped below
    try:
        with precision.autocast():
            mine = translator.translate(sources[dist.rank :: dist.world])
    finally:
        model.pack(None)  # training changes the weights: never use a stale copy
        model.train()
    out: list[str] = [""] * len(sources)
    for rank, part in enumerate(dist.gather(mine)):
        out[rank :: dist.world] = part
    return out


def valid_bleu(
    model,
    valid_ds,
    spm_proto: bytes,
    cfg: Config,
    precision: Precision,
    dist: Dist,
    tgt_lang: str | None = None,
) -> tuple[dict[str, float], list[str]]:
    """sacreBLEU's BLEU and chrF of the first train.valid_bleu_lines (0: all) validation
    lines, translated by every process together and scored by rank 0 (the scores are sent
    to every process), and the translations."""
    lines = valid_ds.select(range(min(cfg.train.valid_bleu_lines or len(valid_ds), len(valid_ds))))
    hyps = translate_shared(model, lines["src"], spm_proto, cfg, precision, dist, tgt_lang)

    def scored() -> dict[str, float]:
        result = score(hyps, lines["tgt"])
        return {"valid_bleu": result.bleu, "valid_chrf": result.chrf}

    return dist.decide(scored), hyps
