"""The recurrent baseline (model/rnn.py): cells and the bidirectional encoder against torch's
own LSTM and GRU on copied weights, the decoder's equations, padding, caching, parameters."""

import json

import pytest
import torch
from conftest import run_overrides
from helpers.common import mtx
from helpers.translating import outputs
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from mtx.config import ATTENTION_SCORES, ModelConfig
from mtx.data import toy
from mtx.decode.rules import SearchSettings
from mtx.decode.search import beam_search
from mtx.decode.translator import Translator
from mtx.model.capture import capture_cross_attention
from mtx.model.rnn import RNN, BidirectionalLayer, Cell
from mtx.model.transformer import count_parameters
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID

VARIANTS = [(cell, score) for cell in ("lstm", "gru") for score in ATTENTION_SCORES]


def rnn_config(cell="lstm", score="general", **kw) -> ModelConfig:
    values = dict(
        arch="rnn", rnn_cell=cell, attention=score, d_model=16, encoder_layers=2,
        decoder_layers=2, dropout=0.0, max_positions=32,
    )  # fmt: skip
    values.update(kw)
    return ModelConfig(**values)


def rnn_model(cell="lstm", score="general", seed=0, vocab=30, **kw) -> RNN:
    torch.manual_seed(seed)
    return RNN(rnn_config(cell, score, **kw), vocab).eval()


def padded_src(lengths, seed=1, vocab=30):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (len(lengths), max(lengths) + 1), generator=g)
    for i, n in enumerate(lengths):
        src[i, n] = EOS_ID
        src[i, n + 1 :] = PAD_ID
    return src


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_cell_step_equals_torchs_cell(cell):
    torch.manual_seed(0)
    ours = Cell(cell, 6, 5)
    ref = (nn.LSTMCell if cell == "lstm" else nn.GRUCell)(6, 5)
    ours.load_state_dict(ref.state_dict())
    x, h, c = torch.randn(3, 6), torch.randn(3, 5), torch.randn(3, 5)
    got_h, got_c = ours(ours.project_input(x), h, c if cell == "lstm" else None)
    if cell == "lstm":
        want_h, want_c = ref(x, (h, c))
        torch.testing.assert_close(got_c, want_c)
    else:
        want_h, got_c = ref(x, h), None
    torch.testing.assert_close(got_h, want_h)


def _copy_bidirectional(ours: BidirectionalLayer, ref: nn.Module) -> None:
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        getattr(ours.forward_cell, name).data.copy_(getattr(ref, f"{name}_l0"))
        getattr(ours.backward_cell, name).data.copy_(getattr(ref, f"{name}_l0_reverse"))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_encoder_layer_equals_torchs_bidirectional_rnn_on_packed_padded_input(cell):
    """Padding is skipped as torch skips it in a packed sequence: the backward direction of a
    short sentence starts at its own last token."""
    torch.manual_seed(0)
    ours = BidirectionalLayer(cell, 6, 5)
    ref = (nn.LSTM if cell == "lstm" else nn.GRU)(6, 5, batch_first=True, bidirectional=True)
    _copy_bidirectional(ours, ref)
    lengths = [7, 4, 1]
    x = torch.randn(3, 7, 6)
    mask = (torch.arange(7)[None, :] < torch.tensor(lengths)[:, None]).float().unsqueeze(-1)
    got = ours(x, mask)
    packed = pack_padded_sequence(x, torch.tensor(lengths), batch_first=True)
    want, _ = pad_packed_sequence(ref(packed)[0], batch_first=True, total_length=7)
    torch.testing.assert_close(got, want)  # zero at padding, as torch pads
    torch.testing.assert_close(ours(x, None), ref(x)[0])  # no mask: every position counts


def test_the_decoder_follows_the_equations_step_by_step():
    """Recompute one decoder step by hand: bridge, stacked cells with input feeding,
    attention, h~ = tanh(W_c [c; h]), logits = E h~."""
    model = rnn_model("gru", "dot", decoder_layers=1, encoder_layers=1)
    src = padded_src([5, 3])
    tgt = torch.tensor([[BOS_ID, 7], [BOS_ID, 9]])
    with torch.no_grad():
        logits = model(src, tgt)
        memory, mask = model.encode(src)
        d = 16
        last = mask[:, 0].sum(1) - 1
        ends = torch.cat([memory[torch.arange(2), last, : d // 2], memory[:, 0, d // 2 :]], -1)
        h = torch.tanh(model.bridge(ends))
        feed = torch.zeros(2, d)
        cell = nn.GRUCell(2 * d, d)
        cell.load_state_dict(model.decoder_cells[0].state_dict())
        for t in range(2):
            embedded = model.embed(tgt[:, t]) * d**0.5  # scaled as in the Transformer
            h = cell(torch.cat([embedded, feed], -1), h)
            scores = torch.einsum("bd,bsd->bs", h, memory).masked_fill(~mask[:, 0], -torch.inf)
            context = torch.einsum("bs,bsd->bd", scores.softmax(-1), memory)
            feed = torch.tanh(model.combine(torch.cat([context, h], -1)))
            torch.testing.assert_close(logits[:, t], feed @ model.embed.weight.T)


def sources_and_targets(length):
    src, tgt = padded_src([6, 2, 4]), torch.randint(4, 30, (3, length))
    tgt[:, 0] = BOS_ID
    return src, tgt


@pytest.mark.parametrize(("cell", "score"), VARIANTS)
def test_cached_decoding_equals_the_full_prefix(cell, score):
    model, (src, tgt) = rnn_model(cell, score), sources_and_targets(6)
    with torch.no_grad():
        full = model(src, tgt)
        memory, mask = model.encode(src)
        cache, steps = model.new_cache(), []
        for t in range(tgt.size(1)):
            steps.append(model.decode(tgt[:, t : t + 1], memory if t == 0 else None, mask, cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("cell", "score"), VARIANTS)
def test_padding_never_changes_a_sentences_outputs(cell, score):
    model, (src, tgt) = rnn_model(cell, score), sources_and_targets(5)
    with torch.no_grad():
        together = model(src, tgt)
        for i in range(3):
            n = int((src[i] != PAD_ID).sum())
            alone = model(src[i : i + 1, :n], tgt[i : i + 1])
            torch.testing.assert_close(alone[0], together[i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("cell", "score"), VARIANTS)
def test_future_target_tokens_never_change_earlier_outputs(cell, score):
    model = rnn_model(cell, score)
    src = padded_src([5, 3])
    tgt = torch.randint(4, 30, (2, 6))
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(4, 30, (2, 2))
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt)[:, :4], model(src, changed)[:, :4])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_parameter_count_formula(cell):
    d, V, L, P, g = 16, 30, 2, 32, 4 if cell == "lstm" else 3
    h = d // 2
    encoder = L * 2 * (g * h * (d + h) + 2 * g * h)  # both directions: W_ih, W_hh, two biases
    decoder = (g * d * (2 * d + d) + 2 * g * d) + (L - 1) * (g * d * 2 * d + 2 * g * d)
    rest = V * d + (d * L * d + L * d) + 2 * d * d  # embeddings, bridge, W_c
    scores = {"dot": 0, "scaled_dot": 0, "general": d * d, "additive": 2 * d * d + 2 * d}
    scores["location"] = P * d + P
    for score, extra in scores.items():
        assert count_parameters(rnn_model(cell, score)) == encoder + decoder + rest + extra


def test_initialisation():
    """uniform(-0.1, 0.1), LSTM forget gates open, embeddings N(0, 1/d) with PAD at zero."""
    torch.manual_seed(0)
    model = RNN(rnn_config("lstm", "general", d_model=256), vocab_size=500)
    cell = model.decoder_cells[0]
    assert torch.all(cell.bias_ih[256:512] == 1.0) and torch.all(cell.bias_hh[256:512] == 0.0)
    for name, p in model.named_parameters():
        if name != "embed.weight" and not name.endswith("bias_ih"):
            assert p.abs().max() <= 0.1 and p.abs().max() > 0.09, name
    assert torch.all(model.embed.weight[PAD_ID] == 0)
    assert model.embed.weight[1:].std().item() == pytest.approx(256**-0.5, rel=0.02)


def test_attention_weights_are_read_per_step_from_beside_the_model():
    model = rnn_model("lstm", "additive")
    src, tgt = padded_src([5, 2]), torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, 8]])
    with torch.no_grad(), capture_cross_attention(model) as seen:
        model(src, tgt)
    (w,) = seen.values()
    assert w.shape == (2, 1, 3, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 1, 3))
    assert torch.all(w[1, :, :, 3:] == 0)  # padding gets no attention


def test_a_source_longer_than_max_positions_is_refused():
    model = rnn_model(max_positions=4)
    with pytest.raises(ValueError, match="max_positions"):
        model.encode(torch.full((1, 5), 5))


def cli(*args, input=None):
    return mtx(*args, input=input).output


def test_the_pipeline_trains_decodes_and_describes_an_rnn(prepared, tmp_path):
    """mtx train, info, translate (beam and greedy, with --attention-dir) and evaluate on an
    rnn checkpoint, as on a Transformer's."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "prepared").symlink_to(prepared)
    config = tmp_path / "rnn.yaml"
    config.write_text("model:\n  arch: rnn\n")
    sets = ["--config", config] + [x for v in run_overrides(run, "model.arch=rnn", "model.rnn_cell=gru",
            "model.attention=additive", "train.max_steps=30", "train.valid_every=30")
            for x in ("--set", v)]  # fmt: skip
    cli("train", *sets)
    best = run / "checkpoints" / "best.pt"
    facts = json.loads(cli("info", best, "--json"))
    assert facts["step"] == 30 and facts["architecture"].startswith("rnn gru, 1-layer")
    lines = [src for src, _ in toy.split_pairs("test")[:3]] + [""]
    text = "\n".join(lines) + "\n"
    out = cli("translate", "--checkpoint", best, "--attention-dir", tmp_path / "att", input=text)
    assert len(out.splitlines()) == 4
    assert out.splitlines() == [
        t.best.text for t in Translator.from_checkpoints(best).translate(lines)
    ]
    greedy = cli("translate", "--checkpoint", best, "--set", "decode.beam=1", input=text)
    assert len(greedy.splitlines()) == 4
    tr = Translator.from_checkpoints(best)
    hyps = outputs(tr, lines[:1])[0][0]
    about = json.loads((tmp_path / "att" / "000001.json").read_text())
    # (1 layer, 1 head, T, S)
    want = tr.translate(lines[:1], tr.options(attention=True))[0].attention.weights
    assert want.shape == (1, 1, len(hyps.tokens) + 1, len(tr.parts.codec.encode(lines[0])))
    torch.testing.assert_close(torch.tensor(about["attention"]), want[0, 0], atol=1e-6, rtol=0)
    assert (tmp_path / "att" / "000001.png").is_file()
    scores = json.loads(cli("evaluate", *sets, "--split", "test", "--json").splitlines()[-1])
    assert 0 <= scores["bleu"] <= 100


@pytest.mark.parametrize(("cell", "score"), [("lstm", "additive"), ("gru", "location")])
def test_a_sentence_gets_bit_identical_hypotheses_in_any_batch(cell, score):
    """As the translator batches them (decode/translator.py): sources padded to one length.
    Every product is row-stable (model/rows.py), so a sentence's beam search gives the same
    tokens and the same float scores alone as among 11 others."""
    model = rnn_model(cell, score, d_model=32)
    with torch.no_grad():
        model.embed.weight.mul_(3.0)  # sharper outputs: hypotheses of various lengths
    src = padded_src([7, 3, 5, 1, 6, 2, 7, 4, 4, 6, 2, 3])
    together = beam_search(model, src, SearchSettings(max_len_b=6), nbest=2)
    for i in range(src.size(0)):
        alone = beam_search(model, src[i : i + 1], SearchSettings(max_len_b=6), nbest=2)[0]
        assert [(h.tokens, h.score, h.log_prob) for h in alone] == [
            (h.tokens, h.score, h.log_prob) for h in together[i]
        ]
