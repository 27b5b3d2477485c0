"""What the export tests check of a checkpoint and its two exports: the MarianMT model's
logits and CTranslate2's log-probabilities of mtx's own translations equal mtx's."""

from __future__ import annotations

from pathlib import Path

import ctranslate2
import torch
from helpers.translating import outputs
from transformers import MarianMTModel

from mtx.data import toy
from mtx.decode.translator import Translator
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID


def check_exports(checkpoint: Path, hf_dir: Path, ct2_dir: Path, lines: int = 12) -> Translator:
    """Teacher-forced logits of `hf_dir` (random targets) and CTranslate2's scores of mtx's
    translations against the checkpoint's model, within 1e-4, on toy test lines; returns the
    checkpoint's Translator for more checks."""
    translator = Translator.from_checkpoints(checkpoint, device="cpu")
    model, sp = translator.parts.model, translator.parts.codec.vocab.sp
    texts = [src for src, _ in toy.split_pairs("test")[:lines]]
    src = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(translator.parts.codec.encode(line)) for line in texts],
        batch_first=True,
        padding_value=PAD_ID,
    )
    hyps = outputs(translator, texts)
    hf = MarianMTModel.from_pretrained(hf_dir).eval()
    ct2 = ctranslate2.Translator(str(ct2_dir), device="cpu")
    targets = [[sp.id_to_piece(i) for i in h[0].tokens] for h in hyps]
    scored = ct2.score_batch([sp.encode(line, out_type=str) for line in texts], targets)
    with torch.no_grad():
        tgt = torch.randint(4, model.vocab_size, (len(texts), 9))
        tgt[:, 0] = BOS_ID
        theirs = hf(input_ids=src, attention_mask=src != PAD_ID, decoder_input_ids=tgt).logits
        torch.testing.assert_close(theirs, model(src, tgt), atol=1e-4, rtol=0)
        for line, hyp, result in zip(texts, hyps, scored):
            one = torch.tensor([translator.parts.codec.encode(line)])
            forced = torch.tensor([[BOS_ID, *hyp[0].tokens]])
            lprobs = torch.log_softmax(model(one, forced)[0], -1)
            expected = lprobs[torch.arange(forced.size(1)), [*hyp[0].tokens, EOS_ID]]
            torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)
    return translator
