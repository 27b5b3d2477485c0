"""`mtx import` of a MarianMT (OPUS-MT) model, checked against transformers on a model built
here in OPUS-MT's exact layout (tests/helpers/opus.py): the tokenizers' ids, the logits, the
scores, greedy and beam search, the export back to MarianMT and to CTranslate2, and the
refusals of what mtx cannot take."""

from __future__ import annotations

import json
import random
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from helpers import opus
from helpers.common import assert_same_parameters, invoke, mtx, perturbed, records
from helpers.translating import encode, outputs, texts, tokens

from mtx.checkpoint import Checkpoint
from mtx.data import toy
from mtx.decode.score import Scorer
from mtx.decode.translator import Translator
from mtx.errors import MtxError

N = 20  # the longest output in the search comparisons, EOS included


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """(the MarianMT directory, its import, transformers' model and tokenizer)."""
    from transformers import MarianMTModel, MarianTokenizer

    root = tmp_path_factory.mktemp("opus")
    directory = opus.build(root / "opus-mt-en-de")
    mtx("import", directory, "--output", root / "model.pt", "--src-lang", "en", "--tgt-lang", "de")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MarianTokenizer recommends sacremoses
        tokenizer = MarianTokenizer.from_pretrained(directory)
    return directory, root / "model.pt", MarianMTModel.from_pretrained(directory).eval(), tokenizer


def translator(path, *overrides) -> Translator:
    return Translator.from_checkpoints(path, ["decode.alpha=0", *overrides], device="cpu")


def lines(n: int) -> list[str]:
    """`n` source lines: the toy corpus's, and lines of what tokenizers get wrong."""
    hard = ["", "   ", "Ünïcödé äöü ß", "123 4.5 1,000", "✓ 漢字 🙂", "a  b\tc", "ŉ ﬁ Ⅻ", "x" * 40]
    return (hard + [s for s, _ in toy.split_pairs("test")] * 10)[:n]


def targets(n: int) -> list[str]:
    return (["", "Straße 12 ✓"] + [t for _, t in toy.split_pairs("test")] * 10)[:n]


def test_an_imported_model_with_a_draft_gives_its_greedy_translations(marian, tmp_path):
    """Speculative decoding (decode.draft) with an OPUS-MT model (its decoder starts from
    <pad>, an output bias, swish) and a draft close to it: greedy search's output exactly."""
    _, path, _, _ = marian
    draft = perturbed(path, tmp_path / "draft.pt", 0.2)
    greedy = translator(path, "decode.beam=1")
    drafts = ["decode.beam=1", f"decode.draft={draft}", "decode.draft_tokens=3"]
    fast = translator(path, *drafts, "decode.draft_adaptive=false")
    assert outputs(fast, lines(120), draft=True) == outputs(greedy, lines(120))
    assert 0.0 < fast.stats.drafts.acceptance < 1.0


def test_the_tokenizers_give_transformers_ids(marian):
    directory, path, _, tokenizer = marian
    tr = translator(path)
    v = tr.parts.codec.vocab
    for line in lines(1000):
        assert [v.origin[i] for i in encode(tr, line)] == tokenizer(line).input_ids
    for line in targets(1000):
        ours = [v.origin[i] for i in v.target.encode(line)] + [v.origin[3]]
        assert ours == tokenizer(text_target=line).input_ids, line


def test_every_piece_is_detokenized_as_transformers_does(marian):
    """Each piece alone and in random runs, those the table has from the source model and the
    target model lacks among them: the text transformers' decode gives (whitespace as mtx
    writes a line: runs of it one space)."""
    _, path, _, tokenizer = marian
    tr = translator(path)
    v = tr.parts.codec.vocab
    target = v.target.sp
    ids = [i for i in range(v.get_piece_size()) if i not in v.specials]
    lacked = [i for i in ids if target.piece_to_id(v.pieces[i]) == target.unk_id()]
    assert any("\u2581" in v.pieces[i] for i in lacked)  # what left a literal ▁ before
    rng = random.Random(0)
    runs = [[i] for i in ids] + [rng.sample(ids, 6) for _ in range(500)]
    runs += [[*rng.sample(ids, 2), i, *rng.sample(lacked, 2)] for i in lacked]
    for run in runs:
        want = tokenizer.decode([v.origin[i] for i in run], skip_special_tokens=True)
        assert tr.parts.codec.detokenize(run) == " ".join(want.split()), [v.pieces[i] for i in run]


def assert_logits_equal(path, hf, tokenizer) -> None:
    """The imported model's teacher-forced logits equal transformers' within 1e-4 on 100 pairs
    (the source as mtx reads it; the decoder reading the start token, then the labels but the
    last: an NLLB model's target code among them, read after the start as mtx does)."""
    tr = translator(path)
    codec, model = tr.parts.codec, tr.parts.model
    origin = codec.vocab.origin
    for src, tgt in zip(lines(100), targets(100)):
        labels = tokenizer(text_target=tgt).input_ids
        with torch.no_grad():
            theirs = hf(
                input_ids=torch.tensor([[origin[i] for i in codec.encode(src)]]),
                decoder_input_ids=torch.tensor([[hf.config.decoder_start_token_id, *labels[:-1]]]),
            ).logits[0]
            ours_in = [model.specials.start, *codec.start(), *codec.vocab.target.encode(tgt)]
            memory, mask = model.encode(torch.tensor([codec.encode(src)]))
            ours = model.decode(torch.tensor([ours_in]), memory, mask)[0]
        torch.testing.assert_close(ours, theirs[:, origin], atol=1e-4, rtol=0)


def test_the_logits_equal_transformers(marian):
    _, path, hf, tokenizer = marian
    assert_logits_equal(path, hf, tokenizer)  # its tokenizer's ids are mtx's: the test above


def test_scores_equal_the_sum_of_transformers_log_probabilities(marian):
    _, path, hf, tokenizer = marian
    sources, refs = lines(60), targets(60)
    scores = Scorer(translator(path).parts).score(sources, refs)
    for src, tgt, score in zip(sources, refs, scores):
        labels = torch.tensor([tokenizer(text_target=tgt).input_ids])
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([tokenizer(src).input_ids]), labels=labels).logits
        theirs = logits.log_softmax(-1)[0].gather(1, labels[0][:, None]).sum().item()
        assert score.total == pytest.approx(theirs, abs=1e-3)


def only_eos_at_the_limit(eos: int, last: int = N):
    """mtx's rule at the longest output (decode/rules.py's only_eos): every token but EOS
    ruled out, EOS keeping its log-probability (transformers' forced_eos_token_id sets it to
    0, which ranks a hypothesis ended there above its worth); `last`: the length of the
    decoder's inputs before the last output token."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class OnlyEos(LogitsProcessor):
        def __call__(self, input_ids, scores):
            if input_ids.size(-1) == last:  # the decoder start and N - 1 tokens: the last next
                keep = scores[:, eos].clone()
                scores = torch.full_like(scores, -torch.inf)
                scores[:, eos] = keep
            return scores

    return LogitsProcessorList([OnlyEos()])


def generate(hf, tokenizer, sources: list[str], beam: int) -> list[list[int]]:
    """transformers' outputs under mtx's rules: alpha 0, stop at `beam` finished, PAD and UNK
    never, N tokens at most with EOS; without the decoder start and EOS."""
    out = []
    pad, eos = hf.config.pad_token_id, hf.config.eos_token_id
    for k in range(0, len(sources), 50):
        enc = tokenizer(sources[k : k + 50], return_tensors="pt", padding=True)
        with torch.no_grad():
            rows = hf.generate(
                **enc, num_beams=beam, do_sample=False, length_penalty=0.0, early_stopping=True,
                max_length=N + 1, bad_words_ids=[[pad], [tokenizer.unk_token_id]],
                forced_eos_token_id=None, logits_processor=only_eos_at_the_limit(eos),
            )  # fmt: skip
        for row in rows[:, 1:].tolist():
            out.append(row[: row.index(eos)] if eos in row else row)
    return out


def assert_translations_equal(path, generated, beam: int, varied: int) -> None:
    """mtx's outputs equal `generated(sources, beam)` (transformers' ids) on at least 99% of
    300 lines, and more than `varied` of them differ (the comparison is not of one output)."""
    sources = [x for x in lines(300) if x.split()]  # a line with no words is not decoded
    tr = translator(path, f"decode.beam={beam}", "decode.max_len_a=0", f"decode.max_len_b={N}")
    origin = tr.parts.codec.vocab.origin
    ours = [[origin[i] for i in t] for t in tokens(tr, sources)]
    theirs = generated(sources, beam)
    same = sum(a == b for a, b in zip(ours, theirs))
    assert same >= 0.99 * len(sources), f"{same} of {len(sources)}"
    assert len({tuple(x) for x in ours}) > varied  # the outputs vary with the source


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_equal_generate(marian, beam):
    _, path, hf, tokenizer = marian
    assert_translations_equal(path, lambda s, k: generate(hf, tokenizer, s, k), beam, 50)


def assert_exported_back(imported, load, files: tuple[str, ...], back: Path) -> None:
    """`mtx export --format hf` of an imported model (`imported`: its directory, checkpoint
    and transformers model) into `back`: `load(back)` holds every tensor of the model it was
    imported from, and `files` are its directory's, byte for byte."""
    directory, path, hf = imported[:3]
    mtx("export", path, "--format", "hf", "--output", back)
    state = load(back).state_dict()
    for name, tensor in hf.state_dict().items():
        assert torch.equal(state[name], tensor), name
    for name in files:
        assert (back / name).read_bytes() == (directory / name).read_bytes()


def test_the_export_gives_back_the_same_model(marian, tmp_path):
    from transformers import MarianMTModel

    directory = marian[0]
    assert_exported_back(
        marian, MarianMTModel.from_pretrained, ("source.spm", "target.spm"), tmp_path / "back"
    )
    ours = json.loads((tmp_path / "back" / "vocab.json").read_text())
    assert ours == json.loads((directory / "vocab.json").read_text())


def test_the_ctranslate2_export_scores_and_translates_as_mtx(marian, tmp_path):
    """Greedy: the same outputs; CTranslate2's log-probabilities of mtx's beam outputs equal
    mtx's (its beam search stops otherwise: tests/test_export.py)."""
    import ctranslate2

    _, path, _, _ = marian
    mtx("export", path, "--format", "ctranslate2", "--output", tmp_path / "ct2")
    tr = translator(path, "decode.beam=1", "decode.max_len_a=0", f"decode.max_len_b={N}")
    sources = [x for x in lines(200) if x.split()]  # a line with no words is not decoded
    ct2 = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    v = tr.parts.codec.vocab
    piece = v.id_to_piece
    pieces = [[piece(i) for i in encode(tr, s)[:-1]] for s in sources]
    results = ct2.translate_batch(
        pieces, beam_size=1, max_decoding_length=N - 1, suppress_sequences=[["<pad>"], ["<unk>"]]
    )
    theirs = [[v.piece_to_id(p) for p in r.hypotheses[0]] for r in results]
    ours = tokens(tr, sources)
    same = sum(a == b for a, b in zip(ours, theirs))
    assert same >= 0.99 * len(sources), f"{same} of {len(sources)}"
    beam = [h[0] for h in outputs(tr, sources[:30], beam=4)]
    scored = ct2.score_batch(pieces[:30], [[piece(i) for i in h.tokens] for h in beam])
    for hyp, result in zip(beam, scored):
        assert sum(result.log_probs) == pytest.approx(hyp.log_prob, abs=1e-3)


def test_the_commands_take_an_imported_model(marian, tmp_path):
    _, path, _, _ = marian
    src, tgt = lines(12)[8:], targets(12)[8:]
    out = mtx("translate", "--checkpoint", path, "--set", "decode.alpha=0", input="\n".join(src))
    assert out.stdout.splitlines() == texts(translator(path), src)
    (tmp_path / "src").write_text("\n".join(src) + "\n")
    (tmp_path / "tgt").write_text("\n".join(tgt) + "\n")
    scored = mtx(
        "score", "--checkpoint", path, "--src", tmp_path / "src", "--tgt", tmp_path / "tgt"
    )
    assert len(scored.stdout.splitlines()) == len(src)
    info = mtx("info", path, "--json")
    assert json.loads(info.stdout)["config"]["model"]["decoder_start"] == "pad"


def test_serve_and_distill_take_an_imported_model(marian, tmp_path):
    from mtx.bench.server import Server

    _, path, _, _ = marian
    sources = lines(20)[8:]
    expected = texts(translator(path, "decode.alpha=0.6"), sources)
    with Server(path, "serve.workers=1") as server:
        status, answer = server.translate(sources)
        assert (status, answer["translations"]) == (200, expected)
        assert server.stop() == 0
    (tmp_path / "src").write_text("\n".join(sources) + "\n")
    mtx("distill", "--checkpoint", path, "--src", tmp_path / "src", "--output-dir", tmp_path / "d")
    assert (tmp_path / "d" / "teacher.de").read_text().splitlines() == expected


def broken(directory, tmp_path, change):
    copy = tmp_path / "broken"
    shutil.copytree(directory, copy)
    change(copy)
    return copy


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: (d / "model.safetensors").unlink(), "no weights"),
        (lambda d: (d / "target.spm").unlink(), "no target.spm"),
        (lambda d: (d / "config.json").write_text('{"model_type": "t5"}'), "'t5' cannot be"),
        (
            lambda d: (d / "vocab.json").write_text(json.dumps({"<unk>": 0, "a": 1})),
            "do not belong together",
        ),
        (
            lambda d: (d / "config.json").write_text(
                json.dumps(json.loads((d / "config.json").read_text()) | {"d_model": 20})
            ),
            "do not fit its config.json",
        ),
    ],
)
def test_what_cannot_be_imported_is_refused_in_one_line(marian, tmp_path, change, message):
    directory = broken(marian[0], tmp_path, change)
    result = invoke("import", directory, "--output", tmp_path / "out.pt")
    assert result.exit_code != 0
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out.pt").exists()


def test_a_hub_id_without_the_network_says_what_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    result = invoke("import", "Helsinki-NLP/opus-mt-de-en", "--output", tmp_path / "out.pt")
    assert result.exit_code != 0
    assert "hf download Helsinki-NLP/opus-mt-de-en" in result.output
    assert "then `mtx import DIR --output CHECKPOINT`" in result.output  # as it must be typed
    assert not (tmp_path / "out.pt").exists()


def test_the_help_names_both_families():
    said = " ".join(invoke("import", "--help").output.split())
    assert "MarianMT (OPUS-MT) or NLLB (M2M100)" in said


def test_the_checkpoint_records_the_imported_vocabulary(marian):
    ckpt = Checkpoint.load(marian[1])
    assert ckpt.config.model.activation == "swish" and ckpt.config.model.output_bias
    assert ckpt.spm_model.startswith(b"PK")  # data/vocab.py's Paired
    with pytest.raises(MtxError, match="the vocabulary .an imported MarianMT model's. needs pad"):
        translator(marian[1], "model.decoder_start=bos")


def fine_tuning(run, path, *extra) -> list[str]:
    """Settings of a fine-tuning run of the imported model on the toy corpus."""
    return [
        f"run_dir={run}", f"data.spm_model={path}", f"train.init_from={path}",
        "data.clean.langid=0", "data.max_len=48", "train.max_tokens=512", "train.device=cpu", "train.log_every=1",
        "train.valid_every=4", "train.bleu_every=1", "train.valid_bleu_lines=8",
        "decode.max_len_b=8", *extra,
    ]  # fmt: skip


def assert_first_loss_is_transformers(tr, hf, prepared) -> None:
    """mtx's label-smoothed loss of the first 16 prepared training pairs equals transformers'
    (LabelSmoother, as Seq2SeqTrainer's --label_smoothing_factor) on the same ids."""
    import datasets
    import numpy as np
    from transformers.trainer_pt_utils import LabelSmoother

    from mtx.data.batching import BatchDataset
    from mtx.train.step import LossModel

    ds = datasets.load_from_disk(str(prepared / "train"))
    batch = BatchDataset(ds, [np.arange(16)], start=tr.parts.model.specials.start)[0]
    origin = torch.tensor(tr.parts.codec.vocab.origin)
    with torch.no_grad():
        ours = (
            LossModel(tr.parts.model, 0.1)(
                batch.src, batch.tgt_in, batch.tgt_out, batch.tgt_index, batch.src_padded
            )[0]
            / batch.tgt_tokens
        )
        labels = origin[batch.tgt_out].masked_fill(batch.tgt_out == 0, -100)
        out = hf(
            input_ids=origin[batch.src], attention_mask=batch.src != 0,
            decoder_input_ids=origin[batch.tgt_in],
        )  # fmt: skip
        theirs = LabelSmoother(epsilon=0.1)(out, labels, shift_labels=False)
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-4)


def test_fine_tuning_starts_at_transformers_loss_and_resumes_exactly(marian, tmp_path):

    from mtx.config import load_config
    from mtx.data.prepare import prepare
    from mtx.train.trainer import train

    _, path, hf, _ = marian
    quiet = dict(log=lambda *_: None)
    prepare(load_config(None, fine_tuning(tmp_path / "whole", path)), **quiet)
    shutil.copytree(tmp_path / "whole" / "prepared", tmp_path / "parts" / "prepared")
    # step 0: mtx's label-smoothed loss of a batch is transformers'
    assert_first_loss_is_transformers(translator(path), hf, tmp_path / "whole" / "prepared")
    # the run, whole and in two parts: the same weights
    train(load_config(None, fine_tuning(tmp_path / "whole", path, "train.max_steps=8")), **quiet)
    train(load_config(None, fine_tuning(tmp_path / "parts", path, "train.max_steps=5")), **quiet)
    cfg = load_config(None, fine_tuning(tmp_path / "parts", path, "train.max_steps=8"))
    train(cfg, resume=True, **quiet)
    assert_same_parameters(
        tmp_path / "whole/checkpoints/last.pt", tmp_path / "parts/checkpoints/last.pt"
    )
    valid = records(tmp_path / "whole", "valid")
    assert [r["step"] for r in valid] == [4, 8] and all("valid_bleu" in r for r in valid)
    first = records(tmp_path / "whole", "train")[0]
    assert first["loss"] < 3.0  # it starts from the pretrained weights, not from scratch
    with pytest.raises(MtxError, match="set data.bpe_dropout=0"):
        sampled = fine_tuning(tmp_path / "parts", path, "data.bpe_dropout=0.1")
        train(load_config(None, sampled), overwrite=True, **quiet)
    # a student from scratch on the imported vocabulary: its decoder must start as MarianMT's
    student = ["model.d_model=16", "model.d_ff=32", "model.n_heads=2", "train.init_from=''"]
    student += ["train.max_steps=2", "train.bleu_every=0"]
    shutil.copytree(tmp_path / "whole" / "prepared", tmp_path / "student" / "prepared")
    with pytest.raises(MtxError, match="set model.decoder_start=pad"):
        train(load_config(None, fine_tuning(tmp_path / "student", path, *student)), **quiet)
    cfg = load_config(None, fine_tuning(tmp_path / "student", path, *student))
    cfg.model.decoder_start = "pad"
    train(cfg, **quiet)
    assert Translator.from_checkpoints(tmp_path / "student/checkpoints/last.pt").translate(["a"])


@pytest.mark.slow  # two processes fine-tune on Multi30k
def test_a_multi30k_fine_tune_of_an_imported_model_resumes_exactly_after_kill_9(marian, tmp_path):
    """A fine-tuning run killed with SIGKILL just before update 6, then `--resume`d, ends with
    the weights and Adam moments of the run that was never killed."""
    import os
    import subprocess
    import sys

    from conftest import MULTI30K

    from mtx.config import load_config
    from mtx.data.prepare import prepare

    _, path, _, _ = marian
    data = [f"data.{s}={MULTI30K / n}" for s, n in
            (("train", "train"), ("valid", "val"), ("test", "test2016"))]  # fmt: skip
    helper = Path(__file__).parent / "helpers" / "die_at_step.py"
    (tmp_path / "ft.yaml").write_text("data:\n  src_lang: en\n")

    def settings(name):
        return fine_tuning(tmp_path / name, path, *data, "train.max_steps=9")

    def run(name, *flags, die=-1):
        """`mtx train` in a process of its own, SIGKILLed just before update `die` + 1."""
        env = os.environ | {"RANK": "0", "MTX_DIE_RANK": "0", "MTX_DIE_AT_STEP": str(die)}
        sets = [x for s in settings(name) for x in ("--set", s)]
        cmd = [sys.executable, str(helper), "train", "--config", str(tmp_path / "ft.yaml")]
        return subprocess.run([*cmd, *sets, *flags], env=env, capture_output=True, text=True)

    prepare(load_config(None, settings("whole")), log=lambda *_: None)
    shutil.copytree(tmp_path / "whole" / "prepared", tmp_path / "killed" / "prepared")
    assert run("whole").returncode == 0
    killed = run("killed", die=5)  # after the checkpoint of step 4 (train.valid_every=4)
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = run("killed", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_parameters(
        tmp_path / "whole/checkpoints/last.pt", tmp_path / "killed/checkpoints/last.pt"
    )


@pytest.mark.slow  # builds and trains a second MarianMT model (about 20 s)
def test_a_multilingual_model_takes_its_target_token_from_tgt_lang(tmp_path):
    from transformers import MarianMTModel, MarianTokenizer

    directory = opus.build(tmp_path / "opus-mt-en-gmw", multilingual=True, steps=100)
    mtx("import", directory, "--output", tmp_path / "model.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = MarianTokenizer.from_pretrained(directory)
    hf = MarianMTModel.from_pretrained(directory).eval()
    tr = translator(tmp_path / "model.pt", "decode.max_len_a=0", f"decode.max_len_b={N}")
    assert tr.parts.codec.languages.targets == ("deu", "nld")
    with pytest.raises(MtxError, match="name the target language"):
        tr.translate(["a dog"])
    sources = lines(40)[8:]
    origin = tr.parts.codec.vocab.origin
    for line in sources:
        ours = [origin[i] for i in encode(tr, line, "deu")]
        assert ours == tokenizer(">>deu<< " + line).input_ids
    ours = [[origin[i] for i in t] for t in tokens(tr, sources, tgt_lang="deu", beam=1)]
    theirs = generate(hf, tokenizer, [">>deu<< " + line for line in sources], 1)
    assert ours == theirs
    out = mtx(
        "translate", "--checkpoint", tmp_path / "model.pt", "--tgt-lang", "nld", input="a dog"
    )
    assert out.stdout.strip() == texts(tr, ["a dog"], tgt_lang="nld")[0]
