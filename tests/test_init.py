"""Fine-tuning (train/init.py): a run that starts from a trained model on data of another kind,
encoded with that model's SentencePiece model (data.spm_model)."""

import hashlib

import pytest
import torch
from conftest import TINY_RUN
from helpers.common import assert_same_parameters, last, mtx, records, write_pair

from mtx.checkpoint import Checkpoint, RunDir
from mtx.config import load_config
from mtx.data import toy
from mtx.data.prepare import prepare
from mtx.data.prepared import load_prepared
from mtx.distributed import Dist
from mtx.errors import MtxError
from mtx.model.build import load_model, make_model
from mtx.train.schedule import rate
from mtx.train.step import Precision
from mtx.train.trainer import Trainer, train
from mtx.train.validate import validate

QUIET = {"log": lambda *_: None}
# TINY_RUN without its model.* keys: a fine-tuning run takes them from the checkpoint
RUN = [x for x in TINY_RUN if not x.startswith("model.")]


def write(prefix, pairs):
    write_pair(prefix, [p[0] for p in pairs], [p[1] for p in pairs])


@pytest.fixture(scope="module")
def domains(tmp_path_factory):
    """A general model trained on toy sentences without "because" (domain A), and the data of
    domain B, sentences with a "because" clause (its verb moves to the end in German),
    prepared with the general model's SentencePiece model."""
    root = tmp_path_factory.mktemp("domains")
    pairs = toy.split_pairs("train")
    a = [p for p in pairs if "because" not in p[0]]
    b = [p for p in pairs if "because" in p[0]]
    write(root / "a_train", a[:6000])
    write(root / "a_valid", a[6000:6300])
    write(root / "b_train", b[:1500])
    write(root / "b_valid", b[1500:1800])
    general = [f"run_dir={root / 'general'}", *TINY_RUN, "train.max_steps=300"]
    general += ["train.warmup_steps=100", "train.valid_every=150"]
    general += [f"data.{s}={root / f'a_{v}'}" for s, v in
                (("train", "train"), ("valid", "valid"), ("test", "valid"))]  # fmt: skip
    cfg = load_config(None, general)
    prepare(cfg, **QUIET)
    train(cfg, **QUIET)
    ckpt = root / "general" / "checkpoints" / "last.pt"
    b_data = [f"data.{s}={root / f'b_{v}'}" for s, v in
              (("train", "train"), ("valid", "valid"), ("test", "valid"))]  # fmt: skip
    prepare(load_config(None, [f"run_dir={root / 'b'}", *RUN, *b_data,
                               f"data.spm_model={ckpt}"]), **QUIET)  # fmt: skip
    return root, ckpt, b_data


def fine_tune_config(root, name, ckpt, b_data, *extra):
    run = root / name
    run.mkdir(exist_ok=True)
    if not (run / "prepared").exists():
        (run / "prepared").symlink_to(root / "b" / "prepared")
    return load_config(None, [f"run_dir={run}", *RUN, *b_data, f"train.init_from={ckpt}", *extra])


def b_loss(model, cfg) -> float:
    """The loss on domain B's validation data of a model, or of a checkpoint's weights."""
    if not isinstance(model, torch.nn.Module):
        model = load_model(model)[0]
    precision = Precision.choose(torch.device("cpu"), "fp32")
    return validate(model, load_prepared(cfg, "valid"), cfg, precision, Dist()).loss


def test_fine_tuning_lowers_the_loss_on_the_new_domain(domains):
    root, ckpt, b_data = domains
    cfg = fine_tune_config(root, "ft", ckpt, b_data, "train.max_steps=60", "train.warmup_steps=30")
    assert cfg.model.d_model == 512  # left out: the defaults, until the checkpoint's are taken
    probe = fine_tune_config(root, "probe", ckpt, b_data)
    start = Trainer(probe, Dist(), start=read(probe))
    before = b_loss(ckpt, cfg)
    assert b_loss(start.model, cfg) == before  # the general model's weights, not random ones
    train(cfg, **QUIET)
    after = last(root / "ft")
    assert after.settings().model.d_model == 32  # taken from the checkpoint
    assert after.step == 60
    assert b_loss(RunDir(root / "ft").last, cfg) < before - 0.2
    record = after.init_from
    assert record.path == str(ckpt.resolve()) and record.step == 300
    assert record.sha256 == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    info = mtx("info", RunDir(root / "ft").last)
    assert f"started from: {ckpt.resolve()} (step 300, sha256 {record.sha256[:12]})" in (
        info.output
    )


def read(cfg):
    from mtx.train import init

    ckpt = init.read(cfg, Dist())
    init.take_model_config(cfg, ckpt)
    return ckpt


def test_a_fresh_optimizer_and_step_by_default_or_the_checkpoint_s_when_asked(domains):
    root, ckpt, b_data = domains
    saved = Checkpoint.load(ckpt)
    cfg = fine_tune_config(root, "fresh", ckpt, b_data)
    fresh = Trainer(cfg, Dist(), start=read(cfg))
    assert fresh.state.step == 0 and fresh.step.optimizer.state_dict()["state"] == {}
    keep = ["train.init_keep_optimizer=true", "train.init_keep_step=true", "train.adam_eps=1e-7"]
    cfg = fine_tune_config(root, "kept", ckpt, b_data, *keep)
    kept = Trainer(cfg, Dist(), start=read(cfg))
    assert kept.state.step == 300
    state, old = kept.step.optimizer.state_dict()["state"], saved.resume.optimizer["state"]
    assert state.keys() == old.keys()
    for i in state:
        torch.testing.assert_close(state[i]["exp_avg"], old[i]["exp_avg"], rtol=0, atol=0)
    assert kept.step.optimizer.param_groups[0]["eps"] == 1e-7  # this run's settings
    # the learning rate goes on from the checkpoint's step
    cfg.train.max_steps = 302
    kept.run()
    logged = records(root / "kept", "train")
    assert [r["step"] for r in logged] == [302]
    t = cfg.train
    assert logged[0]["lr"] == rate(302, 32, t.warmup_steps, t.lr_scale) != rate(2, 32, 4000, 1)


def test_frozen_parts_do_not_change_and_the_rest_does(domains):
    root, ckpt, b_data = domains
    cfg = fine_tune_config(root, "frozen", ckpt, b_data, "train.max_steps=10",
                           "train.freeze=[embeddings, encoder]")  # fmt: skip
    train(cfg, **QUIET)
    before = Checkpoint.load(ckpt).model
    after = last(root / "frozen").model
    frozen = [n for n in before if n.startswith(("embed.", "encoder_"))]
    trained = [n for n in before if n.startswith("decoder_layers.") and "weight" in n]
    assert frozen and trained
    for name in frozen:
        assert torch.equal(before[name], after[name]), name
    assert all(not torch.equal(before[n], after[n]) for n in trained)


def test_a_student_takes_its_teacher_s_embeddings_and_encoder_and_its_own_decoder(domains):
    root, ckpt, b_data = domains
    student = ["model.decoder_self=ssru", "model.decoder_d_ff=16", "train.max_steps=4",
               "train.init_parts=[embeddings, encoder]"]  # fmt: skip
    cfg = fine_tune_config(root, "student", ckpt, b_data, *student)
    trainer = Trainer(cfg, Dist(), start=read(cfg))
    teacher, mine = Checkpoint.load(ckpt).model, trainer.model.state_dict()
    taken = [n for n in mine if n.startswith(("embed.", "encoder_"))]
    assert taken and all(torch.equal(mine[n], teacher[n]) for n in taken)
    # the decoder is the run's own initialisation, as a fresh model of its shape from its seed
    torch.manual_seed(cfg.train.seed)
    fresh = make_model(cfg.model, trainer.header.vocab_size).state_dict()
    own = [n for n in mine if n.startswith("decoder_")]
    assert "decoder_layers.0.self_attn.gate_bias" in own  # an SSRU, not the checkpoint's
    assert all(torch.equal(mine[n], fresh[n]) for n in own)
    assert not any(torch.equal(mine[n], teacher[n]) for n in own if n in teacher)
    trainer.run()
    record = last(root / "student").init_from
    assert record.parts == ["embeddings", "encoder"] and record.step == 300
    info = mtx("info", RunDir(root / "student").last).output
    assert "took its embeddings and encoder only" in info
    # what shapes the parts taken must still match; what shapes the decoder alone need not
    taken_encoder = ["train.init_parts=[encoder]", "model.encoder_layers=2"]
    with pytest.raises(MtxError, match="model.encoder_layers is 2 in the config but 1"):
        read(fine_tune_config(root, "refused", ckpt, b_data, *taken_encoder))
    with pytest.raises(MtxError, match="model.decoder_self is 'ssru' in the config but"):
        read(fine_tune_config(root, "refused", ckpt, b_data, "model.decoder_self=ssru"))
    for extra, message in [
        (["train.init_parts=[]"], "train.init_parts: name at least one part"),
        (["train.init_parts=[encoder]"], "train.init_parts needs train.init_from"),
    ]:
        with pytest.raises(MtxError, match=message):
            load_config(None, extra)
    with pytest.raises(MtxError, match="init_keep_optimizer keeps the Adam moments of every"):
        fine_tune_config(root, "refused", ckpt, b_data, "train.init_parts=[decoder]",
                         "train.init_keep_optimizer=true")  # fmt: skip


def test_taking_parts_needs_each_of_their_weights_and_no_other():
    from conftest import tiny_model_config

    from mtx.train.init import _load_parts

    model = make_model(tiny_model_config(), 40)
    weights = dict(model.state_dict())
    _load_parts(model, weights, ["encoder"])
    del weights["encoder_layers.0.ffn.fc1.weight"]
    with pytest.raises(RuntimeError, match="encoder_layers.0.ffn.fc1.weight is not in the check"):
        _load_parts(model, weights, ["encoder"])
    extra = model.state_dict() | {"encoder_layers.5.ffn.fc1.weight": torch.zeros(1)}
    with pytest.raises(RuntimeError, match="encoder_layers.5.ffn.fc1.weight is not in the model"):
        _load_parts(model, extra, ["decoder", "encoder"])


def test_resuming_a_fine_tuning_run_is_exact(domains):
    root, ckpt, b_data = domains
    train(fine_tune_config(root, "whole", ckpt, b_data, "train.max_steps=30"), **QUIET)
    train(fine_tune_config(root, "parts", ckpt, b_data, "train.max_steps=12"), **QUIET)
    train(fine_tune_config(root, "parts", ckpt, b_data, "train.max_steps=30"), resume=True,
          **QUIET)  # fmt: skip
    whole, parts = last(root / "whole"), last(root / "parts")
    assert parts.init_from == whole.init_from and parts.init_from.step == 300
    assert_same_parameters(RunDir(root / "whole").last, RunDir(root / "parts").last)


def test_what_does_not_fit_is_refused_with_one_line_naming_it(domains, tmp_path):
    root, ckpt, b_data = domains
    best = root / "general" / "checkpoints" / "best.pt"
    cases = [
        (["model.d_model=64"], "model.d_model is 64 in the config but 32 in the checkpoint"),
        (["model.n_heads=4"], "model.n_heads is 4 in the config but 2 in the checkpoint"),
        ([f"train.init_from={best}", "train.init_keep_optimizer=true"],
         "holds no optimizer state"),
        ([f"train.init_from={tmp_path / 'none.pt'}"], "checkpoint not found"),
    ]  # fmt: skip
    for extra, message in cases:
        with pytest.raises(MtxError, match=message):
            train(fine_tune_config(root, "refused", ckpt, b_data, *extra), **QUIET)
    # data encoded with another SentencePiece model than the checkpoint's
    other = load_config(None, [f"run_dir={tmp_path / 'other'}", *RUN, *b_data,
                               "data.vocab_size=300", f"train.init_from={ckpt}"])  # fmt: skip
    prepare(other, **QUIET)
    with pytest.raises(MtxError, match=f"prepare the data with data.spm_model={ckpt}"):
        train(other, **QUIET)
    assert not (tmp_path / "other" / "checkpoints").exists()
    with pytest.raises(MtxError, match="train.freeze: 'encoders' is not one of embeddings"):
        load_config(None, ["train.freeze=encoders"])
    with pytest.raises(MtxError, match="need train.init_from"):
        load_config(None, ["train.init_keep_step=true"])


def test_the_cli_fine_tunes_with_init_from(domains):
    root, ckpt, b_data = domains
    run = root / "cli"
    run.mkdir()
    (run / "prepared").symlink_to(root / "b" / "prepared")
    sets = [x for item in [f"run_dir={run}", *RUN, *b_data, "train.max_steps=304"]
            for x in ("--set", item)]  # fmt: skip
    config = root / "ft.yaml"
    config.write_text("train:\n  seed: 3\n")
    result = mtx("train", "--config", config, *sets, "--init-from", ckpt, "--keep-step")
    assert "starting from" in result.output and "keeping its step" in result.output
    assert last(run).step == 304


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_every_parameter_belongs_to_exactly_one_part_that_train_freeze_names(arch):
    from conftest import tiny_model_config

    from mtx.config import PARTS
    from mtx.model.build import make_model

    model = make_model(tiny_model_config(arch=arch, positions="learned", norm="pre"), 50)
    assert tuple(model.PARTS) == PARTS
    for name, _ in model.named_parameters():
        owners = [part for part, prefixes in model.PARTS.items() if name.startswith(prefixes)]
        assert len(owners) == 1, name
    total = sum(p.numel() for p in model.parameters())
    assert sum(model.freeze([part]) for part in PARTS) == total
    assert not any(p.requires_grad for p in model.parameters())
