"""Word alignments from the model: which source word each output word came from.

After the search, each output is read again by the model in one forced pass (as `mtx score`
reads a pair: score.py's batches of one padded shape) up to one decoder layer (model/
capture.py's `Heads`), its encoder-decoder attention read from beside the model; the layers
above it and the output projection do not run. The attention when predicting target piece t, averaged over the
chosen heads, names one source piece: the most attended (Garg et al. 2019's hard alignment;
fairseq's and Marian's too). A target piece whose most attended source piece is no text
(EOS, a language tag) is unaligned. Piece links become word links when any pieces of the two
words are linked (mtx/align/pieces.py); words are the whitespace tokens of the source line and
of the detokenised output, both counted from 0 (Pharaoh's `i-j`).

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

import torch

from mtx.align import pieces as P
from mtx.align.links import Link
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
        self.layer = self.heads.index(len(model.cross_attention_modules()))
        self.n_prefix = len(parts.codec.languages.source_prefix(tgt_lang) or ())

    def word_links(self, src: list[list[int]], outputs: list[list[int]]) -> list[set[Link]]:
        """The word links of each (source ids with EOS, output ids without EOS) pair."""
        tgt = [list(t) + [EOS_ID] for t in outputs]
        pieces = self.piece_links(src, tgt)
        return [
            P.to_words(links, self.words(s, self.n_prefix), self.words(t))
            for s, t, links in zip(src, outputs, pieces)
        ]

    def words(self, ids: list[int], skip: int = 0) -> list[int | None]:
        """The word of each piece of `ids` (pieces.py), the first `skip` (a source's language
        tag or code) and special ids (PAD, BOS, EOS) in none. UNK is text: a word the
        vocabulary cannot spell is still a word."""
        vocab = self.parts.codec.vocab
        return P.word_index(
            [None if k < skip or _special(vocab, i) else vocab.id_to_piece(i)
             for k, i in enumerate(ids)]
        )  # fmt: skip

    @torch.no_grad()
    def piece_links(self, src: list[list[int]], tgt: list[list[int]]) -> list[list[Link]]:
        """Each target piece's (before EOS) most attended source position, per pair."""
        out: list[list[Link]] = [[] for _ in src]
        model, layer = self.parts.model, self.layer
        for rows in self.scorer.batches(src, tgt):
            source, tgt_in, n = self.scorer.inputs(src, tgt, rows)
            # the layers above the one read and the output projection do not run
            with capture_cross_attention(model, [layer], stop=True) as seen:
                memory, mask = model.encode(source)
                model.decode(tgt_in, memory, mask)
            weights = self.heads.pick(seen[layer])  # (B, h, n + T, S)
            summed = weights[:, :, n:].double().cpu().sum(1)  # (B, T, S), in order of heads
            for r, i in enumerate(rows):
                t, s = len(tgt[i]) - 1, len(src[i])
                best = summed[r, :t, :s].argmax(-1).tolist()
                out[i] = [(best[j], j) for j in range(t)]
        return out


def _special(vocab, i: int) -> bool:
    return i != UNK_ID and (i < 4 or vocab.is_control(i))
