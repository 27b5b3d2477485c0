"""Check `mtx export` on real data: do the Hugging Face MarianMT and CTranslate2 exports
compute and translate what mtx does?

    python scripts/check_export.py --checkpoint RUN/checkpoints/best.pt \
        --src ../shared/data/multi30k/test2016.en [--lines N] [--json]

Exports the checkpoint both ways into a temporary directory, then reports:
- the largest logit difference between mtx and MarianMT (teacher forcing mtx's outputs);
- the largest log-probability difference between mtx and CTranslate2 (`score_batch`);
- the share of lines translated identically with greedy search and with beam search
  (beam 4, alpha 0, so that every engine ranks by the summed log-probability: Marian and
  CTranslate2 divide by length ** alpha, mtx by ((5 + length) / 6) ** alpha; see peers.py);
- for CTranslate2's beam differences, how many are outputs the model scores higher (its beam
  search runs until the best candidate ends, mtx's until K hypotheses have ended).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from peers import ct2_translate, hf_translate

from mtx.config import DecodeConfig
from mtx.data.batching import pad
from mtx.data.sources import read_lines
from mtx.decode.translator import Translator
from mtx.export import export
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, type=Path)
    ap.add_argument("--src", required=True, type=Path, help="source sentences, one per line")
    ap.add_argument("--lines", type=int, default=0, help="only the first N lines (0 = all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import ctranslate2
    from transformers import MarianMTModel

    torch.manual_seed(0)
    lines = list(read_lines(args.src))
    lines = lines[: args.lines] if args.lines else lines
    tr = Translator.from_checkpoint(args.checkpoint, ["decode.alpha=0"], device="cpu")
    greedy = Translator(
        tr.model, replace(tr.cfg, decode=DecodeConfig(beam=1)), tr.sp.serialized_model_proto()
    )
    with tempfile.TemporaryDirectory() as tmp:
        export(args.checkpoint, "hf", Path(tmp) / "hf")
        export(args.checkpoint, "ctranslate2", Path(tmp) / "ct2")
        hf = MarianMTModel.from_pretrained(Path(tmp) / "hf").eval()
        ct2 = ctranslate2.Translator(str(Path(tmp) / "ct2"), device="cpu")

        mtx_beam = tr.translate_ids(lines)
        mtx_greedy = greedy.translate_ids(lines)
        # Logits and log-probabilities on mtx's own beam outputs (first 64 lines).
        n = min(64, len(lines))
        src = pad([tr.encode(line) for line in lines[:n]])
        tgt_in = pad([[BOS_ID, *h[0].tokens] for h in mtx_beam[:n]])
        with torch.no_grad():
            ours = tr.model(src, tgt_in)
            theirs = hf(
                input_ids=src, attention_mask=src != PAD_ID, decoder_input_ids=tgt_in
            ).logits
        real = (tgt_in != PAD_ID).unsqueeze(-1)
        logit_diff = (ours - theirs).abs().masked_fill(~real, 0).max().item()
        scored = ct2.score_batch(
            [tr.sp.encode(line, out_type=str) for line in lines[:n]],
            [[tr.sp.id_to_piece(i) for i in h[0].tokens] for h in mtx_beam[:n]],
        )
        lp = torch.log_softmax(ours, -1)
        lprob_diff = 0.0
        for b, (h, r) in enumerate(zip(mtx_beam[:n], scored)):
            target = [*h[0].tokens, EOS_ID]
            expected = lp[b, torch.arange(len(target)), target]
            lprob_diff = max(lprob_diff, (expected - torch.tensor(r.log_probs)).abs().max().item())

        hf_greedy = hf_translate(hf, tr, lines, 1)
        hf_beam = hf_translate(hf, tr, lines, 4)
        ct2_greedy = ct2_translate(ct2, tr, lines, 1)
        ct2_beam = ct2_translate(ct2, tr, lines, 4)

    def same(a, b):
        return sum(x == y for x, y in zip(a, b)) / len(lines)

    text = [tr.detokenize(h[0].tokens) for h in mtx_beam]
    text_greedy = [tr.detokenize(h[0].tokens) for h in mtx_greedy]
    beam_diffs = [(c, m[0]) for c, m in zip(ct2_beam, mtx_beam) if c[0] != m[0].tokens]
    result = {
        "checkpoint": str(args.checkpoint),
        "lines": len(lines),
        "max_logit_diff_hf": logit_diff,
        "max_logprob_diff_ct2": lprob_diff,
        "same_greedy_hf": same(text_greedy, hf_greedy),
        "same_beam_hf": same(text, hf_beam),
        "same_greedy_ct2": same([h[0].tokens for h in mtx_greedy], [c[0] for c in ct2_greedy]),
        "same_beam_ct2": same([h[0].tokens for h in mtx_beam], [c[0] for c in ct2_beam]),
        "ct2_beam_diffs": len(beam_diffs),
        "ct2_beam_diffs_scored_higher": sum(c[1] > m.score for c, m in beam_diffs),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:32} {value:.6g}" if isinstance(value, float) else f"{key:32} {value}")


if __name__ == "__main__":
    main()
