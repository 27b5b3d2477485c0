"""`mtx info`: architecture, parameter count and FLOPs per token of a config or checkpoint."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from mtx import corpora
from mtx.checkpoint import Checkpoint
from mtx.config import PARTS, Config, DataConfig, ModelConfig, load_config
from mtx.model.build import make_model
from mtx.model.decoder_self import decoder_self
from mtx.model.flops import forward_flops, training_flops_per_token
from mtx.model.transformer import count_parameters


@dataclass
class Info:
    """What `mtx info` reports of a config or a checkpoint."""

    source: str  # the file described
    cfg: Config
    vocab_size: int
    parameters: int
    length: int  # tokens a side for the FLOPs figures
    checkpoint: Checkpoint | None = None

    def to_json(self) -> dict:
        """The facts as plain JSON values (`mtx info --json`, the server's /info)."""
        m, d, ckpt = self.cfg.model, self.cfg.data, self.checkpoint
        facts = {
            "source": self.source,
            "architecture": architecture(m),
            "directions": directions(d),
            "target_languages": corpora.target_languages(d),
            "tags": tag_pieces(d),
            "parameters": self.parameters,
            "vocab_size": self.vocab_size,
            "step": None if ckpt is None else ckpt.step,
            "flops_length": self.length,
            "forward_flops_per_pair": forward_flops(m, self.vocab_size, self.length, self.length),
            "flops_per_token": training_flops_per_token(
                m, self.vocab_size, self.length, self.length
            ),
            "config": self.cfg.to_dict(),
        }
        if ckpt is not None:
            facts |= {
                "mtx_version": ckpt.mtx_version,
                "manifest": None if ckpt.manifest is None else ckpt.manifest.to_dict(),
                "averaged_from": _json(ckpt.averaged_from),
                "init_from": _json(ckpt.init_from),
            }
        return facts

    def lines(self) -> list[str]:
        """The facts as `mtx info` prints them."""
        tags, n = tag_pieces(self.cfg.data), self.length
        flops = training_flops_per_token(self.cfg.model, self.vocab_size, n, n)
        lines = [
            f"{self.source}: {architecture(self.cfg.model)}",
            f"parameters: {self.parameters:,} ({self.parameters / 1e6:.1f}M), "
            f"vocabulary {self.vocab_size:,}",
            f"directions: {', '.join(directions(self.cfg.data))}"
            + (f" (the source starts with {' or '.join(tags)})" if tags else ""),
            f"training FLOPs per token (src = tgt = {n} tokens): {flops / 1e6:.1f}M",
        ]
        return lines + (checkpoint_lines(self.checkpoint) if self.checkpoint else [])


def checkpoint_lines(ckpt: Checkpoint) -> list[str]:
    """What a checkpoint adds: its steps, what it was averaged from or started from, its data."""
    lines = [f"trained steps: {ckpt.step} (mtx {ckpt.mtx_version})"]
    for source in ckpt.averaged_from or []:
        lines.append(f"averaged from: {source.path} (step {source.step})")
    if ckpt.init_from:
        r = ckpt.init_from
        kept = f", kept its {' and '.join(r.kept)}" if r.kept else ""
        kept += f", took its {' and '.join(r.parts)} only" if len(r.parts) < len(PARTS) else ""
        lines.append(f"started from: {r.path} (step {r.step}, sha256 {r.sha256[:12]}{kept})")
    for split, data in (ckpt.manifest.splits if ckpt.manifest else {}).items():
        lines.append(
            f"data: {split} {data.source} ({data.kept:,} pairs, sha256 {data.pairs_sha256[:12]})"
        )
        for s in data.sets if len(data.sets) > 1 else ():
            lines.append(f"  {s.name} ({s.src_lang}-{s.tgt_lang}): {s.kept:,} pairs")
    return lines


def describe(
    target: str,
    overrides: list[str] | None = None,
    length: int = 32,
    parameters: int | None = None,
) -> Info:
    """Facts about a YAML config or a checkpoint; lengths for FLOPs are `length` tokens a side.
    `parameters`: the model's count where the caller holds it (else counted on a model built
    on the meta device, which costs a process about 70 MB that it keeps)."""
    ckpt = None
    if Path(target).suffix in (".pt", ".pth"):
        ckpt = Checkpoint.load(target)
        cfg, vocab_size = ckpt.settings(overrides), ckpt.vocab_size
    else:
        cfg = load_config(target, overrides)
        vocab_size = cfg.data.vocab_size
    if parameters is None:
        with torch.device("meta"):
            parameters = count_parameters(make_model(cfg.model, vocab_size))
    return Info(target, cfg, vocab_size, parameters, length, ckpt)


def directions(d: DataConfig) -> list[str]:
    return list(dict.fromkeys(c.direction for c in corpora.corpora(d)))


def tag_pieces(d: DataConfig) -> list[str]:
    """The tags a source starts with (none for a model of one target language)."""
    if not corpora.tags(d):
        return []
    return [corpora.tag_piece(lang) for lang in corpora.target_languages(d)]


def _json(value):
    """A checkpoint's record (a dataclass, or a list of them) as plain JSON values."""
    if isinstance(value, list):
        return [dataclasses.asdict(v) for v in value]
    return dataclasses.asdict(value) if value is not None else None


def architecture(m: ModelConfig) -> str:
    """One line naming the model a config describes."""
    if m.arch == "rnn":
        return (
            f"rnn {m.rnn_cell}, {m.encoder_layers}-layer bidirectional encoder, "
            f"{m.decoder_layers}-layer decoder with input feeding, d_model {m.d_model}, "
            f"{m.attention} attention, shared embeddings"
        )
    relative = m.positions == "relative"
    decoder_ff = f" (decoder {m.decoder_d_ff})" if m.decoder_d_ff else ""
    return (
        f"transformer {m.norm}-norm, {m.encoder_layers}+{m.decoder_layers} layers, "
        f"d_model {m.d_model}, d_ff {m.d_ff}{decoder_ff}, {m.n_heads} heads, shared embeddings, "
        f"{m.positions} positions"
        + (f" (distances clipped at {m.max_relative_position})" if relative else "")
        + (f", {kind.description}" if (kind := decoder_self(m)).description else "")
    )
