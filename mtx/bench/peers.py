"""mtx's weights in the two peer engines, Hugging Face MarianMT (`mtx export --format hf`)
and CTranslate2 (`--format ctranslate2`), decoding as mtx does: for the decoding race
(decode.py) and tests/test_export.py.

Every engine gets mtx's output length limit and tokens never produced (decode/rules.py: a x
source tokens + b, EOS included; never PAD, UNK or BOS) and alpha 0 (the only setting at which
the three length penalties rank alike). The limit is per sentence in mtx and per batch in the
peers, so batches hold sentences of one limit (`batches`).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from mtx.decode import rules
from mtx.decode.translator import Translator
from mtx.tokens import EOS_ID, PAD_ID


def batches(tr: Translator, lines: list[str], size: int) -> list[tuple[int, list[int]]]:
    """(output length limit, line indices) of batches of at most `size` lines, each of one
    limit, shortest first."""
    d, groups = tr.parts.config.decode, defaultdict(list)
    limit = tr.parts.model.max_positions - 1
    for i, line in enumerate(lines):
        n = len(tr.parts.codec.encode(line)) - 1
        longest = rules.max_lengths(n, d.max_len_a, d.max_len_b, limit)
        groups[longest].append(i)
    return [
        (limit, idx[j : j + size]) for limit, idx in sorted(groups.items())
        for j in range(0, len(idx), size)
    ]  # fmt: skip


def hf_generate(
    hf, src: torch.Tensor, limit: int, beam: int, origin: list[int], never: list[int]
) -> list[list[int]]:
    """MarianMT `generate` on mtx-encoded sources (B, S) -> mtx's output ids without the
    decoder start and EOS. `origin`: MarianMT's id of each of mtx's (an imported model keeps
    its own); `never`: mtx's ids never produced."""
    table = torch.tensor(origin, device=src.device)
    back = {o: i for i, o in enumerate(origin)}
    eos = origin[EOS_ID]
    with torch.no_grad():
        out = hf.generate(
            input_ids=table[src],
            attention_mask=src != PAD_ID,
            num_beams=beam,
            length_penalty=0.0,
            early_stopping=True,
            max_new_tokens=limit,
            bad_words_ids=[[origin[i]] for i in never],
        )
    ids = []
    for row in out[:, 1:].tolist():  # drop the decoder start
        row = row[: row.index(eos)] if eos in row else row
        ids.append([back[t] for t in row if t != origin[PAD_ID]])
    return ids


def ct2_generate(ct2, vocabulary, pieces: list[list[str]], limit: int, beam: int, never: list[int]):
    """CTranslate2 `translate_batch` on SentencePiece pieces -> (output ids, score) each;
    `never`: the ids never produced."""
    results = ct2.translate_batch(
        pieces,
        beam_size=beam,
        length_penalty=0.0,
        max_decoding_length=limit - 1,  # CTranslate2 does not count the EOS
        suppress_sequences=[[vocabulary.id_to_piece(i)] for i in never],
        return_scores=True,
        max_batch_size=len(pieces),
    )
    return [([vocabulary.piece_to_id(p) for p in r.hypotheses[0]], r.scores[0]) for r in results]
