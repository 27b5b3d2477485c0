"""`mtx import` and decoding at the real shape of an OPUS-MT model, against transformers and
CTranslate2.

    python -m benchmarks.pretrained [--lines 100] [--threads 2] [--work DIR] [--json] [--nllb]

These machines cannot reach the hub, so the model is built here: MarianMT with
`opus-mt-de-en`'s exact configuration (d_model 512, 6+6 layers, 8 heads, feed-forward 2048,
swish, vocabulary 58,101, 512 positions, a non-zero final_logits_bias: about 74M parameters)
and random weights; its source.spm and target.spm are SentencePiece unigram models trained on
Multi30k's German and English (up to 8,000 pieces each), vocab.json their pieces and fillers up to
58,101. Measured: the seconds of `mtx import` (a process of its own, timed by the harness),
then `mtx bench decode` on the first --lines of test2016.de, mtx against Hugging Face's
`generate` and CTranslate2 on the same weights, threads and beams (its own export). A random
model never ends a sentence, so the imported checkpoint's longest output is cut to its source
length + 5 (decode.max_len_a 1, max_len_b 5), about a translation's length, for every engine.

With --nllb: an M2M100 model of NLLB-200-distilled-600M's exact configuration (d_model 1024,
12+12 layers, 16 heads, feed-forward 4096, ReLU, vocabulary 256,206: about 615M parameters),
random weights (`build_nllb`); the seconds of its import, and mtx's decoding speed on
test2016.en (eng_Latn -> deu_Latn) alone.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
from pathlib import Path

from mtx.bench.harness import ROOT, mtx, result, timed

M30K = Path(os.environ.get("M30K", ROOT / "data" / "multi30k"))  # mtx fetch multi30k
OPUS_MT_DE_EN = dict(
    vocab_size=58101, decoder_vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6,
    encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
    decoder_ffn_dim=2048, activation_function="swish", max_position_embeddings=512,
    pad_token_id=58100, eos_token_id=0, bos_token_id=0, decoder_start_token_id=58100,
    forced_eos_token_id=0, scale_embedding=True, share_encoder_decoder_embeddings=True,
    num_beams=4,
)  # fmt: skip


def sentencepiece(path: Path, size: int) -> bytes:
    import sentencepiece as spm

    out = io.BytesIO()
    lines = path.read_text(encoding="utf-8").splitlines()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=out, model_type="unigram", vocab_size=size,
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, num_threads=2,
    )  # fmt: skip
    return out.getvalue()


def build(out: Path) -> int:
    """The MarianMT directory `out`; returns the model's parameter count."""
    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True)
    protos = [sentencepiece(M30K / f"train.{lang}", 8000) for lang in ("de", "en")]
    pieces: list[str] = []
    for name, proto in zip(("source.spm", "target.spm"), protos):
        (out / name).write_bytes(proto)
        sp = spm.SentencePieceProcessor(model_proto=proto)
        known = set(pieces)
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if not (sp.is_control(i) or sp.is_unknown(i)) and piece not in known:
                pieces.append(piece)
                known.add(piece)
    size = OPUS_MT_DE_EN["vocab_size"]
    pieces += [f"▁filler{i}" for i in range(size - 3 - len(pieces))]
    table = ["</s>", "<unk>", *pieces, "<pad>"]
    (out / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(table)}))
    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(**OPUS_MT_DE_EN)).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.1)
    model.save_pretrained(out)
    tokenizer = MarianTokenizer(*(str(out / f) for f in ("source.spm", "target.spm", "vocab.json")))
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


# facebook/nllb-200-distilled-600M's configuration (its config.json)
NLLB_600M = dict(
    vocab_size=256206, d_model=1024, encoder_layers=12, decoder_layers=12,
    encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
    decoder_ffn_dim=4096, activation_function="relu", max_position_embeddings=1024,
    pad_token_id=1, eos_token_id=2, bos_token_id=0, decoder_start_token_id=2,
    scale_embedding=True, num_beams=4,
)  # fmt: skip


def build_nllb(out: Path) -> int:
    """The M2M100 directory `out` at NLLB-200-distilled-600M's shape, random weights; its
    tokenizer a SentencePiece BPE model trained on Multi30k's English and German (8,000
    pieces, NLLB's ids) with NllbTokenizer's 202 language codes: the weights' rows past its
    tokens are unused. Returns the parameter count."""
    import sentencepiece as spm
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    out.mkdir(parents=True)
    text = [line for lang in ("en", "de") for line in lines_of(M30K / f"train.{lang}")]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=proto, model_type="bpe", vocab_size=8000,
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, num_threads=2,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
    )  # fmt: skip
    (out / "sentencepiece.bpe.model").write_bytes(proto.getvalue())
    codes = FAIRSEQ_LANGUAGE_CODES  # given: from a bare SentencePiece model none are added
    tokenizer = NllbTokenizer.from_pretrained(
        str(out), src_lang="eng_Latn", additional_special_tokens=codes
    )
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(M2M100Config(**NLLB_600M)).eval()
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def cut_outputs(path: Path) -> None:
    """The checkpoint's longest output: source length + 5 (a random model never ends)."""
    from mtx.checkpoint import Checkpoint

    ckpt = Checkpoint.load(path)
    ckpt.config.decode.max_len_a, ckpt.config.decode.max_len_b = 1.0, 5
    ckpt.save(path)


# family: (build, languages of --src-lang and --tgt-lang, test2016's sides, engines, rounds)
FAMILIES = {
    "marian": (build, ("de", "en"), ("de", "en"), "mtx,hf,ct2", "2"),
    # the peers' runners give no target-language code: mtx alone
    "nllb": (build_nllb, ("eng_Latn", "deu_Latn"), ("en", "de"), "mtx", "1"),
}


def import_and_race(family: str, a) -> dict:
    """Build the family's model, time `mtx import`, race `mtx bench decode` on it."""
    make, (src_lang, tgt_lang), (src, tgt), engines, rounds = FAMILIES[family]
    with tempfile.TemporaryDirectory(dir=a.work) as tmp:
        work = Path(tmp)
        parameters = make(work / "model")
        ckpt = work / "imported.pt"
        seconds = timed(
            lambda: mtx("import", work / "model", "--output", ckpt,
                        "--src-lang", src_lang, "--tgt-lang", tgt_lang),
            repeats=1, warmup=0,
        )[0].median  # fmt: skip
        cut_outputs(ckpt)
        race = mtx(
            "bench", "decode", "--checkpoint", ckpt, "--src", M30K / f"test2016.{src}",
            "--ref", M30K / f"test2016.{tgt}", "--lines", str(a.lines), "--threads",
            str(a.threads), "--engines", engines, "--rounds", rounds, "--json",
        )  # fmt: skip
    return {"parameters": parameters, "import_seconds": seconds, "decode": json.loads(race.stdout)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nllb", action="store_true", help="NLLB-200-distilled-600M's shape instead")
    a = ap.parse_args(argv)
    family = "nllb" if a.nllb else "marian"
    figures = import_and_race(family, a)
    name = "pretrained-nllb" if a.nllb else "pretrained"
    out = result(name, figures, lines=a.lines, threads=a.threads)
    if a.json:
        print(json.dumps(out))
        return
    parameters, seconds = figures["parameters"], figures["import_seconds"]
    print(f"import of a {parameters / 1e6:.1f}M-parameter {family} model: {seconds:.1f} s")
    for row in figures["decode"]["results"]:
        print(
            f"{row['engine']:>6} beam {row['beam']}: {row['tokens_per_s']:,.0f} tokens/s, "
            f"{row['sentences_per_s']:.1f} sentences/s, same as mtx {row.get('same_as_mtx')}"
        )


if __name__ == "__main__":
    main()
