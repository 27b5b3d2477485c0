"""The model interface of the searches (mtx/model/interface.py): every kind of model declares
it, capabilities are read, not probed, and a search's per-sentence input is its request
(mtx/decode/request.py)."""

import ast
import dataclasses

import numpy as np
import pytest
import torch
from test_architecture import ROOT, modules
from test_search import random_model, random_src

from mtx.decode.ensemble import Ensemble
from mtx.decode.request import Request, SearchBatch
from mtx.decode.rules import SearchSettings
from mtx.decode.search import beam_search, greedy_search
from mtx.decode.shortlist import Shortlist, Shortlisted
from mtx.decode.static import StaticSearch
from mtx.errors import MtxError
from mtx.model.interface import Capabilities, Decodable
from mtx.tokens import EOS_ID


def shortlisted(model):
    vocab = model.vocab_size
    top = np.tile(np.arange(3, vocab, dtype=np.int32), (vocab, 1))  # every piece a candidate
    return Shortlisted(model, Shortlist(top, np.arange(3, 6, dtype=np.int32), ""))


def kinds():
    transformer, rnn = random_model(seed=1), random_model(seed=2, arch="rnn-gru-location")
    return {
        "transformer": transformer,
        "rnn": rnn,
        "ensemble": Ensemble([transformer, rnn]),
        "shortlisted": shortlisted(transformer),
    }


EXPECTED = {
    "transformer": Capabilities(
        mixed_lengths=True, static_cache=True, output_matrix=True, attention=True, ragged=True
    ),
    "rnn": Capabilities(output_matrix=True, attention=True),
    "ensemble": Capabilities(log_probs=True),
    "shortlisted": Capabilities(log_probs=True, mixed_lengths=True, candidates=True),
}


def test_every_kind_of_model_is_a_decodable_with_its_declared_capabilities():
    for name, model in kinds().items():
        assert isinstance(model, Decodable), name
        assert model.capabilities == EXPECTED[name], name
        assert model.max_positions == random_model().cfg.max_positions
        assert model.vocab_size == 24


def test_what_a_kind_lacks_refuses_in_one_line_naming_it():
    lacking = {
        "new_static_cache": lambda m: m.new_static_cache(2, 4, True, torch.zeros(1)),
        "new_ragged_cache": lambda m: m.new_ragged_cache(8),
        "continuations": lambda m: m.continuations(None, None, None, None, [], torch.zeros(1)),
        "output_weight": lambda m: m.output_weight(),
        "cross_attention_modules": lambda m: m.cross_attention_modules(),
    }
    capability = {
        "new_static_cache": "static_cache",
        "new_ragged_cache": "ragged",
        "continuations": "candidates",
        "output_weight": "output_matrix",
        "cross_attention_modules": "attention",
    }
    refused = 0
    for model in kinds().values():
        for method, call in lacking.items():
            if getattr(model.capabilities, capability[method]):
                continue
            with pytest.raises(MtxError, match=f"^{type(model).__name__} has no [^\n]+$"):
                call(model)
            refused += 1
    assert refused >= 8


def test_an_ensemble_lists_its_members_and_a_model_itself():
    k = kinds()
    assert k["ensemble"].members() == [k["transformer"], k["rnn"]]
    assert k["transformer"].members() == [k["transformer"]]
    assert k["shortlisted"].members() == [k["transformer"]]


class LogProbs:
    """A model whose decode() already gives log-probabilities, as it declares: the search must
    take them as they are (a second log-softmax would change the scores)."""

    capabilities = Capabilities(log_probs=True)
    vocab_size = 24
    max_positions = 64

    def __init__(self, model):
        self.model, self.specials = model, model.specials

    def encode(self, src):
        return self.model.encode(src)

    def new_cache(self):
        return self.model.new_cache()

    def decode(self, tgt_in, memory, src_mask, cache=None):
        out = self.model.decode(tgt_in, memory, src_mask, cache)
        return torch.log_softmax(out.float(), dim=-1) - 1.0  # a shifted "distribution"


def test_the_search_reads_log_probs_from_the_capability():
    model, src = random_model(), random_src(batch=3)
    plain = greedy_search(model, src, SearchSettings(max_len_b=6))
    shifted = greedy_search(LogProbs(model), src, SearchSettings(max_len_b=6))
    assert [h.tokens for h in plain] == [h.tokens for h in shifted]
    for a, b in zip(plain, shifted):  # the shift is kept: one -1 per token, EOS included
        assert b.log_prob == pytest.approx(a.log_prob - (len(a.tokens) + 1), abs=1e-4)


def test_a_request_s_own_length_limit_reaches_every_search():
    """Row 1 asks for at most 3 output tokens (EOS included); the others keep a*n+b."""
    model, src = random_model(), random_src(batch=3)
    free = SearchBatch.of(src)
    asked = dataclasses.replace(free.requests[1], max_len=3)
    batch = SearchBatch(src, [free.requests[0], asked, free.requests[2]])
    a, b = 1.0, 20
    searches = {
        "greedy": lambda x: [
            [h] for h in greedy_search(model, x, SearchSettings(max_len_a=a, max_len_b=b))
        ],
        "beam": lambda x: beam_search(model, x, SearchSettings(beam=3, max_len_a=a, max_len_b=b)),
        "static": lambda x: StaticSearch(
            model, SearchSettings(beam=3, max_len_a=a, max_len_b=b), full=False
        )(x),
    }
    for name, search in searches.items():
        before, after = search(free), search(batch)
        assert len(after[1][0].tokens) + 1 <= 3, name
        assert [h[0].tokens for h in before][::2] == [h[0].tokens for h in after][::2], name


def test_a_request_s_longest_output_follows_the_rule_unless_it_has_its_own():
    r = Request((5, 6, 7, EOS_ID), line=4)
    assert r.longest(1.0, 2, 100) == 5  # 3 source tokens + 2
    assert r.longest(2.0, 0, 4) == 4  # the model's limit
    assert dataclasses.replace(r, max_len=2).longest(1.0, 50, 100) == 2
    assert dataclasses.replace(r, max_len=500).longest(1.0, 50, 100) == 100
    with pytest.raises(ValueError, match="2 requests for 3 rows"):
        SearchBatch(random_src(batch=3), [r, r])


# What the searches used to probe models for: names of the interface, its capabilities, and the
# attributes that stood for capabilities before.
PROBED = (
    {name for name in vars(Decodable) if not name.startswith("_")}
    | set(Decodable.__annotations__)
    | {f.name for f in dataclasses.fields(Capabilities)}
    | {"gives_log_probs", "mixes_lengths", "models", "packed_output", "cfg"}
)


def test_no_module_probes_a_model_for_what_its_interface_declares():
    """No `hasattr(x, NAME)` / `getattr(x, NAME, ...)` of an interface or capability name in
    mtx/ or benchmarks/: a model says what it can do in `capabilities`."""
    found = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id not in ("hasattr", "getattr") or len(node.args) < 2:
                continue
            attr = node.args[1]
            if isinstance(attr, ast.Constant) and attr.value in PROBED:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not found, "\n".join(found)
    assert "capabilities" in PROBED and "continuations" in PROBED  # the guard guards
