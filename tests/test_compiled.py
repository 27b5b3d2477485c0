"""train.compile (train/compiled.py): the compiled step computes what the eager step computes,
compiles nothing new once it has seen an epoch's batch shapes, and falls back to eager mode,
with one warning line, when compiling fails."""

import copy

import datasets
import pytest
import torch
from conftest import TINY_RUN

from mtx.config import load_config
from mtx.data.batching import BatchDataset, collate, fixed_batches, lengths, token_batches
from mtx.errors import MtxError
from mtx.model.build import make_model
from mtx.train import compiled
from mtx.train.step import LossModel, Precision, forward_loss, make_optimizer, train_step

FP32 = Precision(torch.device("cpu"))


def setup(prepared, *extra):
    cfg = load_config(None, [*TINY_RUN, "model.dropout=0.0", *extra])
    ds = datasets.load_from_disk(str(prepared / "train"))
    torch.manual_seed(0)
    model = make_model(cfg.model, 200)
    return cfg, ds, model


def epoch(cfg, ds, number: int) -> list[dict]:
    t = cfg.train
    order = token_batches(*lengths(ds), t.max_tokens, t.seed, number, t.pad_to)
    return list(BatchDataset(ds, order, t.pad_to))


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_the_compiled_step_agrees_with_eager_and_compiles_nothing_after_one_epoch(
    prepared, backend
):
    """The "eager" backend traces the step as inductor does (graphs, guards, recompiles) but
    runs it with torch's own kernels, in seconds; inductor generates the kernels too (slow:
    minutes of compiling on 2 cores). Tolerance: the compiled loss is computed whole, the
    eager one a chunk at a time, and inductor reorders sums, so gradients differ by float32
    rounding (relative norm of the difference below 1e-5)."""
    cfg, ds, model = setup(prepared, f"train.compile_backend={backend}", "train.max_tokens=4096")
    eager = LossModel(copy.deepcopy(model), cfg.train.label_smoothing)
    step = compiled.StepModule(LossModel(model, cfg.train.label_smoothing), True, backend=backend)
    first = epoch(cfg, ds, 0)
    for batch in first[:3]:  # loss and every gradient, batch by batch
        for module, m in ((eager, eager.model), (step.compiled, model)):
            m.zero_grad()
            loss, nll, _ = forward_loss(module, batch, FP32)
            loss.backward()
            module.result = (loss.detach(), nll.detach())
        torch.testing.assert_close(step.compiled.result, eager.result, rtol=1e-5, atol=1e-4)
        for (name, p), q in zip(model.named_parameters(), eager.model.parameters()):
            error = ((p.grad - q.grad).norm() / q.grad.norm()).item()
            assert error < 1e-5, (name, error)  # float32 sums in another order

    optimizer = make_optimizer(model, cfg)
    shapes = set()
    for n, batch in enumerate(first):
        step.run(lambda m, b=batch, n=n: train_step(m, optimizer, [b], cfg, n + 1, FP32), optimizer)
        shapes.add((*batch.src.shape, batch.tgt_in.size(1)))
    after_one = compiled.stats()
    for n, batch in enumerate(epoch(cfg, ds, 1)):  # another order, the same shapes
        shapes.add((*batch.src.shape, batch.tgt_in.size(1)))
        step.run(lambda m, b=batch, n=n: train_step(m, optimizer, [b], cfg, n + 1, FP32), optimizer)
    assert step.is_compiled and len(first) > 50 and len(shapes) > 10
    assert compiled.stats().compilations == after_one.compilations  # no recompiles
    assert after_one.graphs <= 8  # dynamic shapes: a few graphs for every shape


def test_padded_and_unpadded_batches_share_one_compiled_graph(prepared):
    """Compiled, every source is masked: a batch without padding (unmasked when eager) is
    traced by the same graph as one with padding, not compiled again (each compilation costs
    tens of seconds on a GPU), and its loss is the eager step's."""
    cfg, ds, model = setup(prepared, "train.compile_backend=eager")
    eager = LossModel(copy.deepcopy(model), cfg.train.label_smoothing)
    step = compiled.StepModule(LossModel(model, cfg.train.label_smoothing), True, backend="eager")
    pairs = ds.select_columns(["src_ids", "tgt_ids"])[:]
    by_length = {}
    for src, tgt in zip(pairs["src_ids"], pairs["tgt_ids"]):
        by_length.setdefault(len(src), []).append((src, tgt))
    same = max(by_length.values(), key=len)[:4]
    mixed = [group[0] for group in list(by_length.values())[:4]]
    batches = [collate(*map(list, zip(*rows)), pad_to=1) for rows in (same, mixed, same)]
    assert [b.src_padded for b in batches] == [False, True, False]
    before = compiled.stats().compilations
    with torch.no_grad():
        for batch in batches:
            expected = forward_loss(eager, batch, FP32)[:2]
            torch.testing.assert_close(forward_loss(step.compiled, batch, FP32)[:2], expected)
    assert compiled.stats().compilations - before == 1
    assert step.loss_model.mask_always and not eager.mask_always


@pytest.mark.slow  # torch.compile over a run (the compiled step: the other tests of this file)
def test_static_shapes_compile_twice_and_nothing_after_the_first_epoch(prepared):
    """train.static_shapes: the first shape compiled specialised, the second once more with
    the changing sizes symbolic, then nothing more, however many shapes come (automatic
    dynamic shapes); a batch's empty pairs change nothing: its loss is that of its real pairs
    collated as usual, and the compiled step's that of the eager step."""
    cfg, ds, model = setup(
        prepared, "train.compile_backend=eager", "train.max_tokens=1024", "train.static_shapes=true"
    )
    t = cfg.train
    eager = LossModel(copy.deepcopy(model), t.label_smoothing)
    step = compiled.StepModule(
        LossModel(model, t.label_smoothing), True, backend="eager", static=True
    )
    optimizer = make_optimizer(model, cfg)

    def fixed_epoch(number):
        order = fixed_batches(*lengths(ds), t.max_tokens, t.seed, number, t.pad_to)
        return order, list(BatchDataset(ds, order, t.pad_to, t.max_tokens))

    order, first = fixed_epoch(0)
    with torch.no_grad():
        for rows, batch in list(zip(order, first))[:5]:
            pairs = ds.select_columns(["src_ids", "tgt_ids"])[rows.tolist()]
            free = collate(pairs["src_ids"], pairs["tgt_ids"], t.pad_to)
            expected = forward_loss(eager, free, FP32)[:2]
            torch.testing.assert_close(forward_loss(eager, batch, FP32)[:2], expected)
            torch.testing.assert_close(forward_loss(step.compiled, batch, FP32)[:2], expected)
    before = compiled.stats().compilations
    shapes = set()
    for n, batch in enumerate(first):
        step.run(lambda m, b=batch, n=n: train_step(m, optimizer, [b], cfg, n + 1, FP32), optimizer)
        shapes.add(tuple(batch.src.shape))
    after_one = compiled.stats().compilations
    assert len(shapes) > 8  # more than dynamo's default number of graphs per frame
    assert after_one - before <= 2  # not one per shape
    for number in (1, 2):
        for n, batch in enumerate(fixed_epoch(number)[1]):
            assert tuple(batch.src.shape) in shapes
            step.run(
                lambda m, b=batch, n=n: train_step(m, optimizer, [b], cfg, n + 1, FP32), optimizer
            )
    assert step.is_compiled and compiled.stats().compilations == after_one


def test_a_step_that_fails_to_compile_runs_eagerly_with_one_warning(prepared):
    cfg, ds, model = setup(prepared)
    reference = copy.deepcopy(model)

    def broken_backend(gm, example_inputs):
        raise RuntimeError("no compiler here")

    warnings = []
    loss_model = LossModel(model, cfg.train.label_smoothing)
    step = compiled.StepModule(loss_model, True, warnings.append, broken_backend)
    eager = compiled.StepModule(LossModel(reference, cfg.train.label_smoothing), False)
    opt, ref_opt = make_optimizer(model, cfg), make_optimizer(reference, cfg)
    for n, batch in enumerate(epoch(cfg, ds, 0)[:4]):
        stats = step.run(lambda m, b=batch, n=n: train_step(m, opt, [b], cfg, n + 1, FP32), opt)
        want = eager.run(
            lambda m, b=batch, n=n: train_step(m, ref_opt, [b], cfg, n + 1, FP32), ref_opt
        )
        assert torch.equal(stats.loss, want.loss)
    assert len(warnings) == 1 and "train.compile failed" in warnings[0]
    assert "\n" not in warnings[0] and "no compiler here" in warnings[0]
    assert not step.is_compiled and loss_model.chunked and not loss_model.mask_always
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)  # the failed attempt left no trace


def test_train_compile_takes_auto_true_or_false():
    assert compiled.wanted("auto", torch.device("cuda")) and not compiled.wanted(
        "auto", torch.device("cpu")
    )
    assert compiled.wanted("true", torch.device("cpu"))
    assert not compiled.wanted("false", torch.device("cuda"))
    assert load_config(None, ["train.compile=true"]).train.compile == "true"  # YAML's boolean
    assert load_config(None, []).train.compile == "auto"  # compiled on CUDA: measured on an H100
    with pytest.raises(MtxError, match="train.compile must be auto, true or false"):
        load_config(None, ["train.compile=sometimes"])
    with pytest.raises(MtxError, match="train.compile_mode must be default, reduce-overhead or"):
        load_config(None, ["train.compile_mode=fastest"])
