"""The recurrent baseline the paper measures itself against: an attentional RNN encoder-decoder
(Bahdanau et al. 2014; Luong et al. 2015), `model.arch: rnn`.

Shape legend: B batch, S source length, T target length, N decoder rows (B, or B * beam),
d = d_model, L decoder layers, V vocabulary size.

- Encoder: `model.encoder_layers` bidirectional LSTM or GRU layers (`model.rnn_cell`), d / 2
  units each way; the layer's output at position s is [forward h_s; backward h_s] (d).
  Padding (at the end of a row) leaves the backward direction at its zero start state until
  the sentence's last token, so a padded sentence is encoded as it would be alone.
- Bridge: the decoder's initial states h_0 of every layer are tanh(W_b [forward state after
  the last token; backward state after the first] + b); LSTM cell states start at zero.
- Decoder (Luong et al.'s global attention with input feeding), `model.decoder_layers` layers
  of d units; at step t, with y_{t-1} the previous token:

      h_t      = RNN([e(y_{t-1}); h~_{t-1}], h_{t-1})     the stack's top state
      c_t      = sum_s a_ts h_s,  a_t = attention(h_t)      (rnn_attention.py)
      h~_t     = tanh(W_c [c_t; h_t])                       the attentional state
      P(y_t)   = softmax(E h~_t)

  h~_t is fed to the next step's input ("input feeding"). The embedding matrix E is shared by
  the source, the target and the output projection, and inputs are e(y) = sqrt(d) E y, as in
  the Transformer (base.py).
- Dropout (`model.dropout`) on embeddings, between layers, and on h~_t.
- Initialisation: uniform(-0.1, 0.1) (Sutskever et al. 2014; Luong et al.), LSTM forget-gate
  biases 1 (Jozefowicz et al. 2015); E ~ N(0, 1 / d) as in the Transformer, so the scaled
  inputs start at unit variance (with E itself at +-0.1 the cells saw inputs of about 0.06,
  and the toy corpus stalled at perplexity 60 for hundreds of updates).

The cells are written out (`Cell`, the gate equations of torch.nn.LSTMCell / GRUCell) with the
row-stable products and sigmoid of rows.py, so that, as with the Transformer, a sentence gets
the same numbers in any batch. The decoder runs step by step: input feeding makes each step need the
last one's output.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mtx.config import ModelConfig
from mtx.model.base import EncoderDecoder
from mtx.model.cache import RecurrentState
from mtx.model.interface import Capabilities, Lacks
from mtx.model.packed import PackedLinear
from mtx.model.rnn_attention import RecurrentAttention
from mtx.model.rows import linear, sigmoid
from mtx.tokens import PAD_ID

GATES = {"lstm": 4, "gru": 3}


class Cell(nn.Module):
    """One LSTM or GRU step, with torch.nn.LSTMCell's and GRUCell's parameters and equations:

    LSTM  i, f, g, o = split(W_ih x + b_ih + W_hh h + b_hh)
          c' = sigmoid(f) c + sigmoid(i) tanh(g),  h' = sigmoid(o) tanh(c')
    GRU   r = sigmoid(W_ir x + b_ir + W_hr h + b_hr),  z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
          n = tanh(W_in x + b_in + r (W_hn h + b_hn)),  h' = (1 - z) n + z h

    The input product is separate (`project_input`), so a layer can compute it for every
    position at once."""

    def __init__(self, kind: str, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.kind, self.hidden_size = kind, hidden_size
        gates = GATES[kind] * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(gates, input_size))
        self.weight_hh = nn.Parameter(torch.empty(gates, hidden_size))
        self.bias_ih = nn.Parameter(torch.empty(gates))
        self.bias_hh = nn.Parameter(torch.empty(gates))

    def project_input(self, x: Tensor) -> Tensor:
        """(..., input_size) -> (..., gates * hidden): W_ih x + b_ih."""
        return linear(x, self.weight_ih, self.bias_ih)

    def forward(self, xw: Tensor, h: Tensor, c: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """One step from the projected input xw (N, gates * hidden) and the state h, c (N,
        hidden; c is None for a GRU) -> the new h, c."""
        hw = linear(h, self.weight_hh, self.bias_hh)
        if self.kind == "lstm":
            i, f, g, o = (xw + hw).chunk(4, dim=-1)
            c = sigmoid(f) * c + sigmoid(i) * torch.tanh(g)
            return sigmoid(o) * torch.tanh(c), c
        xr, xz, xn = xw.chunk(3, dim=-1)
        hr, hz, hn = hw.chunk(3, dim=-1)
        r, z = sigmoid(xr + hr), sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        return n + z * (h - n), None  # (1 - z) n + z h

    def zero_state(self, rows: int, like: Tensor) -> tuple[Tensor, Tensor | None]:
        h = like.new_zeros(rows, self.hidden_size)
        return h, (h if self.kind == "lstm" else None)


class BidirectionalLayer(nn.Module):
    """One encoder layer: a forward and a backward cell over the sequence, outputs concatenated."""

    def __init__(self, kind: str, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.forward_cell = Cell(kind, input_size, hidden_size)
        self.backward_cell = Cell(kind, input_size, hidden_size)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x (B, S, input), mask (B, S, 1) 1.0 on real tokens or None -> (B, S, 2 * hidden),
        zero at padding."""
        outputs = []
        for cell, steps in (
            (self.forward_cell, range(x.size(1))),
            (self.backward_cell, reversed(range(x.size(1)))),
        ):
            xw = cell.project_input(x)  # every position in one product
            h, c = cell.zero_state(x.size(0), x)
            out: list[Tensor] = [x] * x.size(1)
            for s in steps:
                h, c = cell(xw[:, s], h, c)
                if mask is not None:  # padding keeps the state at zero
                    h = h * mask[:, s]
                    c = None if c is None else c * mask[:, s]
                out[s] = h
            outputs.append(torch.stack(out, dim=1))
        return torch.cat(outputs, dim=-1)


class RNN(EncoderDecoder, Lacks, nn.Module):
    capabilities = Capabilities(output_matrix=True, attention=True)
    PARTS = {
        "embeddings": ("embed.",),  # shared by both sides and the output layer
        "encoder": ("encoder_layers.",),
        "decoder": ("bridge.", "decoder_cells.", "attention.", "combine."),
    }

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        d, kind = cfg.d_model, cfg.rnn_cell
        self.embed = nn.Embedding(vocab_size, d, padding_idx=PAD_ID)
        self.logits_bias = None  # model.output_bias is the Transformer's
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(
            BidirectionalLayer(kind, d, d // 2) for _ in range(cfg.encoder_layers)
        )
        self.bridge = nn.Linear(d, cfg.decoder_layers * d)
        self.decoder_cells = nn.ModuleList(
            Cell(kind, 2 * d if i == 0 else d, d) for i in range(cfg.decoder_layers)
        )
        self.attention = RecurrentAttention(cfg.attention, d, cfg.max_positions)
        self.combine = nn.Linear(2 * d, d, bias=False)  # W_c
        self.packed_output: PackedLinear | None = None  # see pack()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in self.parameters():
            nn.init.uniform_(p, -0.1, 0.1)
        nn.init.normal_(self.embed.weight, mean=0.0, std=self.cfg.d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[PAD_ID].zero_()
            for module in self.modules():
                if isinstance(module, Cell) and module.kind == "lstm":
                    H = module.hidden_size
                    module.bias_ih[H : 2 * H] = 1.0  # forget gate (i, f, g, o)
                    module.bias_hh[H : 2 * H] = 0.0

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """(B, n) ids -> (B, n, d) embeddings scaled by sqrt(d) (unit variance at the start)."""
        return self.embed(ids) * math.sqrt(self.cfg.d_model)

    def encode(self, src: Tensor, padded: bool = True) -> tuple[Tensor, Tensor | None]:
        """(B, S) source ids -> memory (B, S, d) and src_mask (B, 1, S), True on real tokens
        (None when the caller says `src` holds no padding)."""
        if src.size(1) > self.cfg.max_positions:
            raise ValueError(
                f"sequence of {src.size(1)} tokens exceeds model.max_positions "
                f"({self.cfg.max_positions})"
            )
        src_mask = (src != PAD_ID).unsqueeze(1) if padded else None  # (B, 1, S)
        x = self.dropout(self.embed_tokens(src))
        weights = None if src_mask is None else src_mask.transpose(1, 2).to(x.dtype)
        for i, layer in enumerate(self.encoder_layers):
            x = layer(x, weights)
            if i + 1 < len(self.encoder_layers):
                x = self.dropout(x)
        return x, src_mask

    def initial_state(self, memory: Tensor, src_mask: Tensor | None) -> list[Tensor]:
        """Each decoder layer's h_0 (B, d), from the forward state after the last real token
        and the backward state after the first."""
        B, S, d = memory.shape
        last = torch.full((B,), S - 1, device=memory.device)
        if src_mask is not None:
            last = src_mask[:, 0].sum(1) - 1
        rows = torch.arange(B, device=memory.device)
        ends = torch.cat([memory[rows, last, : d // 2], memory[:, 0, d // 2 :]], dim=-1)
        h0 = torch.tanh(linear(ends, self.bridge.weight, self.bridge.bias))
        return list(h0.split(d, dim=-1))

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None,
        cache: RecurrentState | None = None,
    ) -> Tensor:
        """(N, T) decoder inputs -> logits (N, T, V): the output projection of `states`."""
        return self.output_projection(self.states(tgt_in, memory, src_mask, cache))

    def states(
        self,
        tgt_in: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None,
        cache: RecurrentState | None = None,
    ) -> Tensor:
        """(N, T) decoder inputs -> the output states h~ (N, T, d) that the output projection
        takes. N may be a multiple G of memory's B rows: rows g * G .. g * G + G - 1 (a
        sentence's beams) read memory row g.

        With `cache` (from `new_cache()`, model/cache.py's RecurrentState), `tgt_in` holds
        only the steps not yet decoded; the state keeps the decoder states and h~ (one row per
        decoder row) and the memory with its attention keys (one row per sentence), and
        `memory` may be None once it is filled."""
        state = cache if cache is not None else RecurrentState()
        if state.memory is None:
            state.memory, state.keys = memory, self.attention.keys(memory)
        memory, keys = state.memory, state.keys
        N, T = tgt_in.shape
        cells = self.decoder_cells
        hs, cs, feed = self.start_states(state, src_mask, N)
        d = self.cfg.d_model
        first = cells[0]
        embedded = self.dropout(self.embed_tokens(tgt_in))  # (N, T, d)
        xw_embedded = linear(embedded, first.weight_ih[:, :d], first.bias_ih)  # every step at once
        outputs, weights = [], []
        for t in range(T):
            xw = xw_embedded[:, t] + linear(feed, first.weight_ih[:, d:])
            for i, cell in enumerate(cells):
                if i > 0:
                    xw = cell.project_input(self.dropout(hs[i - 1]))
                hs[i], cs[i] = cell(xw, hs[i], cs[i])
            context, a = self.attention(hs[-1], keys, memory, src_mask)
            feed = self.dropout(
                torch.tanh(linear(torch.cat([context, hs[-1]], -1), self.combine.weight))
            )
            outputs.append(feed)
            weights.append(a)
        state.hs, state.cs, state.feed = hs, cs, feed
        for listener in self.attention.listeners:  # (N, 1 head, T, S): model/capture.py
            listener(torch.stack(weights, 1).unsqueeze(1))
        return torch.stack(outputs, dim=1)  # (N, T, d)

    def start_states(
        self, state: RecurrentState, src_mask: Tensor | None, N: int
    ) -> tuple[list[Tensor], list[Tensor | None], Tensor]:
        """Each decoder layer's h and c (None for a GRU) and the fed h~ (N, d) where decoding
        goes on: the state's, or at the start h_0 from the encoder (one row per decoder row),
        zero cells and a zero h~."""
        cells = self.decoder_cells
        if state.hs is not None:
            return list(state.hs), list(state.cs), state.feed
        memory = state.memory
        G = N // memory.size(0)
        hs = [h.repeat_interleave(G, 0) for h in self.initial_state(memory, src_mask)]
        cs = [torch.zeros_like(h) if cell.kind == "lstm" else None for h, cell in zip(hs, cells)]
        return hs, cs, hs[0].new_zeros(N, self.cfg.d_model)

    def new_cache(self) -> RecurrentState:
        return RecurrentState()

    def cross_attention_modules(self) -> list[RecurrentAttention]:
        return [self.attention]
