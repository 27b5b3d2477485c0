"""One model for both directions of the toy corpus (configs/toy-both-ways.yaml), trained
through the CLI: the target-language tag survives every path, from `mtx translate` and
`mtx evaluate` to the server, n-best lists, ensembles and both exports."""

import json

import ctranslate2
import pytest
from conftest import ROOT
from helpers.common import invoke, mtx, write_pair
from helpers.translating import encode, texts
from transformers import MarianMTModel, MarianTokenizer

from mtx.bench.server import Server
from mtx.data import toy
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.evaluate import score
from mtx.formats import export
from mtx.serve.engine import make_engine
from mtx.tokens import BOS_ID, PAD_ID, UNK_ID

PAIRS = toy.split_pairs("test")[:40]
ENGLISH, GERMAN = [en for en, _ in PAIRS], [de for _, de in PAIRS]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """configs/toy-both-ways.yaml, smaller, for 240 updates (about a minute on 2 CPU cores),
    greedy, with test sets of PAIRS' 40 lines each way."""
    run = tmp_path_factory.mktemp("both-ways")
    write_pair(run / "test", ENGLISH, GERMAN)
    corpora = [
        {"src_lang": src, "tgt_lang": tgt, "train": "toy:train", "valid": ["toy:valid"],
         "test": str(run / "test")} for src, tgt in (("en", "de"), ("de", "en"))
    ]  # fmt: skip
    values = {"run_dir": run, "model.d_model": 64, "model.d_ff": 256, "train.max_steps": 240,
              "train.valid_every": 240, "train.valid_bleu_lines": 20, "train.max_tokens": 1024,
              "decode.beam": 1, "data.corpora": json.dumps(corpora)}  # fmt: skip
    sets = [x for key, value in values.items() for x in ("--set", f"{key}={value}")]
    for command in ("prepare", "train"):
        mtx(command, "--config", ROOT / "configs/toy-both-ways.yaml", *sets)
    return run


@pytest.fixture(scope="module")
def best(run):
    return run / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def greedy(best):
    return Translator.from_checkpoints(best, ["decode.beam=1"], device="cpu")


def test_translate_needs_a_target_language_and_the_tag_decides_it(best, greedy):
    src = "\n".join(ENGLISH) + "\n"
    missing = invoke("translate", "--checkpoint", best, input=src)
    assert missing.exit_code == 2
    assert "this model translates into de, en: name the target language" in missing.output
    unknown = invoke("translate", "--checkpoint", best, "--tgt-lang", "fr", input=src)
    assert unknown.exit_code == 2 and "'fr' is not one this model translates into (de, en)" in (
        unknown.output
    )
    into_de = mtx("translate", "--checkpoint", best, "--tgt-lang", "de", input=src).output
    into_de = into_de.splitlines()
    assert into_de == texts(Translator.from_checkpoints(best, device="cpu"), ENGLISH, tgt_lang="de")
    # the tag decides the language: German output is far closer to the German references
    assert score(into_de, GERMAN).chrf > score(into_de, ENGLISH).chrf + 20
    de_src = "\n".join(GERMAN) + "\n"
    into_en = mtx("translate", "--checkpoint", best, "--tgt-lang", "en", input=de_src).output
    assert score(into_en.splitlines(), ENGLISH).chrf > score(into_en.splitlines(), GERMAN).chrf + 20
    nbest = mtx("translate", "--checkpoint", best, "--tgt-lang", "en", "--nbest", "2",
                "--beam", "2", input=GERMAN[0] + "\n").output.splitlines()  # fmt: skip
    assert len(nbest) == 2 and all(line.startswith("0 ||| ") for line in nbest)
    with pytest.raises(MtxError, match="name the target language"):
        greedy.translate(ENGLISH[:1])
    with pytest.raises(MtxError, match="name the target language"):
        greedy.options()


def test_evaluate_scores_each_direction(best, run):
    out = json.loads(mtx("evaluate", "--checkpoint", best, "--split", "test", "--json").output)
    assert sorted(out["sets"]) == ["de-en", "en-de"]
    assert out["bleu"] == round(
        (out["sets"]["en-de"]["bleu"] + out["sets"]["de-en"]["bleu"]) / 2, 2
    )
    assert all(s["lines"] == 40 for s in out["sets"].values())
    assert out["sets"]["de-en"]["bleu"] > 10 and out["sets"]["en-de"]["bleu"] > 10
    text = mtx("evaluate", "--checkpoint", best, "--split", "test").output
    assert "en-de:" in text and "de-en:" in text and "mean over 2 sets" in text
    (run / "de.txt").write_text("\n".join(GERMAN) + "\n")
    (run / "en.txt").write_text("\n".join(ENGLISH) + "\n")
    files = ["--src", run / "de.txt", "--ref", run / "en.txt", "--json"]
    one = json.loads(mtx("evaluate", "--checkpoint", best, *files, "--tgt-lang", "en").output)
    tr = Translator.from_checkpoints(best, device="cpu")
    assert one["bleu"] == score(texts(tr, GERMAN, tgt_lang="en"), ENGLISH).bleu


def test_info_lists_the_directions(best):
    facts = json.loads(mtx("info", best, "--json").output)
    assert facts["directions"] == ["en-de", "de-en"] and facts["tags"] == [">>de<<", ">>en<<"]
    assert (
        "directions: en-de, de-en (the source starts with >>de<< or >>en<<)"
        in mtx("info", best).output
    )


def test_an_ensemble_takes_the_tag_too(best, run):
    last = run / "checkpoints" / "last.pt"
    pair = Translator.from_checkpoints([best, last], device="cpu")
    alone = Translator.from_checkpoints(best, device="cpu")
    twice = Translator.from_checkpoints([best, best], device="cpu")
    assert texts(twice, GERMAN[:10], tgt_lang="en") == texts(alone, GERMAN[:10], tgt_lang="en")
    out = texts(pair, GERMAN, tgt_lang="en")
    assert score(out, ENGLISH).chrf > score(out, GERMAN).chrf


def test_the_server_takes_tgt_lang_and_lists_the_directions(best):
    with Server(best, "decode.beam=1") as s:
        info = s.get("/info")[2]
        assert info["directions"] == ["en-de", "de-en"]
        assert info["target_languages"] == ["de", "en"] and info["tgt_lang_required"]
        status, answer = s.translate(ENGLISH[:3])
        assert status == 422 and "this model translates into de, en" in answer["error"]
        status, answer = s.translate(ENGLISH[:3], tgt_lang="fr")
        assert status == 422 and "'fr'" in answer["error"]
        tr = Translator.from_checkpoints(best, ["decode.beam=1"], device="cpu")
        for lang, lines in (("de", ENGLISH), ("en", GERMAN)):
            status, answer = s.translate(lines, tgt_lang=lang)
            assert status == 200 and answer["translations"] == texts(tr, lines, tgt_lang=lang)
        page = s.get("/")[2]
        assert 'id="lang"' in page and "tgt_lang" in page  # the page lets one choose
        assert s.stop() == 0


def test_the_ctranslate2_engine_takes_tgt_lang(best, greedy):
    engine = make_engine("ctranslate2", [best], ["decode.beam=1"], "cpu", None)
    for lang, lines in (("de", ENGLISH[:10]), ("en", GERMAN[:10])):
        options = engine.translator.options(beam=1, tgt_lang=lang)
        results = engine.translate(lines, options)
        assert [r.translation.best.text for r in results] == texts(greedy, lines, tgt_lang=lang)


@pytest.fixture(scope="module")
def exports(best, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    export(best, "hf", root / "hf")
    export(best, "ctranslate2", root / "ct2")
    return root


def limit(translator, text: str) -> int:
    """mtx's longest output for `text` (EOS included): source tokens (the tag too) + 50."""
    return len(encode(translator, text, "de")) - 1 + 50


def test_the_hf_export_keeps_marians_language_tags(exports, greedy):
    about = json.loads((exports / "hf" / "mtx.json").read_text())
    assert about["target_language_tags"] == [">>de<<", ">>en<<"]
    tokenizer = MarianTokenizer.from_pretrained(exports / "hf")
    assert sorted(tokenizer.supported_language_codes) == [">>de<<", ">>en<<"]
    for line in ENGLISH:
        assert tokenizer(">>de<< " + line).input_ids == encode(greedy, line, "de")
    hf = MarianMTModel.from_pretrained(exports / "hf").eval()
    assert hf.generation_config.num_beams == 1  # a greedy model's export (beam 1) saves too
    for lang, lines in (("de", ENGLISH[:20]), ("en", GERMAN[:20])):
        theirs = []
        for text in lines:
            batch = tokenizer([f">>{lang}<< {text}"], return_tensors="pt")
            out = hf.generate(**batch, num_beams=1, max_new_tokens=limit(greedy, text))
            theirs += tokenizer.batch_decode(out, skip_special_tokens=True)
        assert theirs == texts(greedy, lines, tgt_lang=lang)


def test_the_ctranslate2_export_translates_with_the_tag_as_a_prefix(exports, greedy):
    ct2 = ctranslate2.Translator(str(exports / "ct2"), device="cpu")
    sp = greedy.parts.codec.vocab.sp
    suppress = [[sp.id_to_piece(i)] for i in (PAD_ID, UNK_ID, BOS_ID)]
    for lang, lines in (("de", ENGLISH[:20]), ("en", GERMAN[:20])):
        theirs = []
        for text in lines:
            pieces = [f">>{lang}<<", *sp.encode(text, out_type=str)]
            (result,) = ct2.translate_batch(
                [pieces],
                beam_size=1,
                max_decoding_length=limit(greedy, text) - 1,
                suppress_sequences=suppress,
            )  # fmt: skip (CTranslate2 does not count the EOS)
            theirs.append(" ".join(sp.decode(result.hypotheses[0]).split()))
        assert theirs == texts(greedy, lines, tgt_lang=lang)


def test_a_model_of_one_target_language_takes_that_one_only(toy_run):
    best = toy_run / "checkpoints" / "best.pt"
    tr = Translator.from_checkpoints(best, ["decode.beam=1"], device="cpu")
    languages = tr.parts.codec.languages
    assert languages.targets == ("de",) and languages.scheme == "one"
    assert texts(tr, ENGLISH[:5], tgt_lang="de") == texts(tr, ENGLISH[:5])
    out = invoke("translate", "--checkpoint", best, "--tgt-lang", "en", input="a dog\n")
    assert out.exit_code == 2 and "'en' is not one this model translates into (de)" in out.output


def test_the_language_scheme_is_one_object_that_the_translator_and_the_server_share(best):
    """mtx/decode/languages.py: a tagged model's scheme, read once; the server's own process
    (serve/front.py) reads the same from the same vocabulary and config, without torch."""
    from mtx.decode.languages import Languages
    from mtx.serve.front import About, Front

    tr = Translator.from_checkpoints(best, device="cpu")
    p = tr.parts
    languages, vocab = p.codec.languages, p.codec.vocab
    assert languages == Languages.of(vocab, p.config.data)
    assert languages.scheme == "tags" and languages.targets == ("de", "en")
    assert languages.source_prefix("en") == [vocab.piece_to_id(">>en<<")]
    assert languages.start("en") == ()  # a tag is read in the source, not after the start
    assert "name the target language" in languages.refusal(None)
    assert "'fr' is not one this model translates into (de, en)" in languages.refusal("fr")
    front = Front(About(p.config, vocab.blob, p.model.max_positions, p.setup, []))
    assert front.codec.languages == languages
    assert front.length("a dog runs .") == len(encode(tr, "a dog runs .", "de"))
