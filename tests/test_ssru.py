"""The SSRU decoder layer (model/ssru.py) and the students' shapes: the paper's equations, its
cell in both decoder caches, both searches, batch independence, training and decoding from the
CLI, and the exports that refuse it."""

import json

import pytest
import torch
from conftest import tiny_model_config
from helpers.translating import outputs

from mtx.checkpoint import Checkpoint
from mtx.config import Config, load_config
from mtx.decode.rules import SearchSettings
from mtx.decode.search import beam_search
from mtx.decode.static import StaticSearch
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.formats import export
from mtx.info import architecture
from mtx.model.ssru import SSRU
from mtx.model.transformer import Transformer, count_parameters
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID
from mtx.train.trainer import quiet, train
from tests.conftest import run_config
from tests.helpers.common import mtx
from tests.test_static import both_searches, sources

STUDENT = dict(decoder_self="ssru", decoder_d_ff=24, encoder_layers=3, decoder_layers=2)


def paper_ssru(x, w_f, b_f, w):
    """Kim et al. (2019), section 3.1, one position after another from c_0 = 0."""
    cell, out = torch.zeros_like(x[:, 0]), []
    for t in range(x.size(1)):
        f = torch.sigmoid(x[:, t] @ w_f.T + b_f)
        cell = f * cell + (1 - f) * (x[:, t] @ w.T)
        out.append(torch.relu(cell))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("init", ["fairseq", "xavier"])
def test_the_ssru_computes_the_papers_equations(init):
    torch.manual_seed(0)
    ssru = SSRU(8, init).double()
    with torch.no_grad():
        ssru.gate_bias.normal_()
    x = torch.randn(3, 7, 8, dtype=torch.double)
    w_f, w = ssru.proj.weight[:8], ssru.proj.weight[8:]
    want = paper_ssru(x, w_f, ssru.gate_bias, w)
    torch.testing.assert_close(ssru(x), want, rtol=0, atol=1e-12)
    assert (want == 0).any() and (want > 0).any()  # the ReLU acts
    # position t reads nothing after it: changing the last input changes only the last output
    y = x.clone()
    y[:, -1] += 1
    assert torch.equal(ssru(y)[:, :-1], ssru(x)[:, :-1])
    assert torch.autograd.gradcheck(ssru, (x[:, :4].clone().requires_grad_(),))


def test_the_recurrence_runs_in_float32_under_bf16_products():
    """Rounding does not pile up along the positions: the cell is float32 in both caches."""
    torch.manual_seed(0)
    m = Transformer(tiny_model_config(**STUDENT), 40).eval().to(torch.bfloat16)
    src, tgt = sources(2, 5, 40), torch.full((2, 1), BOS_ID)
    with torch.no_grad():
        memory, mask = m.encode(src)
        cache = m.new_cache()
        out = m.decode(tgt, memory, mask, cache)
        static = m.new_static_cache(2, 4, True, memory)
        assert out.dtype == torch.bfloat16 and memory.dtype == torch.bfloat16
    assert cache.layers[0].state.dtype == static.layers[0].state.dtype == torch.float32
    x = torch.randn(2, 6, 32, dtype=torch.bfloat16)
    ssru = m.decoder_layers[0].self_attn
    w = ssru.proj.weight.float()
    want = paper_ssru(x.float(), w[:32], ssru.gate_bias.float(), w[32:])
    torch.testing.assert_close(ssru(x).float(), want, rtol=0.02, atol=0.02)


@pytest.fixture(scope="module")
def student():
    """A random student-shaped Transformer whose outputs end at varied lengths."""
    torch.manual_seed(0)
    m = Transformer(tiny_model_config(**STUDENT), 40).eval()
    with torch.no_grad():
        m.embed.weight[EOS_ID] *= 2
    return m


def test_the_cell_in_either_cache_decodes_as_the_whole_prefix_does(student):
    """The whole prefix, one position at a time and several at a time (the same numbers but
    for the products' rounding over more rows, model/rows.py), and one at a time over a static
    cache (bit for bit as over the growing one); neither cache holds keys or values for the
    SSRU's layers."""
    src = sources(3, 7, 40)
    tgt = torch.randint(4, 40, (3, 9))
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        whole = student(src, tgt)
        memory, mask = student.encode(src)
        growing = {}
        for chunks in ([1] * 9, [2, 3, 1, 3]):
            cache, out, at = student.new_cache(), [], 0
            for n in chunks:
                out.append(student.decode(tgt[:, at : at + n], memory, mask, cache))
                at += n
            growing[len(chunks)] = torch.cat(out, dim=1)
            torch.testing.assert_close(growing[len(chunks)], whole, atol=1e-5, rtol=1e-5)
            assert cache.length == 9 and all(layer.k is None for layer in cache.layers)
        static = student.new_static_cache(3, 12, True, memory)
        static.restart()
        student.fill_memory(static, memory)
        out = []
        for t in range(9):
            static.start(t)
            out.append(student.decode(tgt[:, t : t + 1], None, mask, static))
            static.advance()
        assert torch.equal(torch.cat(out, dim=1), growing[9])
        assert all(layer.k.size(2) == 0 for layer in static.layers)


@pytest.mark.parametrize("full", [False, True])
def test_both_searches_find_the_same_hypotheses_with_an_ssru_decoder(student, full):
    """The shrinking search reorders the growing cache's cells, the static search its
    preallocated ones: the same n-best lists bit for bit, beam 4 and greedy."""
    src = sources(11, 9, 40)
    for K in (4, 1):
        static, shrinking = both_searches(student, src, K, full)
        assert static == shrinking
        assert len({len(h.tokens) for hyps in static for h in hyps}) > 3
    search = StaticSearch(student, SearchSettings(max_len_b=30, limit=100))
    first = search(src[:4])
    search(src[4:8])  # leaves no cell behind that the next search reads
    assert search(src[:4]) == first


def test_an_ssru_sentence_gets_the_same_translation_alone_and_in_any_batch(student):
    src = sources(9, 8, 40, seed=5)
    together = beam_search(
        student,
        src,
        SearchSettings(max_len_b=30, limit=100),
        nbest=2,
    )
    assert together == [beam_search(student, src[i : i + 1], SearchSettings(max_len_b=30, limit=100), nbest=2)[0]
                        for i in range(9)]  # fmt: skip
    assert together[::-1] == beam_search(
        student,
        src.flip(0),
        SearchSettings(max_len_b=30, limit=100),
        nbest=2,
    )


def test_a_students_decoder_is_narrower_and_its_encoder_unchanged():
    base = tiny_model_config(encoder_layers=3, decoder_layers=2)
    narrow = tiny_model_config(encoder_layers=3, decoder_layers=2, decoder_d_ff=24)
    ssru = tiny_model_config(**STUDENT)
    a, b, c = (Transformer(m, 40) for m in (base, narrow, ssru))
    assert (
        a.encoder_layers[0].ffn.fc1.out_features == 64 == b.encoder_layers[0].ffn.fc1.out_features
    )
    assert b.decoder_layers[0].ffn.fc1.out_features == 24
    d, f = 32, 64
    assert count_parameters(a) - count_parameters(b) == 2 * (2 * d + 1) * (f - 24)  # 2 layers
    # an SSRU layer: (2d, d) and b_f in place of self-attention's (3d, d), (d, d) and biases
    assert count_parameters(b) - count_parameters(c) == 2 * (4 * d * d + 4 * d - 2 * d * d - d)
    assert "SSRU decoder layers" in architecture(ssru) and "(decoder 24)" in architecture(ssru)


def test_the_settings_refuse_an_ssru_where_there_is_no_transformer():
    with pytest.raises(MtxError, match=r"model.decoder_self \(ssru\) is a transformer setting"):
        load_config(None, ["model.arch=rnn", "model.decoder_self=ssru"])
    with pytest.raises(MtxError, match="model.decoder_self"):
        load_config(None, ["model.decoder_self=lstm"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, prepared):
    """A toy teacher and a toy student (a one-layer SSRU decoder with a narrow feed-forward
    layer) on the same prepared data: their best checkpoints."""
    root = tmp_path_factory.mktemp("students")
    shape = ["model.decoder_self=ssru", "model.decoder_d_ff=16", "model.encoder_layers=2"]
    names = {"teacher": [], "student": shape, "narrow": shape[1:]}  # narrow: no SSRU
    for name, extra in names.items():
        train(run_config(root / name, prepared, "train.max_steps=30", *extra), log=quiet)
    return {name: root / name / "checkpoints" / "best.pt" for name in names}


def test_a_student_trains_translates_scores_and_is_refused_by_the_exports(runs, tmp_path):
    best = runs["student"]
    assert Checkpoint.load(best).config.model.decoder_self == "ssru"
    lines = ["a b c", "d e"]
    shrinking = Translator.from_checkpoints(best, ["decode.search=shrinking"], device="cpu")
    static = Translator.from_checkpoints(best, ["decode.search=static"], device="cpu")
    assert shrinking.translate(lines) == static.translate(lines)
    int8 = Translator.from_checkpoints(best, ["decode.dtype=int8"], device="cpu")
    assert len(int8.translate(lines)) == 2
    assert int8.parts.model.decoder_layers[0].self_attn.packed  # its product runs packed too
    scored = mtx("score", "--checkpoint", best, input="a b c\tx y\n").stdout.split("\t")
    assert len(scored) == 3 and float(scored[0]) < 0  # total, mean, tokens
    assert "SSRU decoder layers" in mtx("info", best).stdout
    for fmt in ("hf", "ctranslate2"):
        with pytest.raises(MtxError, match=f"--format {fmt} has no SSRU decoder layer"):
            export(best, fmt, tmp_path / fmt)
        assert not (tmp_path / fmt).exists()


def test_the_narrow_decoder_exports_to_ctranslate2_with_the_same_scores(runs, tmp_path):
    import ctranslate2

    export(runs["narrow"], "ctranslate2", tmp_path / "ct2")
    tr = Translator.from_checkpoints(runs["narrow"], device="cpu")
    assert tr.parts.model.decoder_layers[0].ffn.fc1.out_features == 16
    ct2 = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    lines = ["a b c", "d e f g", "h"]
    ours = outputs(tr, lines)
    targets = [[tr.parts.codec.vocab.sp.id_to_piece(i) for i in h[0].tokens] for h in ours]
    scored = ct2.score_batch(
        [tr.parts.codec.vocab.sp.encode(line, out_type=str) for line in lines], targets
    )
    with torch.no_grad():
        for line, hyp, result in zip(lines, ours, scored):
            src = torch.tensor([tr.parts.codec.encode(line)])
            tgt = torch.tensor([[BOS_ID, *hyp[0].tokens]])
            lprobs = torch.log_softmax(tr.parts.model(src, tgt)[0], -1)
            expected = lprobs[torch.arange(tgt.size(1)), [*hyp[0].tokens, EOS_ID]]
            torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)


def test_the_narrow_decoder_exports_to_marian_with_the_same_logits():
    from mtx.formats.marian import to_marian

    torch.manual_seed(0)
    m = tiny_model_config(decoder_d_ff=24, decoder_layers=1)
    model = Transformer(m, 40).eval()
    hf = to_marian(model, Config(model=m))
    src, tgt = sources(4, 6, 40), torch.randint(4, 40, (4, 5))
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=src != PAD_ID, decoder_input_ids=tgt).logits
        torch.testing.assert_close(theirs, model(src, tgt), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_the_decoding_race_puts_a_student_beside_its_teacher(runs, tmp_path):
    """`mtx bench decode` with two checkpoints: each engine with each, on the same batches;
    the export that cannot hold the SSRU is left out for the student, and said."""
    src = tmp_path / "src.en"
    src.write_text("a b c\nd e f g\nh\n" * 4, encoding="utf-8")
    report = json.loads(
        mtx("bench", "decode", "--checkpoint", runs["teacher"], "--checkpoint", runs["student"],
            "--src", src, "--beam", "1", "--engines", "mtx,ct2", "--rounds", "1",
            "--json").stdout.splitlines()[-1]
    )  # fmt: skip
    rows = {(r["model"], r["engine"]): r for r in report["results"]}
    assert set(rows) == {("1:teacher", "mtx"), ("1:teacher", "ct2"), ("2:student", "mtx")}
    assert all(r["lines"] == 12 for r in rows.values())
    student, teacher = rows["2:student", "mtx"], rows["1:teacher", "mtx"]
    assert student["speedup_vs_first"] == pytest.approx(
        student["sentences_per_s"] / teacher["sentences_per_s"]
    )
    [reason] = report["left_out"]
    assert reason.startswith(f"ct2: {runs['student']}: --format ctranslate2 has no SSRU")
