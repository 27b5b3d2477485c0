"""Word alignments from the model: which source word each output word came from.

After the search, each output is read again by the model in one forced pass (as `mtx score`
reads a pair: score.py's batches of one padded shape) up to one decoder layer (model/
capture.py's `Heads`), its encoder-decoder attention read from beside the model; the layers
above it and the output projection do not run. Where target piece t's row is read
(`decode.align_reading`):

- full: a pass over the target pieces themselves without the causal mask (the model's
  `full_context`), row t: the piece is seen, with every other, when it is aligned. What a
  model trained with guided alignment in full context (`train.align_context full`, the
  default) learnt to align in (after Garg et al. 2019).
- step: the translating pass, the row that predicts piece t, before the model knows it (a
  model trained without guidance, or guided in the causal pass).
- shift: the translating pass, the row whose input is piece t (Chen et al. 2020's Shift-Att);
  worse than step on every model measured (BENCHMARKS.md, "Word alignment").

The chosen heads' rows are averaged; pieces become words (mtx/align/pieces.py's
`word_matrix`): a target word's row is the mean of its pieces', a source word's column the sum
of its pieces', and attention on pieces that are no word (EOS, a language tag) goes to a null
word. Each target word is linked to its best source word, unless the null word is best or the
best holds less than `decode.align_threshold` (then it is unaligned). Words are the
whitespace tokens of the source line and of the detokenised output, both counted from 0
(Pharaoh's `i-j`).

Which heads (`Heads.of`): a model trained with guided alignment (train.align_weight above 0)
is read at the heads it was trained on (train.align_layer, its first train.align_heads heads);
any other at every head of decode.align_layer (-1, the last layer: of every layer and head
measured, on the toy corpus and on the RWTH gold set, the last averaged aligned best:
BENCHMARKS.md, "Word alignment"); decode.align_heads names heads explicitly (with
decode.align_layer). Negative layers count from the last (a recurrent model has one
attention: layer 0, or -1); a layer past the decoder's is refused in one line.

Why a forced pass rather than the search's own attention: every search gives the same
alignments for the same output (beam, sampling, static, shortlist, controls), the search pays
nothing when no alignment is asked for, and a sentence's alignment is the same alone and in
any batch, bit for bit on the CPU (its forced pass has the shapes it has alone; the heads are
summed on the host in float64).
"""

from __future__ import annotations

import numpy as np
import torch

from mtx.align import pieces as P
from mtx.align.links import Link
from mtx.data.batching import pad
from mtx.decode.parts import Parts
from mtx.decode.score import Scorer
from mtx.errors import MtxError
from mtx.model.capture import Heads, capture_cross_attention
from mtx.tokens import EOS_ID, UNK_ID


class Aligner:
    """Word alignments of (source ids, output ids) pairs with a translator's parts (parts.py):
    its model, codec and settings (the heads read: model/capture.py's `Heads`)."""

    def __init__(self, parts: Parts, tgt_lang: str | None = None) -> None:
        model = parts.model
        if not model.capabilities.attention:
            raise MtxError(
                "alignments read one model's attention: an ensemble has none (give one checkpoint)"
            )
        self.parts, self.scorer = parts, Scorer(parts, tgt_lang)
        self.heads = Heads.of(parts.config)
        layers = len(model.cross_attention_modules())
        Heads(parts.config.decode.align_layer).index(layers)  # a layer out of range: refused
        self.layer = self.heads.index(layers)
        self.n_prefix = len(parts.codec.languages.source_prefix(tgt_lang) or ())
        vocab = parts.codec.vocab
        self.text: list[str | None] = [
            None if _special(vocab, i) else vocab.id_to_piece(i)
            for i in range(vocab.get_piece_size())
        ]

    def word_links(self, src: list[list[int]], outputs: list[list[int]]) -> list[set[Link]]:
        """The word links of each (source ids with EOS, output ids without EOS) pair: each
        target word with its best source word (`word_matrices`), unless the null word (EOS,
        a language tag) is best or the best holds less than decode.align_threshold."""
        threshold = self.parts.config.decode.align_threshold
        out = []
        for matrix in self.word_matrices(src, outputs):
            null = matrix.shape[1] - 1
            best = matrix.argmax(-1)  # (target words,); a matrix has the null column
            weight = matrix[np.arange(len(best)), best]
            out.append({
                (int(i), j) for j, (w, i) in enumerate(zip(weight.tolist(), best.tolist()))
                if i != null and w >= threshold
            })  # fmt: skip
        return out

    def word_matrices(self, src: list[list[int]], outputs: list[list[int]]) -> list[np.ndarray]:
        """Per (source ids with EOS, output ids without EOS) pair, the attention of each
        target word over the source words and, last, the null word (pieces.py's
        `word_matrix`; float64, on the CPU)."""
        tgt = [list(t) + [EOS_ID] for t in outputs]
        return [
            P.word_matrix(matrix, self.words(s, self.n_prefix), self.words(t))
            for s, t, matrix in zip(src, outputs, self.matrices(src, tgt))
        ]

    def words(self, ids: list[int], skip: int = 0) -> list[int | None]:
        """The word of each piece of `ids` (pieces.py), the first `skip` (a source's language
        tag or code) and special ids (PAD, BOS, EOS) in none. UNK is text: a word the
        vocabulary cannot spell is still a word."""
        text = self.text  # each id's piece, None where it is no text
        return P.word_index([None if k < skip else text[i] for k, i in enumerate(ids)])

    @torch.no_grad()
    def matrices(self, src: list[list[int]], tgt: list[list[int]]) -> list[np.ndarray]:
        """Per pair, the attention (float64, on the CPU) of each target piece before EOS
        (rows) over the source pieces (columns), the heads read summed, as the reading says
        (`Heads.reading`): in a full-context pass, or in the translating pass at the row that
        predicts the piece (step) or reads it (shift)."""
        out: list[np.ndarray] = [np.empty(0) for _ in src]
        model, layer, reading = self.parts.model, self.layer, self.heads.reading
        shift = 1 if reading == "shift" else 0
        given = list(self.parts.codec.start(self.scorer.tgt_lang))
        for rows in self.scorer.batches(src, tgt):
            source, tgt_in, n = self.scorer.inputs(src, tgt, rows)
            # the layers above the one read and the output projection do not run
            with capture_cross_attention(model, [layer], stop=True) as seen:
                memory, mask = model.encode(source)
                if reading == "full":  # the tokens themselves, not shifted
                    own = [given + tgt[i] for i in rows]
                    tokens = pad(own, length=tgt_in.size(1)).to(tgt_in.device)
                    model.full_context(tokens, memory, mask, layer + 1)
                else:
                    model.decode(tgt_in, memory, mask)
            weights = self.heads.pick(seen[layer])  # (B, h, n + T, S)
            summed = weights[:, :, n + shift :].double().cpu().sum(1)  # (B, T, S), heads in order
            mean = (summed / weights.size(1)).numpy()
            for r, i in enumerate(rows):
                out[i] = mean[r, : len(tgt[i]) - 1, : len(src[i])]
        return out


def _special(vocab, i: int) -> bool:
    return i != UNK_ID and (i < 4 or vocab.is_control(i))
