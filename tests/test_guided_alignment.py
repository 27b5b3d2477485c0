"""Guided alignment training (train.align_weight) and the model's word alignments out of
`mtx translate`, `mtx score` and `mtx serve` (decode/align.py), against the toy corpus's gold
links (its generator says them: mtx/data/toy.py)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import run_config
from helpers.common import assert_same_parameters, invoke, mtx, records
from helpers.translating import encode, load, outputs

from mtx.align import aer
from mtx.align.links import Alignments
from mtx.bench.server import Server
from mtx.config import load_config
from mtx.data import toy
from mtx.data.aligned import align_prepared
from mtx.data.batching import alignment_targets
from mtx.decode.align import Aligner
from mtx.decode.score import Scorer
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.model.capture import capture_cross_attention
from mtx.train.loss import alignment_loss
from mtx.train.trainer import train

# two decoder layers, so that -2 (the guided layer's default) is the first
SHAPE = [
    "model.d_model=64", "model.d_ff=128", "model.n_heads=2", "model.encoder_layers=2",
    "model.decoder_layers=2", "model.dropout=0.1", "train.max_tokens=2048",
    "train.warmup_steps=100", "train.lr_scale=2",
]  # fmt: skip
GUIDED = ["train.align_weight=0.05"]
QUIET = {"log": lambda *_: None}


@pytest.fixture(scope="module")
def aligned(tmp_path_factory, prepared):
    """The shared prepared toy data, copied, with eflomal's alignments beside it."""
    run = tmp_path_factory.mktemp("aligned")
    shutil.copytree(prepared, run / "prepared")
    align_prepared(run_config(run, prepared), samplers=2, log=lambda *_: None)
    return run / "prepared"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, aligned):
    """The same model trained 150 updates without guidance, with guidance in full context
    (the default) and in the translating pass (same seed and data)."""
    root = tmp_path_factory.mktemp("guided")
    causal = [*GUIDED, "train.align_context=causal"]
    for name, extra in (("plain", []), ("guided", GUIDED), ("causal", causal)):
        train(run_config(root / name, aligned, *SHAPE, "train.max_steps=150", *extra), **QUIET)
    return root


def toy_aer(checkpoint, *overrides: str) -> float:
    """AER of the model's forced alignments of the toy test pairs against their gold links."""
    tr = Translator.from_checkpoints(checkpoint, overrides=list(overrides), device="cpu")
    pairs, gold = toy.split_pairs("test"), toy.alignments("test")
    scorer = Scorer(tr.parts)
    src = [encode(tr, en) for en, _ in pairs]
    tgt = [scorer.target_ids(de, n)[:-1] for n, (_, de) in enumerate(pairs)]
    links = Aligner(tr.parts).word_links(src, tgt)
    return aer.score(links, Alignments(list(gold), list(gold))).aer


def test_guided_training_aligns_far_better_than_any_unguided_head(runs):
    guided = toy_aer(runs / "guided" / "checkpoints" / "last.pt")
    plain = runs / "plain" / "checkpoints" / "last.pt"
    unguided = {
        (layer, tuple(heads)): toy_aer(
            plain, f"decode.align_layer={layer}", f"decode.align_heads={','.join(map(str, heads))}"
        )
        for layer in (0, 1)
        for heads in ([], [0], [1])
    }
    causal = toy_aer(runs / "causal" / "checkpoints" / "last.pt")
    # 150 updates: the guided head already links most words right; no unguided head does
    assert guided < min(unguided.values()) - 0.15, (guided, unguided)
    # trained and read where the word is seen, the head learns far faster than where the word
    # is predicted (0.25 against 0.70 on one host)
    assert guided < causal - 0.15, (guided, causal)
    # its loss is logged on its own, and falls; a run without guidance logs none
    logged = [r["align_loss"] for r in records(runs / "guided", "train")]
    assert len(logged) > 20 and np.mean(logged[-10:]) < 0.9 * np.mean(logged[:10]), logged
    assert all("align_loss" not in r for r in records(runs / "plain", "train"))


def test_guidance_costs_no_translation_quality_on_the_toy_corpus(runs):
    nll = {
        name: [r["valid_nll"] for r in records(runs / name, "valid")][-1]
        for name in ("plain", "guided")
    }
    assert nll["guided"] < nll["plain"] * 1.1, nll


def test_alignment_loss_is_the_cross_entropy_with_the_normalised_links():
    torch.manual_seed(0)
    weights = torch.softmax(torch.randn(1, 2, 3, 4), -1)  # (B, H, T, S)
    # target 0 linked to sources 0 and 2, target 2 to source 1
    index, share = alignment_targets([np.array([[0, 0], [2, 0], [1, 2]])])
    assert sorted(index.tolist()) == [[0, 0, 0], [0, 0, 2], [0, 2, 1]]
    assert sorted(share.tolist()) == [0.5, 0.5, 1.0]
    a = weights.mean(1)[0]
    expected = -(0.5 * a[0, 0].log() + 0.5 * a[0, 2].log() + a[2, 1].log())
    torch.testing.assert_close(alignment_loss(weights, index, share), expected)
    assert alignment_targets([np.zeros((0, 2))])[0].shape == (0, 3)


@pytest.mark.slow  # training runs (resuming exactly: test_trainer.py and test_ema.py in the default run)
def test_guided_training_resumes_exactly_with_ema(tmp_path, aligned):
    both = [*SHAPE, *GUIDED, "train.ema=0.99", "train.valid_every=8"]
    train(run_config(tmp_path / "whole", aligned, *both, "train.max_steps=16"), **QUIET)
    train(run_config(tmp_path / "parts", aligned, *both, "train.max_steps=8"), **QUIET)
    train(
        run_config(tmp_path / "parts", aligned, *both, "train.max_steps=16"), resume=True, **QUIET
    )
    for name in ("last.pt", "best.pt"):  # EMA's weights, and the resumable state
        assert_same_parameters(
            *(tmp_path / run / "checkpoints" / name for run in ("whole", "parts"))
        )


def test_fine_tuning_an_unguided_checkpoint_with_guidance(tmp_path, runs, aligned):
    start = runs / "plain" / "checkpoints" / "last.pt"
    cfg = run_config(tmp_path / "tuned", aligned, *SHAPE, *GUIDED, "train.max_steps=4",
                     f"train.init_from={start}")  # fmt: skip
    train(cfg, **QUIET)
    assert all("align_loss" in r for r in records(tmp_path / "tuned", "train"))


def test_guidance_without_alignments_or_with_stale_ones_is_refused(tmp_path, prepared, aligned):
    with pytest.raises(MtxError, match="train.align_weight needs alignments of the training data"):
        train(run_config(tmp_path / "none", prepared, *SHAPE, *GUIDED), **QUIET)
    stale = tmp_path / "stale" / "prepared"
    shutil.copytree(aligned, stale)
    info = json.loads((stale / "align" / "info.json").read_text())
    (stale / "align" / "info.json").write_text(json.dumps(info | {"train_sha256": "0"}))
    with pytest.raises(MtxError, match="holds alignments of other prepared data"):
        train(run_config(tmp_path / "stale", stale, *SHAPE, *GUIDED), **QUIET)
    # the same text, another vocabulary (links of other pieces), or links of an older mtx
    for changed in ({"vocabulary_sha256": "0"}, {}):
        stale_info = {k: v for k, v in info.items() if k != "vocabulary_sha256"} | changed
        (stale / "align" / "info.json").write_text(json.dumps(stale_info))
        with pytest.raises(MtxError, match="holds alignments of other prepared data"):
            train(run_config(tmp_path / "stale", stale, *SHAPE, *GUIDED), **QUIET)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["data.bpe_dropout=0.1"], "use one or the other"),
        (["train.align_layer=2"], r"train.align_layer \(2\) is not a decoder layer"),
        (["train.align_heads=3"], r"train.align_heads \(3\) is more than model.n_heads \(2\)"),
        (["model.arch=rnn"], "guides a Transformer's attention"),
    ],
)
def test_impossible_guidance_settings_are_refused(tmp_path, extra, message):
    with pytest.raises(MtxError, match=message):
        load_config(None, [f"run_dir={tmp_path}", *SHAPE, *GUIDED, *extra])


def test_a_sentences_alignment_is_the_same_alone_and_in_any_batch(runs):
    ckpt = runs / "guided" / "checkpoints" / "last.pt"
    tr = load(ckpt)
    lines = [en for en, _ in toy.split_pairs("test")[:48]]
    asked = dict(alignments=True, nbest=2)
    together = [[h.links for h in hyps] for hyps in outputs(tr, lines, **asked)]
    small = load(ckpt, batch_tokens=40)
    assert [[h.links for h in hyps] for hyps in outputs(small, lines, **asked)] == together
    for k in (0, 7, 31):
        assert [h.links for h in outputs(tr, [lines[k]], **asked)[0]] == together[k]
    assert all(links for hyps in together for links in hyps)


def test_translate_score_and_serve_give_the_same_alignments(tmp_path, runs):
    ckpt = runs / "guided" / "checkpoints" / "last.pt"
    lines = [en for en, _ in toy.split_pairs("test")[:6]]
    text = "".join(x + "\n" for x in lines)
    plain = mtx("translate", "--checkpoint", ckpt, "--device", "cpu", input=text).output
    out = mtx("translate", "--checkpoint", ckpt, "--device", "cpu", "--alignments", input=text)
    rows = [line.split(" ||| ") for line in out.output.splitlines()]
    assert [r[0] for r in rows] == plain.splitlines()  # the translations are unchanged
    for source, (translation, links) in zip(lines, rows):
        for i, j in (map(int, link.split("-")) for link in links.split()):
            assert i < len(source.split()) and j < len(translation.split())
    jsonl = mtx(
        "translate",
        "--checkpoint",
        ckpt,
        "--device",
        "cpu",
        "--alignments",
        "--json",
        "--nbest",
        "2",
        input="".join(json.dumps({"text": x}) + "\n" for x in lines),
    )
    results = [json.loads(line) for line in jsonl.output.splitlines()]
    assert [" ".join(f"{i}-{j}" for i, j in r["alignments"]) for r in results] == [
        r[1] for r in rows
    ]
    assert all("alignments" in o for r in results for o in r["nbest"])
    # mtx score aligns given pairs: a translation it is given is aligned as translate aligned it
    (tmp_path / "s").write_text(text)
    (tmp_path / "t").write_text("".join(r[0] + "\n" for r in rows))
    scored = mtx("score", "--checkpoint", ckpt, "--src", tmp_path / "s", "--tgt", tmp_path / "t",
                 "--alignments", "--device", "cpu")  # fmt: skip
    assert [line.split("\t")[3] for line in scored.output.splitlines()] == [r[1] for r in rows]
    with Server(ckpt, "serve.workers=1") as s:
        status, answer = s.translate(lines, alignments=True, nbest=2)
        assert status == 200
        assert answer["results"] == results
        status, answer = s.translate(lines[:1])
        assert status == 200 and "alignments" not in answer["results"][0]


def test_an_ensemble_gives_no_alignments(runs):
    ckpts = [runs / name / "checkpoints" / "last.pt" for name in ("plain", "guided")]
    out = invoke("translate", "--checkpoint", ckpts[0], "--checkpoint", ckpts[1], "--alignments",
                 "--device", "cpu", input="a dog.\n")  # fmt: skip
    assert out.exit_code == 2
    assert "decode.alignments reads one model's attention" in out.output


@pytest.mark.parametrize(
    "decode, controls",
    [
        ({"beam": 1}, {}),
        ({"sampling": True, "seed": 3}, {}),
        ({"search": "static"}, {}),
        ({}, {"prefix": "der"}),
        ({}, {"constraints": ["hund"]}),
        ({}, {"alternatives": 2}),
    ],
)
def test_every_engine_gives_alignments(runs, decode, controls):
    from mtx.decode.controls import Controls, Line

    ckpt = runs / "guided" / "checkpoints" / "last.pt"
    tr = load(ckpt, **decode, alignments=True)
    lines = [en for en, _ in toy.split_pairs("test")[:8]]
    items = [Line(x, Controls(**controls)) if controls else x for x in lines]
    for line, hyps in zip(lines, outputs(tr, items)):
        for h in hyps:
            words = len(h.text.split())
            assert h.links and all(i < len(line.split()) and j < words for i, j in h.links)


def test_corpus_translation_writes_alignments_and_resumes_with_them(tmp_path, runs):
    ckpt = runs / "guided" / "checkpoints" / "last.pt"
    lines = [en for en, _ in toy.split_pairs("test")[:20]]
    (tmp_path / "in.en").write_text("".join(x + "\n" for x in lines))
    args = ["translate", "--checkpoint", ckpt, "--device", "cpu", "--alignments"]
    streamed = mtx(*args, input="".join(x + "\n" for x in lines)).output
    mtx(*args, "--input", tmp_path / "in.en", "--output", tmp_path / "out", "--chunk-lines", "8")
    assert (tmp_path / "out").read_text() == streamed
    # a resumed job must ask what the first asked
    out = invoke(
        *args[:-1], "--input", tmp_path / "in.en", "--output", tmp_path / "out", "--resume"
    )
    assert out.exit_code == 2 and "alignments" in out.output


def test_the_forced_pass_stops_at_the_layer_it_reads(runs, monkeypatch):
    tr = Translator.from_checkpoints(runs / "plain" / "checkpoints" / "last.pt", device="cpu")
    model = tr.parts.model
    src = torch.tensor([encode(tr, "the dog sleeps.")])
    tgt_in = torch.tensor([[2, 10, 11, 12, 13]])
    with torch.no_grad():
        memory, mask = model.encode(src)
        with capture_cross_attention(model, [0]) as seen:
            model.decode(tgt_in, memory, mask)
        full = seen[0]
        ran = []
        monkeypatch.setattr(type(model), "output_projection", lambda *a: ran.append("out"))
        model.decoder_layers[1].register_forward_pre_hook(lambda *a: ran.append(1))
        with capture_cross_attention(model, [0], stop=True) as seen:
            model.decode(tgt_in, memory, mask)
    assert torch.equal(seen[0], full) and not ran  # layer 1 and the projection never ran


def test_a_word_the_vocabulary_cannot_spell_is_still_a_word(runs):
    tr = Translator.from_checkpoints(runs / "guided" / "checkpoints" / "last.pt", device="cpu")
    line = "the dog ☃ sees a cat."  # the snowman is no piece of the toy vocabulary
    ids = encode(tr, line)
    assert 1 in ids  # UNK
    words = Aligner(tr.parts).words(ids)
    assert max(w for w in words if w is not None) + 1 == len(line.split())
    links = outputs(tr, [line], alignments=True)[0][0].links
    assert all(i < len(line.split()) for i, _ in links)


@pytest.mark.parametrize("layer", ["99", "-99"])
def test_a_layer_the_decoder_lacks_is_refused_even_where_the_guided_heads_are_read(runs, layer):
    tr = Translator.from_checkpoints(
        runs / "guided" / "checkpoints" / "last.pt", [f"decode.align_layer={layer}"], device="cpu"
    )
    with pytest.raises(MtxError, match=f"decode.align_layer {layer}: the decoder has 2 layer"):
        outputs(tr, ["the dog sleeps."], alignments=True)
