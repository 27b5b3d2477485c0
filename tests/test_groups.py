"""Sources of several padded lengths in one batch (model/groups.py): the rows keep their groups,
and every sentence gets, bit for bit, what it gets in a batch of its own length."""

import pytest
import torch
from conftest import tiny_model_config
from test_search import random_model

from mtx.decode.ensemble import Ensemble
from mtx.decode.rules import SearchSettings
from mtx.decode.search import Sampling, beam_search, greedy_search
from mtx.model.build import make_model
from mtx.model.groups import Groups
from mtx.tokens import EOS_ID, PAD_ID


def test_selecting_rows_keeps_each_group_and_drops_empty_ones():
    g = Groups([torch.arange(3)[:, None].expand(3, 2), 10 + torch.arange(4)[:, None]])
    assert g.size(0) == 7 and g.sizes == [3, 4]
    picked = g[torch.tensor([0, 2, 4, 6])]
    assert picked.sizes == [2, 2]
    assert picked.parts[0][:, 0].tolist() == [0, 2] and picked.parts[0].shape == (2, 2)
    assert picked.parts[1][:, 0].tolist() == [11, 13]
    only_second = g.index_select(0, torch.tensor([3, 5]))
    assert only_second.sizes == [2] and only_second.parts[0][:, 0].tolist() == [10, 12]
    assert g[torch.arange(7)].parts[1] is g.parts[1]  # all rows: not copied
    with pytest.raises(ValueError, match="ascending"):
        g[torch.tensor([4, 1])]
    with pytest.raises(IndexError):
        g[torch.tensor([7])]
    x = torch.arange(14)  # two rows per batch row: a sentence's beams
    assert [p.tolist() for p in g.split(x, 2)] == [list(range(6)), list(range(6, 14))]
    assert g.repeat_interleave(2).sizes == [6, 8]
    # a repeated row is copied (a sentence's one row becoming its copies), even where the
    # group's count of rows comes out as before
    twice = g[torch.tensor([0, 0, 1, 3, 3, 3, 3])]
    assert twice.sizes == [3, 4] and twice.parts[0][:, 0].tolist() == [0, 0, 1]
    assert twice.parts[1][:, 0].tolist() == [10, 10, 10, 10]


def sources(lengths: list[int], seed: int = 3, vocab: int = 24) -> list[torch.Tensor]:
    """One source per length (tokens + EOS), each padded to a multiple of 4 of its own."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        padded = -(-(n + 1) // 4) * 4
        src = torch.full((1, padded), PAD_ID)
        src[0, :n] = torch.randint(4, vocab, (n,), generator=g)
        src[0, n] = EOS_ID
        out.append(src)
    return out


def mixed(srcs: list[torch.Tensor]) -> Groups:
    """The sources in groups of equal padded length, in the order given (ascending)."""
    parts: list[list[torch.Tensor]] = []
    for s in srcs:
        if parts and parts[-1][0].size(1) == s.size(1):
            parts[-1].append(s)
        else:
            parts.append([s])
    return Groups([torch.cat(p) for p in parts])


LENGTHS = [1, 2, 2, 5, 6, 7, 9, 10, 14]  # padded to 4, 4, 4, 8, 8, 8, 12, 12, 16


@pytest.mark.parametrize("norm,positions", [("post", "sinusoidal"), ("pre", "relative")])
@pytest.mark.parametrize("packed", [None, "fp32"])
def test_a_mixed_batch_gives_each_sentence_what_it_gets_alone(norm, positions, packed):
    torch.manual_seed(0)
    cfg = tiny_model_config(norm=norm, positions=positions, max_relative_position=3)
    model = make_model(cfg, vocab_size=24).eval()
    with torch.no_grad():  # sharper outputs: hypotheses end at various lengths
        model.embed.weight.mul_(3.0)
    model.pack(packed)
    srcs = sources(LENGTHS)
    batch = mixed(srcs)
    assert len(batch.parts) == 4
    beams = beam_search(model, batch, SearchSettings(max_len_b=8), nbest=2)
    greedy = greedy_search(model, batch, SearchSettings(max_len_b=8))
    seeds = [[7, i, j] for i in range(len(srcs)) for j in range(2)]  # 2 samples a sentence
    sampling = Sampling(top_k=5)
    samples = greedy_search(
        model,
        batch.repeat_interleave(2),
        SearchSettings(max_len_b=8, limit=1024),
        sampling=sampling,
        seeds=seeds,
    )
    copied = greedy_search(
        model,
        batch,
        SearchSettings(max_len_b=8, limit=1024),
        sampling=sampling,
        seeds=seeds,
        copies=2,
    )
    assert [(h.tokens, h.score) for h in copied] == [(h.tokens, h.score) for h in samples]
    for i, src in enumerate(srcs):
        alone = beam_search(model, src, SearchSettings(max_len_b=8), nbest=2)[0]
        assert [(h.tokens, h.score, h.log_prob) for h in alone] == [
            (h.tokens, h.score, h.log_prob) for h in beams[i]
        ]
        one = greedy_search(model, src, SearchSettings(max_len_b=8))[0]
        assert (one.tokens, one.score) == (greedy[i].tokens, greedy[i].score)
        drawn = greedy_search(
            model,
            src.repeat_interleave(2, 0),
            SearchSettings(max_len_b=8, limit=1024),
            sampling=sampling,
            seeds=seeds[2 * i : 2 * i + 2],
        )
        assert [(h.tokens, h.score) for h in drawn] == [
            (h.tokens, h.score) for h in samples[2 * i : 2 * i + 2]
        ]
    # the sentences did not all end together: some left the batch while others went on
    assert len({len(b[0].tokens) for b in beams}) > 2


def test_an_ensemble_of_transformers_mixes_lengths_and_one_with_an_rnn_does_not():
    transformers = Ensemble([random_model(seed=1), random_model(seed=2)])
    assert transformers.capabilities.mixed_lengths
    with_rnn = Ensemble([random_model(seed=1), random_model(arch="rnn-gru-location")])
    assert not with_rnn.capabilities.mixed_lengths
    srcs = sources(LENGTHS[:6])
    together = beam_search(transformers, mixed(srcs), SearchSettings(beam=3, max_len_b=6))
    for i, src in enumerate(srcs):
        alone = beam_search(transformers, src, SearchSettings(beam=3, max_len_b=6))[0]
        assert [(h.tokens, h.score) for h in alone] == [(h.tokens, h.score) for h in together[i]]


def test_the_encoder_decoder_attention_of_a_mixed_batch_reads_each_groups_own_memory():
    """Teacher-forced, without a cache: the logits of each group equal the group's alone."""
    model = random_model(seed=4)
    srcs = sources(LENGTHS)
    batch = mixed(srcs)
    tgt = torch.randint(4, 24, (len(srcs), 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        memory, mask = model.encode(batch)
        logits = model.decode(tgt, memory, mask)
        alone = [model.decode(tgt[i : i + 1], *model.encode(s)) for i, s in enumerate(srcs)]
    assert torch.equal(logits, torch.cat(alone))
