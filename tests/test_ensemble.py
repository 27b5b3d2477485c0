"""Ensembles (decode/ensemble.py): the mean of the models' probabilities at each step."""

import copy

import pytest
import sentencepiece as spm
import torch
from conftest import tiny_model_config
from helpers.common import invoke, mtx

from mtx.checkpoint import Checkpoint
from mtx.config import Config
from mtx.data import vocab
from mtx.decode.ensemble import Ensemble
from mtx.decode.rules import SearchSettings
from mtx.decode.search import Sampling, beam_search, greedy_search
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.model.build import make_model

SENTENCES = ["the dog sleeps.", "a cat sees the bird.", "the man gives a book to the child."] * 20


SHORT = SearchSettings(max_len_b=12, limit=100)  # beam 4, alpha 0.6; greedy reads the lengths


def models(vocab_size=40, seed=0):
    """A Transformer and an RNN with the same vocabulary, random weights."""
    torch.manual_seed(seed)
    transformer = make_model(tiny_model_config(), vocab_size).eval()
    rnn = make_model(tiny_model_config(arch="rnn", n_heads=1), vocab_size).eval()
    return transformer, rnn


def sources(vocab_size=40):
    torch.manual_seed(1)
    src = torch.randint(4, vocab_size, (6, 8))
    src[:, -1] = 3  # EOS
    src[2, 5:], src[2, 4] = 0, 3  # a shorter sentence, padded
    return src


def as_tuples(hyps):
    return [[(h.tokens, h.score, h.log_prob) for h in group] for group in hyps]


def test_an_ensemble_of_a_model_with_itself_is_that_model():
    src = sources()
    for model in models():
        self_ensemble = Ensemble([model, copy.deepcopy(model)])
        for stopping in ("k_finished", "exact"):
            one = beam_search(
                model,
                src,
                SearchSettings(max_len_b=12, limit=100, stopping=stopping),
                nbest=3,
            )
            two = beam_search(
                self_ensemble,
                src,
                SearchSettings(max_len_b=12, limit=100, stopping=stopping),
                nbest=3,
            )
            assert as_tuples(two) == as_tuples(one)
        assert as_tuples([greedy_search(self_ensemble, src, SHORT)]) == as_tuples(
            [greedy_search(model, src, SHORT)]
        )
        seeds = [[5, i] for i in range(src.size(0))]
        sampling = Sampling(temperature=1.3, top_k=10, top_p=0.9)
        sampled = greedy_search(
            model,
            src,
            SHORT,
            sampling=sampling,
            seeds=seeds,
        )
        assert (
            greedy_search(
                self_ensemble,
                src,
                SHORT,
                sampling=sampling,
                seeds=seeds,
            )
            == sampled
        )
        assert len({tuple(h.tokens) for h in sampled}) > 1


def test_step_log_probabilities_are_the_log_of_the_mean_of_the_probabilities():
    transformer, rnn = models()
    ensemble = Ensemble([transformer, rnn])
    src = sources()
    memory, masks = ensemble.encode(src)
    cache = ensemble.new_cache()
    torch.manual_seed(2)
    prefix = torch.cat([torch.full((6, 1), 2), torch.randint(4, 40, (6, 5))], 1)  # BOS + 5
    for t in range(prefix.size(1)):  # incremental, with every model's cache
        step = ensemble.decode(prefix[:, t : t + 1], memory if t == 0 else None, masks, cache)
        with torch.no_grad():
            probs = [
                torch.softmax(m(src, prefix[:, : t + 1])[:, -1].double(), -1)
                for m in (transformer, rnn)
            ]
        expected = torch.log((probs[0] + probs[1]) / 2)
        torch.testing.assert_close(step[:, -1].double(), expected, atol=1e-5, rtol=0)
        assert torch.allclose(step[:, -1].exp().sum(-1), torch.ones(6))


def test_an_ensemble_does_not_depend_on_the_batch():
    ensemble = Ensemble(list(models()))
    src = sources()
    together = beam_search(
        ensemble,
        src,
        SHORT,
        nbest=2,
    )
    alone = [
        beam_search(
            ensemble,
            src[i : i + 1],
            SHORT,
            nbest=2,
        )[0]
        for i in range(6)
    ]
    assert as_tuples(alone) == as_tuples(together)
    reverse = beam_search(
        ensemble,
        src.flip(0),
        SHORT,
        nbest=2,
    )
    assert as_tuples(reverse[::-1]) == as_tuples(together)
    greedy = greedy_search(ensemble, src, SHORT)
    assert greedy_search(ensemble, src[2:4], SHORT) == greedy[2:4]


def test_translator_ensemble_through_the_api():
    proto = vocab.train_bpe(iter(SENTENCES), vocab_size=40, sample=0, character_coverage=1.0)
    size = spm.SentencePieceProcessor(model_proto=proto).get_piece_size()
    cfg = Config()
    cfg.decode.batch_tokens = 16
    translator = Translator(Ensemble(list(models(size))), cfg, proto, device="cpu")
    lines = ["the dog sleeps.", "", "a cat sees the bird.", "the dog sleeps."]
    out = [t.best.text for t in translator.translate(lines)]
    assert len(out) == 4 and out[0] == out[3]
    assert out == [translator.translate([line])[0].best.text for line in lines]
    with pytest.raises(MtxError, match="decode.attention reads one model's attention"):
        translator.options(attention=True)


def test_cli_ensemble_of_checkpoints_and_refusals(toy_run, tmp_path):
    """`--checkpoint A --checkpoint B` for translate and evaluate: the same output in any batch
    size, and A with a copy of itself is A; another vocabulary is refused with one line."""
    ckpts = toy_run / "checkpoints"
    a, b = str(ckpts / "step-125.pt"), str(ckpts / "step-250.pt")
    mtx("toy", "--output", tmp_path / "valid", "--split", "valid")
    lines = (tmp_path / "valid.en").read_text().splitlines()[:60]
    text = "\n".join(lines) + "\n"

    def translate(*args):
        return mtx("translate", *args, input=text).stdout

    pair = translate("--checkpoint", a, "--checkpoint", b, "--device", "cpu")
    assert len(pair.splitlines()) == 60
    assert translate("--checkpoint", a, "--checkpoint", b, "--batch-tokens", "8") == pair
    assert pair != translate("--checkpoint", b, "--device", "cpu")  # two models, not one
    assert translate("--checkpoint", b, "--checkpoint", b) == translate("--checkpoint", b)

    (tmp_path / "v60.en").write_text(text)
    refs = (tmp_path / "valid.de").read_text().splitlines()[:60]
    (tmp_path / "v60.de").write_text("\n".join(refs) + "\n")
    both = ("--checkpoint", a, "--checkpoint", b)
    sets = ("--src", tmp_path / "v60.en", "--ref", tmp_path / "v60.de", "--json")
    assert '"bleu"' in mtx("evaluate", *both, *sets).stdout

    other = tmp_path / "other.pt"
    ckpt = Checkpoint.load(b)
    ckpt.spm_model = vocab.train_bpe(
        iter(SENTENCES), vocab_size=40, sample=0, character_coverage=1.0
    )
    ckpt.save(other)
    result = invoke("translate", "--checkpoint", a, "--checkpoint", other)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"mtx: error: {other}: another vocabulary (SentencePiece model) than {a}; the "
        "checkpoints of an ensemble must share one"
    ]
    result = invoke("translate", "--checkpoint", a, "--checkpoint", b, "--attention-dir", tmp_path)
    assert result.exit_code == 2 and "give one --checkpoint" in result.output
