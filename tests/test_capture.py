"""Attention read from beside the model (mtx/model/capture.py): the weights recorded are the
attention the model computed, in eval and in training (with their graph), the model runs as
it would without the reading, and one rule names the layer read for training and decoding."""

import dataclasses

import pytest
import torch
from conftest import tiny_model_config

from mtx.config import Config, DecodeConfig, TrainConfig, load_config
from mtx.errors import MtxError
from mtx.model.attention import attention
from mtx.model.capture import Heads, capture_cross_attention
from mtx.model.transformer import Transformer
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID
from mtx.train.loss import alignment_loss
from mtx.train.step import Guide, LossModel

V = 40


def model_and_batch(layers: int = 3, seed: int = 0):
    torch.manual_seed(seed)
    model = Transformer(tiny_model_config(decoder_layers=layers), V).eval()
    src = torch.tensor([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, PAD_ID, PAD_ID]])
    tgt_in = torch.tensor([[BOS_ID, 11, 12, 13], [BOS_ID, 14, 15, PAD_ID]])
    return model, src, tgt_in


def by_hand(model, src, tgt_in, layer: int) -> torch.Tensor:
    """The encoder-decoder attention weights of `layer`, computed from its input."""
    memory, mask = model.encode(src)
    x = model.embed_tokens(tgt_in)
    for i, block in enumerate(model.decoder_layers):
        if i == layer:
            h = block.self_attn_norm(x + block.self_attn(x, mask=None, causal=True))  # post-norm
            q = block.cross_attn.project_q(h)
            k, v = block.cross_attn.project_kv(memory)
            return attention(q, k, v, mask.unsqueeze(1), False)[1]
        x = block(x, memory, mask)
    raise AssertionError(layer)


@torch.no_grad()
def test_the_weights_read_are_the_attention_the_model_computed():
    model, src, tgt_in = model_and_batch()
    memory, mask = model.encode(src)
    plain = model.decode(tgt_in, memory, mask)
    with capture_cross_attention(model) as seen:
        read = model.decode(tgt_in, memory, mask)
    assert sorted(seen) == [0, 1, 2] and torch.equal(read, plain)  # reading changes nothing
    for layer, weights in seen.items():
        assert weights.shape == (2, 4, 4, 5)  # (B, H, T, S)
        torch.testing.assert_close(weights, by_hand(model, src, tgt_in, layer))
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 4))
        assert torch.all(weights[1, :, :, 3:] == 0)  # no attention on the source's padding
    assert all(not m.listeners for m in model.cross_attention_modules())


@torch.no_grad()
def test_stop_ends_the_pass_at_the_layer_read_and_reads_the_same_weights():
    model, src, tgt_in = model_and_batch()
    memory, mask = model.encode(src)
    with capture_cross_attention(model, [1]) as whole:
        model.decode(tgt_in, memory, mask)
    after = []
    model.decoder_layers[2].register_forward_pre_hook(lambda *_: after.append(2))
    with capture_cross_attention(model, [1], stop=True) as seen:
        model.decode(tgt_in, memory, mask)
        after.append("returned")
    assert list(seen) == [1] and torch.equal(seen[1], whole[1])
    assert after == []  # neither layer 2 nor the rest of the `with` body ran
    assert all(not m.listeners for m in model.cross_attention_modules())


def test_in_training_the_weights_keep_their_graph_and_the_step_is_unchanged():
    model, src, tgt_in = model_and_batch()
    model.train()  # tiny_model_config has no dropout
    fused = model(src, tgt_in)  # the fused kernels: nothing listens
    with capture_cross_attention(model, [0], graph=True) as seen:
        written = model(src, tgt_in)  # layer 0 written out, to give its weights
    torch.testing.assert_close(written, fused)
    assert seen[0].requires_grad
    seen[0][:, 0].sum().backward()
    assert model.decoder_layers[0].cross_attn.in_proj.weight.grad is not None


def test_the_beams_of_a_sentence_come_back_as_rows_of_their_own():
    model, src, tgt_in = model_and_batch()
    with torch.no_grad():
        memory, mask = model.encode(src)
        cache = model.new_cache()
        beams = tgt_in[:, :1].repeat_interleave(3, 0)  # 3 beams a sentence, one memory row
        with capture_cross_attention(model, [0]) as seen:
            model.decode(beams, memory, mask, cache)
    assert seen[0].shape == (6, 4, 1, 5)
    assert torch.equal(seen[0][0], seen[0][2]) and torch.equal(seen[0][3], seen[0][5])


def test_one_rule_names_the_layer_for_training_and_decoding():
    guided = Config(train=TrainConfig(align_weight=0.05, align_layer=-2, align_heads=2))
    heads = Heads.of(guided)
    assert heads == dataclasses.replace(Heads.guide(guided), reading="shift")
    assert heads.guided and heads.heads == (0, 1)
    assert heads.index(6) == 4 and heads.index(2) == 0
    with pytest.raises(MtxError, match=r"train.align_layer -2: the decoder has 1 layer"):
        heads.index(1)
    named = Config(decode=DecodeConfig(align_layer=3, align_heads=[1, 3]))
    assert Heads.of(named) == Heads(3, (1, 3))
    with pytest.raises(MtxError, match=r"decode.align_layer 3: the decoder has 2 layer"):
        Heads.of(named).index(2)
    assert Heads.of(Config()) == Heads(-1) and Heads(-1).index(1) == 0  # a recurrent model's
    weights = torch.rand(2, 4, 3, 5)
    assert torch.equal(Heads(0, (1, 3)).pick(weights), weights[:, [1, 3]])
    assert torch.equal(Heads(0).pick(weights), weights)
    with pytest.raises(MtxError, match=r"decode.align_heads: the layer has 4 heads"):
        Heads(0, (4,)).pick(weights)


def test_the_listeners_are_removed_when_the_pass_fails():
    model, src, tgt_in = model_and_batch()
    with pytest.raises(ValueError, match="max_positions"):
        with capture_cross_attention(model):
            model.decode(torch.full((1, 2000), 5), *model.encode(src[:1]))
    assert all(not m.listeners for m in model.cross_attention_modules())


def test_the_guided_loss_reads_its_heads_under_torch_compile_as_in_eager():
    model, src, tgt_in = model_and_batch(layers=2)
    model.train()
    cfg = Config(train=TrainConfig(align_weight=0.05, align_layer=-1, align_heads=2))
    loss_model = LossModel(model, 0.1, Guide.of(cfg))
    tgt_out = torch.tensor([[11, 12, 13, EOS_ID], [14, 15, EOS_ID, PAD_ID]])
    index = (tgt_out.flatten() != PAD_ID).nonzero().squeeze(1)
    align = (torch.tensor([[0, 0, 0], [0, 1, 1], [1, 0, 1]]), torch.tensor([1.0, 1.0, 1.0]))
    eager = loss_model(src, tgt_in, tgt_out, index, True, align)
    compiled = torch.compile(loss_model, backend="eager", fullgraph=True)  # one graph, traced
    out = compiled(src, tgt_in, tgt_out, index, True, align)
    assert eager.align is not None and eager.align > 0
    torch.testing.assert_close(tuple(out), tuple(eager))


def by_hand_full(model, src, tgt_in, layer: int) -> torch.Tensor:
    """The encoder-decoder attention of `layer` in a pass without the causal mask, each
    position attending to every target token that is not padding."""
    memory, mask = model.encode(src)
    own = (tgt_in != PAD_ID).unsqueeze(1)
    x = model.embed_tokens(tgt_in)
    for i, block in enumerate(model.decoder_layers):
        h = block.self_attn_norm(x + block.self_attn(x, mask=own))
        if i == layer:
            q = block.cross_attn.project_q(h)
            k, v = block.cross_attn.project_kv(memory)
            return attention(q, k, v, mask.unsqueeze(1), False)[1]
        x = block(x, memory, mask, full=own)
    raise AssertionError(layer)


def full_weights(model, src, tgt_in, layer: int) -> torch.Tensor:
    with torch.no_grad(), capture_cross_attention(model, [layer], stop=True) as seen:
        model.full_context(tgt_in, *model.encode(src), layer + 1)
    return seen[layer]


def step_weights(model, src, tgt_in, layer: int) -> torch.Tensor:
    with torch.no_grad(), capture_cross_attention(model, [layer], stop=True) as seen:
        model.decode(tgt_in, *model.encode(src))
    return seen[layer]


def test_the_full_context_pass_sees_every_target_token_and_no_padding():
    """Garg et al.'s alignment pass (Transformer.full_context): no causal mask, so a row sees
    the tokens after it; the target's padding is masked, so a padded sentence reads as alone."""
    model, src, tgt_in = model_and_batch()
    with torch.no_grad():
        for layer in (0, 2):
            expected = by_hand_full(model, src, tgt_in, layer)
            torch.testing.assert_close(full_weights(model, src, tgt_in, layer), expected)
    later = tgt_in.clone()
    later[0, 3] = 20  # the last token of the first sentence
    assert not torch.allclose(full_weights(model, src, later, 1)[0, :, 0],
                              full_weights(model, src, tgt_in, 1)[0, :, 0])  # fmt: skip
    assert torch.equal(step_weights(model, src, later, 1)[0, :, 0],
                       step_weights(model, src, tgt_in, 1)[0, :, 0])  # fmt: skip
    alone = full_weights(model, src[1:, :3], tgt_in[1:, :3], 1)
    torch.testing.assert_close(full_weights(model, src, tgt_in, 1)[1:, :, :3, :3], alone)


def test_only_a_decoder_with_its_own_attention_has_a_full_context_pass():
    from mtx.config import ModelConfig
    from mtx.model.rnn import RNN

    model, src, tgt_in = model_and_batch()
    ssru = Transformer(tiny_model_config(decoder_self="ssru"), V)
    with pytest.raises(MtxError, match="decoder_self ssru is recurrent"):
        ssru.full_context(tgt_in, *ssru.encode(src), 1)
    rnn = RNN(ModelConfig(arch="rnn", d_model=16, encoder_layers=1, decoder_layers=1), V)
    with pytest.raises(MtxError, match="RNN has no full-context pass"):
        rnn.full_context(tgt_in, *rnn.encode(src), 1)
    with pytest.raises(MtxError, match="train.align_context full needs the decoder's own"):
        load_config(None, ["train.align_weight=0.05", "model.decoder_self=ssru"])


def test_each_reading_is_chosen_once_for_training_and_decoding():
    guided = Config(train=TrainConfig(align_weight=0.05))
    # trained in full context, read (by default) at the row that reads the token
    assert Heads.guide(guided).reading == "full" and Heads.of(guided).reading == "shift"
    causal = Config(train=TrainConfig(align_weight=0.05, align_context="causal"))
    assert Heads.guide(causal).reading == "step" == Heads.of(causal).reading
    assert Heads.of(Config()).reading == "step"  # a model trained without guidance
    asked = Config(train=guided.train, decode=DecodeConfig(align_reading="step"))
    assert Heads.of(asked) == dataclasses.replace(Heads.guide(guided), reading="step")
    named = Config(decode=DecodeConfig(align_heads=[1], align_reading="full"))
    assert Heads.of(named) == Heads(-1, (1,), reading="full")


def test_the_guided_loss_in_full_context_reads_the_full_context_pass():
    model, src, tgt_in = model_and_batch(layers=2)
    model.train()  # tiny_model_config has no dropout
    tgt_out = torch.tensor([[11, 12, 13, EOS_ID], [14, 15, EOS_ID, PAD_ID]])
    index = (tgt_out.flatten() != PAD_ID).nonzero().squeeze(1)
    align = (torch.tensor([[0, 0, 0], [0, 1, 1], [1, 0, 1]]), torch.tensor([1.0, 1.0, 1.0]))
    losses = {}
    for context in ("full", "causal"):
        cfg = Config(train=TrainConfig(align_weight=0.05, align_layer=0, align_context=context))
        losses[context] = LossModel(model, 0.1, Guide.of(cfg))(
            src, tgt_in, tgt_out, index, True, align
        )
    plain = LossModel(model, 0.1)(src, tgt_in, tgt_out, index, True)
    # full context reads the target tokens themselves; causal, the decoder's inputs
    for context, read, tokens in (
        ("full", full_weights, tgt_out),
        ("causal", step_weights, tgt_in),
    ):
        expected = alignment_loss(read(model, src, tokens, 0)[:, :1], *align)
        torch.testing.assert_close(losses[context].align, expected)
        # the translating pass is the same: only the alignment term is added
        torch.testing.assert_close(losses[context].nll, plain.nll)
    assert not torch.allclose(losses["full"].align, losses["causal"].align)
    losses["full"].loss.backward()
    assert model.decoder_layers[0].self_attn.in_proj.weight.grad is not None
