"""Validation: the label-smoothed loss, NLL and perplexity of each validation set, and its
BLEU and chrF: the set translated with the run's decode.* settings (decode/translator.py)
into its target language and scored by sacreBLEU against the raw references (evaluate.py).

A validation is a `Validation`: its `summary` (what best.pt and train.patience follow) and,
with several sets (directions of a multilingual model, or a fine-tuning run's new and old
data), each set's `SetScores`; the summary is then their mean, or one set's figures when
train.best_valid names it. Only `Validation.record` spells the metrics.jsonl keys
(valid_loss, valid_bleu, ..., and valid_loss/NAME, ... for each set).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from mtx.config import Config
from mtx.data.batching import BatchDataset, lengths, token_batches
from mtx.decode.translator import Translator
from mtx.distributed import Dist
from mtx.evaluate import Scores, score
from mtx.tokens import SPECIALS
from mtx.train.step import LossModel, Precision, forward_loss


@dataclasses.dataclass(frozen=True)
class SetScores:
    """One validation set's figures: the label-smoothed loss, NLL and perplexity per target
    token, and (on validations that translate) sacreBLEU's BLEU and chrF."""

    loss: float
    nll: float
    bleu: float | None = None
    chrf: float | None = None

    @property
    def ppl(self) -> float:
        return math.exp(min(self.nll, 100.0))

    def with_bleu(self, bleu: float, chrf: float) -> SetScores:
        return dataclasses.replace(self, bleu=bleu, chrf=chrf)

    def record(self, suffix: str = "") -> dict[str, float]:
        """The metrics.jsonl keys of these figures (each ending with `suffix`)."""
        out = {"valid_loss": self.loss, "valid_nll": self.nll, "valid_ppl": self.ppl}
        if self.bleu is not None:
            out |= {"valid_bleu": self.bleu, "valid_chrf": self.chrf}
        return {key + suffix: value for key, value in out.items()}


@dataclasses.dataclass
class Validation:
    """One validation: the `summary` best.pt follows, each set's figures when there are
    several (`sets`, by name; empty with one), and the seconds it took (BLEU's included)."""

    summary: SetScores
    sets: dict[str, SetScores] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    bleu_seconds: float | None = None

    def record(self) -> dict[str, float]:
        """Its metrics.jsonl record (without kind, step and best)."""
        out = self.summary.record()
        for name, scores in self.sets.items():
            out |= scores.record(f"/{name}")
        if self.bleu_seconds is not None:
            out["bleu_seconds"] = self.bleu_seconds
        return out | {"valid_seconds": self.seconds}


@torch.no_grad()
def validate(model, valid_ds, cfg: Config, precision: Precision, dist: Dist) -> SetScores:
    """Label-smoothed loss, NLL and perplexity per target token on the validation split (each
    process takes every world-th batch; the sums are added up across processes)."""
    model.eval()
    t = cfg.train
    batches = token_batches(*lengths(valid_ds), t.max_tokens, pad_to=t.pad_to)
    loss_model = LossModel(model, t.label_smoothing)
    loss_sum = nll_sum = torch.zeros((), device=precision.device, dtype=torch.float64)
    ntokens = 0
    mine, start = batches[dist.rank :: dist.world], SPECIALS[cfg.model.decoder_start].start
    for b in BatchDataset(valid_ds, mine, t.pad_to, start=start):
        ntokens += b.tgt_tokens
        loss, nll, _ = forward_loss(loss_model, b, precision)
        loss_sum, nll_sum = loss_sum + loss, nll_sum + nll
    model.train()
    loss_sum, nll_sum, ntokens = dist.sum([loss_sum.item(), nll_sum.item(), float(ntokens)])
    return SetScores(loss=loss_sum / max(ntokens, 1), nll=nll_sum / max(ntokens, 1))


def combine(per_set: dict[str, SetScores], best_valid: str) -> Validation:
    """One validation: with one set, its figures; with several, each set's and, as the
    summary, their mean (the perplexity that of the mean NLL) or `best_valid`'s set's (the
    names are checked in Config.validate and the trainer)."""
    if len(per_set) == 1:
        return Validation(next(iter(per_set.values())))
    if best_valid:
        return Validation(per_set[best_valid], dict(per_set))

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) / len(known) if known else None

    sets = list(per_set.values())
    summary = SetScores(
        loss=mean([s.loss for s in sets]),
        nll=mean([s.nll for s in sets]),
        bleu=mean([s.bleu for s in sets]),
        chrf=mean([s.chrf for s in sets]),
    )
    return Validation(summary, dict(per_set))


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
    translator = Translator(model, cfg, spm_proto, as_is=True)
    options = translator.options(tgt_lang=tgt_lang)
    model.eval()
    model.pack("fp32")  # copies of the current weights, dropped below
    try:
        with precision.autocast():
            done = translator.translate(sources[dist.rank :: dist.world], options)
            mine = [t.best.text for t in done]
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
) -> tuple[Scores, list[str]]:
    """sacreBLEU's scores (BLEU and chrF) of the first train.valid_bleu_lines (0: all) validation
    lines, translated by every process together and scored by rank 0 (the scores are sent
    to every process), and the translations."""
    lines = valid_ds.select(range(min(cfg.train.valid_bleu_lines or len(valid_ds), len(valid_ds))))
    hyps = translate_shared(model, lines["src"], spm_proto, cfg, precision, dist, tgt_lang)

    return dist.decide(lambda: score(hyps, lines["tgt"])), hyps
