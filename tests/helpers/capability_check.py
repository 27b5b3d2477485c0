"""Batch independence under one CPU capability: run with ATEN_CPU_CAPABILITY set (ATen reads
it once, when torch loads), by tests/test_capabilities.py. Prints one JSON object:
{"capability": what ATen runs, "operations": [...], "searches": [...], "checked": n}, the
two lists naming what gave an element or a sentence other numbers in another batch.

1. Operations: every element-wise or row-wise operation of the decoding path, on rows of
   awkward widths (not multiples of 8 or 16 floats) taken alone, in other subsets, and
   within a larger tensor, must give each row the same bits.
2. Searches: every architecture mtx ships (the Transformer post- and pre-norm with each
   position kind; the RNN with each cell and attention score), with widths that leave
   ATen's vector loops tails (d_model 40, d_k 10, d_ff 72), beam 4 (2-best) and greedy, with
   torch's products, packed fp32 and int8 layers: 12 sentences, padded to one length as the
   translator pads them, get bit-identical hypotheses and scores in the batch, in the
   reversed batch and in halves, and 4 of them (of both padded lengths) alone; and for the
   Transformer (which takes sources of several lengths in one batch, model/groups.py), those
   4, each cut to its own padded length, get the same alone as in a batch of both lengths.
3. Shortlisted searches (decode/shortlist.py): the Transformer and the SSRU student over a
   vocabulary of 300 through a random lexical shortlist (sentences of 64 and of 128 slots;
   each batch's union of candidates another set of columns), with each kind of product,
   beam and greedy, alone, reversed, in halves and in mixed lengths, as above.
4. Speculative greedy search (decode/speculative.py): every Transformer of section 2 with
   the SSRU student and with itself as drafts, with each kind of product, in one padded
   length and in mixed lengths, must give greedy search's hypotheses and scores.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from mtx.config import ATTENTION_SCORES, ModelConfig
from mtx.decode.rules import SearchSettings
from mtx.decode.search import beam_search, greedy_search
from mtx.decode.shortlist import Shortlist, Shortlisted
from mtx.decode.speculative import speculative_search
from mtx.model import packed
from mtx.model.build import make_model
from mtx.model.groups import Groups
from mtx.model.rows import ACTIVATIONS, linear, sigmoid
from mtx.tokens import EOS_ID, PAD_ID, padded_length

VOCAB = 53


def operations() -> list[str]:
    ops = {
        "exp": torch.exp,
        "tanh": torch.tanh,
        "rows.sigmoid": sigmoid,
        "rows.swish": ACTIVATIONS["swish"],
        "gelu": ACTIVATIONS["gelu"],
        "log_softmax": lambda x: torch.log_softmax(x, -1),
        "softmax": lambda x: torch.softmax(x, -1),
        "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
        "relu": F.relu,
        "max-norm": lambda x: torch.linalg.vector_norm(x, float("inf"), -1, keepdim=True),
        "arithmetic": lambda x: (x * 1.7 + 0.3) / (x.abs() + 1.0) - x,
        "cumsum": lambda x: x.cumsum(-1),
        "rows.linear": lambda x: linear(x, torch.linspace(-1, 1, 13 * x.size(-1)).view(13, -1)),
    }
    bad = []
    g = torch.Generator().manual_seed(0)
    for name, f in ops.items():
        for width in (5, 7, 10, 20, 33, 40, 72, 131):
            x = torch.randn(40, width, generator=g) * 4
            whole = f(x)
            subsets = [(0, 1), (3, 4), (7, 10), (1, 13), (20, 40)]
            if any(not torch.equal(f(x[a:b].clone()), whole[a:b]) for a, b in subsets):
                bad.append(f"{name} (rows of {width})")
                break
    return bad


def architectures() -> list[dict]:
    shared = dict(d_model=40, n_heads=4, d_ff=72, dropout=0.0, max_positions=64)
    out = []
    # pre-norm with sinusoidal and learned positions takes swish and GELU (pretrained
    # models' activations: model/rows.py); the other Transformers the paper's ReLU
    activations = {("pre", "sinusoidal"): "swish", ("pre", "learned"): "gelu"}
    for norm in ("post", "pre"):
        for positions in ("sinusoidal", "learned", "relative"):
            out.append(dict(arch="transformer", norm=norm, positions=positions,
                            max_relative_position=4, encoder_layers=2, decoder_layers=2,
                            activation=activations.get((norm, positions), "relu")))  # fmt: skip
    out.append(
        dict(
            arch="transformer",
            decoder_self="ssru",
            decoder_d_ff=24,
            encoder_layers=3,
            decoder_layers=1,
        )
    )  # fmt: skip (a student's shape: model/ssru.py)
    for cell in ("lstm", "gru"):
        for score in ATTENTION_SCORES:
            out.append(dict(arch="rnn", rnn_cell=cell, attention=score, encoder_layers=1,
                            decoder_layers=2))  # fmt: skip
    return [shared | x for x in out]


def sources(n: int = 12, vocab: int = VOCAB) -> torch.Tensor:
    """n sources of 1 to 14 tokens + EOS, padded to one length, as the translator pads them."""
    g = torch.Generator().manual_seed(1)
    lengths = [1 + (5 * i) % 14 for i in range(n)]
    src = torch.full((n, 16), PAD_ID)
    for i, k in enumerate(lengths):
        src[i, :k] = torch.randint(4, vocab, (k,), generator=g)
        src[i, k] = EOS_ID
    return src


def mixed_lengths(src: torch.Tensor) -> tuple[Groups, list[torch.Tensor], list[int]]:
    """The sources cut to their own padded lengths (as the translator pads them): a batch of
    groups, ascending in length, each source alone, and the order of the batch's rows."""
    own = [src[i : i + 1, : padded_length(int((src[i] != PAD_ID).sum()))] for i in range(len(src))]
    order = sorted(range(len(own)), key=lambda i: own[i].size(1))
    lengths = sorted({s.size(1) for s in own})
    groups = [torch.cat([own[i] for i in order if own[i].size(1) == n]) for n in lengths]
    return Groups(groups), own, order


def random_shortlist(vocab: int) -> Shortlist:
    """5 target pieces for each source piece and 12 frequent ones, at random: 40 to 80
    candidates a sentence of these sources."""
    g = torch.Generator().manual_seed(2)
    top = torch.randint(4, vocab, (vocab, 5), generator=g).int().numpy()
    return Shortlist(top, torch.arange(4, 16, dtype=torch.int32).numpy(), "")


def shortlisted_searches() -> tuple[list[str], int]:
    """Section 3: the searches of section 2 through a shortlist, over a larger vocabulary."""
    vocab, bad, checked = 300, [], 0
    for values in architectures()[:1] + [a for a in architectures() if "decoder_self" in a]:
        torch.manual_seed(0)
        model = make_model(ModelConfig(**values), vocab).eval()
        with torch.no_grad():
            model.embed.weight.mul_(3.0)
        listed = Shortlisted(model, random_shortlist(vocab))
        found, n = batchings(listed, values.get("decoder_self", "attention"), model.pack)
        bad += [f"shortlisted {values['arch']}: {x}" for x in found]
        checked += n
    return bad, checked


def batchings(model, name: str, pack) -> tuple[list[str], int]:
    """Each sentence's hypotheses alone, reversed, in halves (and in mixed lengths), under
    each kind of product (`pack`) and search, against those of the whole batch."""
    src = sources(vocab=getattr(model, "vocab_size", VOCAB))
    n = src.size(0)
    groups = {
        "alone": [[i] for i in (0, 3, 5, 11)],
        "reversed": [list(range(n))[::-1]],
        "halves": [list(range(0, n, 2)), list(range(1, n, 2))],
    }
    mixed, own, order = mixed_lengths(src)
    assert len(mixed.parts) > 1
    kinds = ["torch products", *(k for k in packed.KINDS if packed.available(k))]
    bad, checked = [], 0
    for kind in kinds:
        pack(None if kind == "torch products" else kind)
        for search in ("beam", "greedy"):

            def run(s, search=search) -> list:
                if search == "greedy":
                    return [
                        (h.tokens, h.score)
                        for h in greedy_search(model, s, SearchSettings(max_len_b=6))
                    ]
                hyps = beam_search(model, s, SearchSettings(max_len_b=6), nbest=2)
                return [[(h.tokens, h.score, h.log_prob) for h in hs] for hs in hyps]

            together = run(src)
            for label, parts in groups.items():
                for rows in parts:
                    checked += 1
                    if run(src[rows]) != [together[i] for i in rows]:
                        bad.append(f"{name}, {kind}, {search}: {label} {rows}")
                        break
            if model.capabilities.mixed_lengths:  # several source lengths at once
                checked += 1
                # the sentences decoded alone above, each at its own padded length (of both
                # groups of lengths), against the same sentences in the mixed batch
                rows = [k for k, i in enumerate(order) if [i] in groups["alone"]]
                alone = [run(own[order[k]])[0] for k in rows]
                if [run(mixed)[k] for k in rows] != alone:
                    bad.append(f"{name}, {kind}, {search}: mixed lengths")
    return bad, checked


def searches() -> tuple[list[str], int]:
    """Section 2: every architecture."""
    bad, checked = [], 0
    for values in architectures():
        torch.manual_seed(0)
        model = make_model(ModelConfig(**values), VOCAB).eval()
        with torch.no_grad():
            model.embed.weight.mul_(3.0)  # sharper outputs: hypotheses of various lengths
        name = ", ".join(f"{v}" for k, v in values.items() if k in ("arch", "norm", "positions",
                                                                     "rnn_cell", "attention",
                                                                     "decoder_self",
                                                                     "activation"))  # fmt: skip
        found, n = batchings(model, name, model.pack)
        bad, checked = bad + found, checked + n
    return bad, checked


def speculative() -> tuple[list[str], int]:
    """Section 4: speculative greedy search against greedy search."""
    bad, checked = [], 0
    students = [a for a in architectures() if "decoder_self" in a]
    torch.manual_seed(1)
    student = make_model(ModelConfig(**students[0]), VOCAB).eval()
    mixed = mixed_lengths(sources())[0]
    for values in architectures():
        if values["arch"] != "transformer" or "decoder_self" in values:
            continue
        torch.manual_seed(0)
        model = make_model(ModelConfig(**values), VOCAB).eval()
        with torch.no_grad():
            model.embed.weight.mul_(3.0)
        for kind in [None, *(k for k in packed.KINDS if packed.available(k))]:
            model.pack(kind)
            student.pack(kind)
            for src in (sources(), mixed):
                s = SearchSettings(max_len_b=6)
                greedy = [(h.tokens, h.score) for h in greedy_search(model, src, s)]
                for name, draft in (("student", student), ("itself", model)):
                    checked += 1
                    got = speculative_search(model, draft, src, s, 3)
                    if [(h.tokens, h.score) for h in got] != greedy:
                        bad.append(
                            f"speculative {values['norm']}-{values['positions']}, {kind}, {name}"
                        )
    return bad, checked


def main() -> None:
    torch.set_num_threads(2)
    ops = operations()
    found, checked = searches()
    listed, more = shortlisted_searches()
    found, checked = found + listed, checked + more
    drafted, more = speculative()
    found, checked = found + drafted, checked + more
    capability = torch.backends.cpu.get_cpu_capability()
    print(json.dumps({"capability": capability, "operations": ops, "searches": found,
                      "checked": checked}))  # fmt: skip


if __name__ == "__main__":
    main()
