import math

import pytest
import torch
from conftest import tiny_model_config
from torch import nn

from mtx.model.layers import DecoderLayer, EncoderLayer
from mtx.model.positions import sinusoidal_table
from mtx.model.transformer import Transformer, count_parameters
from mtx.tokens import BOS_ID, PAD_ID


def _copy_attn(ref: nn.MultiheadAttention, ours) -> None:
    ref.in_proj_weight.copy_(ours.in_proj.weight)
    ref.in_proj_bias.copy_(ours.in_proj.bias)
    ref.out_proj.weight.copy_(ours.out_proj.weight)
    ref.out_proj.bias.copy_(ours.out_proj.bias)


def _copy_ffn_norms(ref, ours, norms) -> None:
    ref.linear1.load_state_dict(ours.ffn.fc1.state_dict())
    ref.linear2.load_state_dict(ours.ffn.fc2.state_dict())
    for ref_norm, our_norm in norms:
        ref_norm.load_state_dict(our_norm.state_dict())


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_encoder_layer_equals_torch(norm):
    torch.manual_seed(0)
    cfg = tiny_model_config(norm=norm)
    ours = EncoderLayer(cfg).eval()
    ref = nn.TransformerEncoderLayer(
        32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm == "pre"
    ).eval()
    with torch.no_grad():
        _copy_attn(ref.self_attn, ours.self_attn)
        _copy_ffn_norms(ref, ours, [(ref.norm1, ours.self_attn_norm), (ref.norm2, ours.ffn_norm)])
    x = torch.randn(2, 6, 32)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    got = ours(x, keep.unsqueeze(1))
    want = ref(x, src_key_padding_mask=~keep)
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_layer_equals_torch(norm):
    torch.manual_seed(0)
    cfg = tiny_model_config(norm=norm)
    ours = DecoderLayer(cfg).eval()
    ref = nn.TransformerDecoderLayer(
        32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm == "pre"
    ).eval()
    with torch.no_grad():
        _copy_attn(ref.self_attn, ours.self_attn)
        _copy_attn(ref.multihead_attn, ours.cross_attn)
        _copy_ffn_norms(
            ref,
            ours,
            [
                (ref.norm1, ours.self_attn_norm),
                (ref.norm2, ours.cross_attn_norm),
                (ref.norm3, ours.ffn_norm),
            ],
        )
    x, mem = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    keep = torch.tensor([[True] * 7, [True] * 3 + [False] * 4])
    got = ours(x, mem, keep.unsqueeze(1))
    want = ref(
        x,
        mem,
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(5),
        tgt_is_causal=True,
        memory_key_padding_mask=~keep,
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_positional_table_matches_the_formula():
    d, table = 16, sinusoidal_table(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def _model(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_model_config(**kw), vocab_size=50).eval()


VARIANTS = [
    {},
    {"norm": "pre"},
    {"positions": "learned"},
    {"positions": "relative", "max_relative_position": 2},
    {"norm": "pre", "positions": "relative", "max_relative_position": 0},
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_future_target_tokens_never_change_earlier_outputs(variant):
    model = _model(**variant)
    src = torch.randint(4, 50, (2, 6))
    tgt = torch.randint(4, 50, (2, 8))
    out = model(src, tgt)
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(4, 50, (2, 3))
    out2 = model(src, changed)
    torch.testing.assert_close(out2[:, :5], out[:, :5], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out2[:, 5:], out[:, 5:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_never_changes_unpadded_outputs(variant):
    model = _model(**variant)
    src, tgt = torch.randint(4, 50, (1, 5)), torch.randint(4, 50, (1, 4))
    alone = model(src, tgt)
    src_padded = torch.cat([src, torch.full((1, 3), PAD_ID)], 1)
    tgt_padded = torch.cat([tgt, torch.full((1, 2), PAD_ID)], 1)
    other_src, other_tgt = torch.randint(4, 50, (1, 8)), torch.randint(4, 50, (1, 6))
    batch = model(torch.cat([src_padded, other_src]), torch.cat([tgt_padded, other_tgt]))
    torch.testing.assert_close(batch[0, :4], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_equals_full_prefix(variant):
    model = _model(**variant)
    src = torch.randint(4, 50, (3, 7))
    src[2, 4:] = PAD_ID
    tgt = torch.cat([torch.full((3, 1), BOS_ID), torch.randint(4, 50, (3, 6))], 1)
    memory, src_mask = model.encode(src)
    full = model.decode(tgt, memory, src_mask)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, i : i + 1], memory, src_mask, cache) for i in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    # a chunk of several new positions at once, after a cached prefix
    cache = model.new_cache()
    first = model.decode(tgt[:, :3], memory, src_mask, cache)
    rest = model.decode(tgt[:, 3:], memory, src_mask, cache)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-5, rtol=1e-5)


def test_embeddings_are_shared_and_scaled():
    model = _model()
    names = [n for n, _ in model.named_parameters()]
    assert sum("embed" in n for n in names) == 1  # source, target and output share one matrix
    ids = torch.tensor([[5, 6]])
    x = model.embed_tokens(ids)
    want = model.embed.weight[ids] * math.sqrt(32) + sinusoidal_table(2, 32)
    torch.testing.assert_close(x, want)
    # the pre-softmax projection is the embedding matrix itself
    hidden = {}
    model.decoder_layers[-1].register_forward_hook(lambda m, i, out: hidden.update(h=out))
    src, tgt = torch.randint(4, 50, (2, 5)), torch.randint(4, 50, (2, 3))
    logits = model(src, tgt)
    torch.testing.assert_close(logits, hidden["h"] @ model.embed.weight.t())


@pytest.mark.parametrize("init", ["fairseq", "xavier"])
def test_initialisation_follows_model_init(init):
    """Embeddings N(0, d^-0.5) with a zero padding row in both schemes; the feed-forward layers
    as nn.Linear (uniform in +-1/sqrt(fan_in), biases too) or Xavier-uniform with zero biases;
    every attention layer of both stacks as its own init says (test_attention.py)."""
    torch.manual_seed(0)
    d, f = 256, 1024
    cfg = tiny_model_config(d_model=d, d_ff=f, n_heads=4, init=init)
    model = Transformer(cfg, vocab_size=4000)
    assert not model.embed.weight[PAD_ID].any()
    assert abs(model.embed.weight[PAD_ID + 1 :].std().item() - d**-0.5) < 0.02 * d**-0.5
    layers = [*model.encoder_layers, *model.decoder_layers]
    for layer in layers:
        fc1, fc2 = layer.ffn.fc1, layer.ffn.fc2
        if init == "fairseq":
            bounds = [(fc1.weight, d**-0.5), (fc1.bias, d**-0.5), (fc2.weight, f**-0.5)]
            bounds.append((fc2.bias, f**-0.5))
        else:
            xavier = (6 / (d + f)) ** 0.5
            bounds = [(fc1.weight, xavier), (fc2.weight, xavier)]
            assert not fc1.bias.any() and not fc2.bias.any()
        for p, bound in bounds:
            assert bound * 0.95 < p.abs().max() <= bound
    attention = [a for layer in layers for a in layer.modules() if hasattr(a, "in_proj")]
    assert len(attention) == cfg.encoder_layers + 2 * cfg.decoder_layers
    assert {a.init for a in attention} == {init}


def test_parameter_count_formula():
    cfg = tiny_model_config()
    model = Transformer(cfg, vocab_size=50)
    d, f = cfg.d_model, cfg.d_ff
    attn = 4 * (d * d + d)
    ffn = d * f + f + f * d + d
    norm = 2 * d
    want = 50 * d + 2 * (attn + ffn + 2 * norm) + 2 * (2 * attn + ffn + 3 * norm)
    assert count_parameters(model) == want


def test_logits_at_target_tokens_only_equal_the_full_logits_there():
    """Training asks for logits at the target tokens only (`keep`): the same numbers."""
    from mtx.data.batching import collate

    model = _model()
    batch = collate([[5, 6, 7, 3], [8, 3]], [[9, 10, 11, 12, 3], [13, 3]])
    full = model(batch.src, batch.tgt_in)  # (2, 5, V)
    kept = model(batch.src, batch.tgt_in, batch.tgt_index)  # (7, V)
    assert kept.shape == (7, 50)
    real = batch.tgt_out != PAD_ID
    torch.testing.assert_close(kept, full[real], atol=1e-6, rtol=0)


def test_an_unpadded_source_may_skip_its_mask():
    model = _model()
    src, tgt = torch.randint(4, 50, (3, 6)), torch.randint(4, 50, (3, 5))
    masked = model(src, tgt)
    unmasked = model(src, tgt, src_padded=False)
    torch.testing.assert_close(unmasked, masked, atol=1e-5, rtol=1e-5)
    assert model.encode(src, padded=False)[1] is None


def test_an_unpadded_training_batch_gives_attention_no_mask_tensor(monkeypatch):
    """Flash attention on GPUs takes no mask tensor: for a source without padding, every
    attention call of a training forward must pass none (the decoder's is `is_causal`)."""
    import mtx.model.attention as attention

    calls, real = [], attention.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        calls.append((attn_mask, is_causal))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    model = _model(encoder_layers=2, decoder_layers=3).train()  # inference writes it out
    src, tgt = torch.randint(4, 50, (3, 6)), torch.randint(4, 50, (3, 5))
    model(src, tgt, src_padded=False)
    assert len(calls) == 2 + 2 * 3
    assert all(mask is None for mask, _ in calls)
    assert sum(causal for _, causal in calls) == 3  # the decoder self-attentions


def test_pre_norm_stacks_end_with_a_layer_norm():
    model = _model(norm="pre")
    src = torch.randint(4, 50, (2, 5))
    memory, _ = model.encode(src)
    torch.testing.assert_close(memory.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    with torch.no_grad():
        model.decoder_norm.bias.fill_(0.5)
        model.decoder_norm.weight.zero_()  # every logit is then 0.5 * the embedding's row sum
    logits = model(src, torch.randint(4, 50, (2, 3)))
    want = 0.5 * model.embed.weight.sum(-1)
    torch.testing.assert_close(logits, want.expand_as(logits), atol=1e-5, rtol=1e-5)
    assert _model().encoder_norm is None and "encoder_norm.weight" not in _model().state_dict()


@pytest.mark.parametrize("positions", ["learned", "relative"])
def test_learned_and_relative_positions_replace_the_sinusoids(positions):
    """Learned: the model reads its own table (changing one row changes that position only);
    relative: no absolute position at all, so the encoder is permutation-equivariant up to
    the relative terms, which we switch off by zeroing them."""
    model = _model(positions=positions)
    src = torch.randint(4, 50, (1, 6))
    if positions == "learned":
        before, _ = model.encode(src)
        with torch.no_grad():
            model.position_embed.weight[3] += 1.0
        after, _ = model.encode(src)
        assert not torch.allclose(before, after)
        assert model.position_embed.weight.shape == (model.cfg.max_positions, 32)
    else:
        for layer in model.encoder_layers:
            with torch.no_grad():
                layer.self_attn.relative.keys.zero_()
                layer.self_attn.relative.values.zero_()
        perm = torch.tensor([5, 2, 0, 1, 4, 3])
        out, _ = model.encode(src)
        out_perm, _ = model.encode(src[:, perm])
        torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=1e-5)
