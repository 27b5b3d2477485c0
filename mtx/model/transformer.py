"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017).

Shape legend: B batch, S source length, T target length, d = d_model, V vocabulary size.

- One embedding matrix is shared by the source, the target and the pre-softmax projection
  (section 3.4); embeddings are multiplied by sqrt(d_model).
- Positions (`model.positions`): sinusoidal (section 3.5; or fairseq's table, an imported
  NLLB model's: model/positions.py) or learned (section 3.5's alternative; one embedding per
  position) are added, then dropout (section 5.4); relative
  positions (Shaw et al. 2018) add nothing here and act inside self-attention (attention.py).
- Students' shapes (`model.decoder_d_ff`, `model.decoder_self: ssru`, layers.py) change the
  decoder only.
- Post-norm encoder and decoder stacks (layers.py), or pre-norm (`model.norm: pre`), where
  each stack ends with a LayerNorm; the decoder is causally masked.

Token ids: sources are `tokens + [EOS]`; decoder inputs `[BOS] + tokens`; targets `tokens + [EOS]`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mtx.config import ModelConfig
from mtx.errors import MtxError
from mtx.model.attention import MultiHeadAttention
from mtx.model.base import EncoderDecoder
from mtx.model.cache import GrowingCache, StaticCache
from mtx.model.decoder_self import decoder_self
from mtx.model.groups import Groups
from mtx.model.interface import Capabilities, Lacks
from mtx.model.layers import DecoderLayer, EncoderLayer, FeedForward
from mtx.model.packed import PackedLinear
from mtx.model.positions import position_table
from mtx.model.ragged import RaggedCache
from mtx.tokens import PAD_ID


class Transformer(EncoderDecoder, Lacks, nn.Module):
    # encode and decode take `Groups` of sources (model/groups.py); a static cache
    capabilities = Capabilities(
        mixed_lengths=True, static_cache=True, output_matrix=True, attention=True, ragged=True
    )
    PARTS = {
        # the shared embedding is the output layer (with its bias, model.output_bias)
        "embeddings": ("embed.", "position_embed.", "logits_bias"),
        "encoder": ("encoder_layers.", "encoder_norm."),
        "decoder": ("decoder_layers.", "decoder_norm."),
    }

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=PAD_ID)
        # model.output_bias, MarianMT's final_logits_bias
        self.logits_bias = nn.Parameter(torch.zeros(vocab_size)) if cfg.output_bias else None
        self.fixed_positions = cfg.positions in ("sinusoidal", "fairseq")  # a table
        table = position_table(cfg)  # model/positions.py; None: learned or relative
        if table is None:
            table = torch.zeros(cfg.max_positions, cfg.d_model)
        self.register_buffer("positions", table, persistent=False)
        self.position_embed = None
        if cfg.positions == "learned":
            self.position_embed = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.encoder_norm = self.decoder_norm = None  # pre-norm: each stack's last LayerNorm
        if cfg.norm == "pre":
            self.encoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
            self.decoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.packed_output: PackedLinear | None = None  # see pack()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embeddings N(0, d^-0.5), so that the sqrt(d)-scaled embeddings start at unit
        variance; the attention and feed-forward layers as `model.init` says; LayerNorms at
        gain 1, bias 0.

        The paper does not say how it initialises. `model.init: fairseq` (the default) starts
        W^Q, W^K, W^V at 1/sqrt(2) of Xavier's scale and the feed-forward layers at
        nn.Linear's (its second layer about half Xavier's), as fairseq does: each sublayer then
        adds less to the residual stream at first, and on Multi30k the validation loss early
        in training is lower and test BLEU higher than with Xavier-uniform everywhere
        (`model.init: xavier`; BENCHMARKS.md, "Learning per update", has the figures). W^V's
        scale does the most, then the feed-forward layers' and W^Q's, W^K's. The output bias
        (model.output_bias) starts at zero.
        """
        nn.init.normal_(self.embed.weight, mean=0.0, std=self.cfg.d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[PAD_ID].zero_()
            if self.logits_bias is not None:
                self.logits_bias.zero_()
        if self.position_embed is not None:
            nn.init.normal_(self.position_embed.weight, mean=0.0, std=self.cfg.d_model**-0.5)
        # each decoder layer's self-sublayer whatever its kind (model/decoder_self.py)
        own = {id(layer.self_attn) for layer in self.decoder_layers}
        for module in self.modules():
            if isinstance(module, (MultiHeadAttention, FeedForward, nn.LayerNorm)) or (
                id(module) in own
            ):
                module.reset_parameters()

    def embed_tokens(self, ids: Tensor, start: int | Tensor = 0) -> Tensor:
        """(B, n) ids at positions start.. -> (B, n, d) scaled embeddings + positions, dropped
        out. `start` may be a tensor on the device, n = 1: () a static cache's position, (B,)
        each row's own (a ragged cache's, model/ragged.py)."""
        n = ids.size(1)
        if isinstance(start, Tensor):
            x = self.embed(ids) * math.sqrt(self.cfg.d_model)
            if self.fixed_positions:
                x = x + self.positions.index_select(0, start.view(-1)).unsqueeze(1).to(x.dtype)
            elif self.position_embed is not None:
                x = x + self.position_embed(start.view(-1, 1)).to(x.dtype)
            return self.dropout(x)
        if start + n > self.cfg.max_positions:
            raise ValueError(
                f"sequence of {start + n} tokens exceeds model.max_positions "
                f"({self.cfg.max_positions})"
            )
        x = self.embed(ids) * math.sqrt(self.cfg.d_model)
        if self.fixed_positions:
            x = x + self.positions[start : start + n].to(x.dtype)
        elif self.position_embed is not None:
            x = x + self.position_embed.weight[start : start + n].to(x.dtype)
        return self.dropout(x)

    def encode(
        self, src: Tensor | Groups, padded: bool = True
    ) -> tuple[Tensor | Groups, Tensor | Groups | None]:
        """(B, S) source ids -> memory (B, S, d) and src_mask (B, 1, S), True on real tokens.

        A caller that knows `src` holds no padding passes padded=False: the mask is then None,
        which lets attention use its fastest kernels (flash attention takes no mask).
        Sources of several padded lengths (`Groups`, model/groups.py) are encoded group by
        group, into a `Groups` memory and mask that `decode` takes as it takes tensors.
        """
        if isinstance(src, Groups):
            out = [self.encode(part, padded) for part in src.parts]
            masks = [mask for _, mask in out]
            return Groups([x for x, _ in out]), None if not padded else Groups(masks)
        src_mask = (src != PAD_ID).unsqueeze(1) if padded else None  # (B, 1, S)
        x = self.embed_tokens(src)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, src_mask

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor | Groups,
        src_mask: Tensor | Groups | None,
        cache: GrowingCache | StaticCache | RaggedCache | None = None,
    ) -> Tensor:
        """(B, T) decoder inputs -> logits (B, T, V): the output projection of `states`.

        With `cache` (`new_cache()` or `new_static_cache()`, model/cache.py), `tgt_in` holds
        only the positions not yet decoded, and the cache is extended in place: incremental
        decoding gives the same logits as decoding the whole prefix at once.
        """
        return self.output_projection(self.states(tgt_in, memory, src_mask, cache))

    def states(
        self,
        tgt_in: Tensor,
        memory: Tensor | Groups,
        src_mask: Tensor | Groups | None,
        cache: GrowingCache | StaticCache | RaggedCache | None = None,
    ) -> Tensor:
        """(B, T) decoder inputs -> the decoder's output states (B, T, d), which the output
        projection takes (`decode`); `cache` as there."""
        start = 0 if cache is None else cache.length
        x = self.embed_tokens(tgt_in, start)  # (B, T, d)
        for i, layer in enumerate(self.decoder_layers):
            x = layer(x, memory, src_mask, None if cache is None else cache.layers[i])
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return x

    def full_context(
        self, tokens: Tensor, memory: Tensor, src_mask: Tensor | None, layers: int
    ) -> Tensor:
        """The alignment pass (after Garg et al. 2019's full-context alignment): the first
        `layers` decoder layers over the target tokens (B, T) themselves, not shifted behind a
        start token, at once and without the causal mask: position t reads token t and sees
        every other; padding is masked. The states after those layers (B, T, d); what is read
        is their encoder-decoder attention (model/capture.py). A recurrent self-sublayer (an
        SSRU) is causal by construction and has no such pass."""
        if decoder_self(self.cfg).recurrent:
            raise MtxError(
                f"model.decoder_self {self.cfg.decoder_self} is recurrent: it has no full-context "
                "pass (align in context causal)"
            )
        own = (tokens != PAD_ID).unsqueeze(1)  # (B, 1, T)
        x = self.embed_tokens(tokens)
        for layer in self.decoder_layers[:layers]:
            x = layer(x, memory, src_mask, full=own)
        return x

    def new_cache(self) -> GrowingCache:
        return GrowingCache(len(self.decoder_layers))

    def new_ragged_cache(self, capacity: int) -> RaggedCache:
        """A cache whose rows stand at positions of their own, each up to `capacity`
        (model/ragged.py: speculative decoding's)."""
        return RaggedCache(len(self.decoder_layers), capacity)

    def new_static_cache(self, rows: int, length: int, full: bool, like: Tensor) -> StaticCache:
        """A cache of `length` positions for `rows` hypotheses, allocated once (dtype and
        device of `like`): see StaticCache."""
        H, d_k = self.cfg.n_heads, self.cfg.d_model // self.cfg.n_heads
        kind = decoder_self(self.cfg)  # a recurrent kind keeps a cell, not keys and values
        width = kind.state_width(self.cfg) if kind.recurrent else 0
        return StaticCache(len(self.decoder_layers), rows, H, length, d_k, full, like, width)

    def fill_memory(self, cache: StaticCache, memory: Tensor) -> None:
        """Compute the cross-attention keys and values of `memory` (B, S, d) into `cache`, in
        place where it already holds some (of the same shapes)."""
        for layer, attn in zip(cache.layers, self.cross_attention_modules()):
            layer.write_memory(*attn.project_kv(memory))

    def cross_attention_modules(self) -> list[MultiHeadAttention]:
        """The encoder-decoder attention of each decoder layer (read by model/capture.py)."""
        return [layer.cross_attn for layer in self.decoder_layers]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
