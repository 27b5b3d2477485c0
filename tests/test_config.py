import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from mtx import corpora
from mtx.config import Config, all_keys, from_dict, load_config
from mtx.errors import MtxError


def test_every_contract_key_can_be_overridden(tmp_path):
    cfg = load_config(
        None,
        [
            "run_dir=/tmp/x",
            "data.src_lang=de",
            "data.tgt_lang=en",
            "data.train=hf:wmt/wmt14:de-en",
            "data.valid=some/prefix",
            "data.test=toy:test",
            "data.vocab_size=1000",
            "model.d_model=64",
            "model.d_ff=128",
            "model.n_heads=2",
            "model.encoder_layers=1",
            "model.decoder_layers=3",
            "model.dropout=0.2",
            "train.max_tokens=999",
            "train.warmup_steps=10",
            "train.max_steps=5",
            "train.max_minutes=1.5",
            "train.seed=7",
            "train.adam_eps=1e-9",
        ],
    )
    assert cfg.run_dir == "/tmp/x"
    assert (cfg.data.src_lang, cfg.data.tgt_lang) == ("de", "en")
    assert cfg.data.train == "hf:wmt/wmt14:de-en"
    assert cfg.model.d_model == 64 and cfg.model.decoder_layers == 3 and cfg.model.dropout == 0.2
    assert cfg.train.max_tokens == 999 and cfg.train.max_minutes == 1.5 and cfg.train.seed == 7
    assert cfg.train.adam_eps == 1e-9


def test_yaml_file_and_overrides_compose(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"d_model": 64, "n_heads": 4}, "train": {"seed": 3}}))
    cfg = load_config(path, ["train.seed=9"])
    assert cfg.model.d_model == 64 and cfg.train.seed == 9


def test_renamed_keys_still_work_with_a_one_line_notice(tmp_path):
    """data.sampling and data.temperature (names the search's decode.* keys also have) are
    data.bpe_dropout and data.corpus_temperature; the old names, in a file or --set, set the
    new keys and say so once each; a checkpoint's saved config is read without a word."""
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"data": {"sampling": 0.1}}))
    notices = []
    cfg = load_config(path, ["data.temperature=3"], notice=notices.append)
    assert (cfg.data.bpe_dropout, cfg.data.corpus_temperature) == (0.1, 3.0)
    assert cfg.decode.sampling is False and cfg.decode.temperature == 1.0
    assert notices == [
        "mtx: config key data.sampling is now data.bpe_dropout; the old name will be removed",
        "mtx: config key data.temperature is now data.corpus_temperature; the old name will be "
        "removed",
    ]
    assert {"data.bpe_dropout", "data.corpus_temperature"} <= cfg.given
    saved = cfg.to_dict()
    saved["data"]["sampling"] = saved["data"].pop("bpe_dropout")  # as an older run saved it
    assert from_dict(saved).data.bpe_dropout == 0.1
    with pytest.raises(MtxError, match="unknown config key data.samplig"):
        load_config(None, ["data.samplig=0.1"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.d_modle=3", "did you mean model.d_model"),
        ("modle.d_model=3", "did you mean model.d_model"),
        ("model.d_model=abc", "model.d_model expects int"),
        ("model.dropout=yes", "model.dropout expects float"),
        ("model.n_heads=7", "divisible"),
        ("model.n_heads=0", "model.n_heads must be positive"),  # not a division by zero
        ("train.max_tokens=-1", "train.max_tokens must be positive"),
        ("train.dist_timeout=0", "train.dist_timeout must be positive"),
        ("train.patience=-1", "train.patience must be 0 or more"),
        ("train.bleu_every=-2", "train.bleu_every must be 0 or more"),
        ("train.valid_bleu_lines=-1", "train.valid_bleu_lines must be 0 or more"),
        ("train.best_metric=ter", "train.best_metric must be loss or bleu"),
        ("nothing", "key=value"),
        ("model.arch=lstm", "model.arch must be transformer or rnn"),
        ("model.init=normal", "model.init must be fairseq or xavier"),
        ("model.rnn_cell=elman", "model.rnn_cell must be lstm or gru"),
        ("model.attention=cosine", "model.attention must be one of additive, general, dot"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(MtxError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.positions=relative"], r"model.positions \(relative\) is a transformer setting"),
        (["model.norm=pre"], r"model.norm \(pre\) is a transformer setting"),
        (["model.init=xavier"], r"model.init \(xavier\) is a transformer setting"),
        (["model.d_model=65", "model.n_heads=5"], "must be even with model.arch rnn"),
    ],
)
def test_transformer_only_settings_are_refused_for_the_rnn(overrides, message):
    with pytest.raises(MtxError, match=message):
        load_config(None, ["model.arch=rnn", *overrides])
    cfg = load_config(None, ["model.arch=rnn", "model.n_heads=7", "model.attention=location"])
    assert cfg.model.arch == "rnn"  # n_heads means nothing to the rnn: 512 % 7 is no error


def test_bad_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: [1, 2\n")
    with pytest.raises(MtxError, match="bad.yaml"):
        load_config(path)
    path.write_text("model:\n  d_model: 64\n  widht: 3\n")
    with pytest.raises(MtxError, match="model.widht"):
        load_config(path)
    with pytest.raises(MtxError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_shipped_configs_load():
    names = sorted(p.stem for p in (Path(__file__).parents[1] / "configs").glob("*.yaml"))
    assert {
        "toy",
        "toy-both-ways",
        "multi30k",
        "multi30k-student",
        "multi30k-student-tiny",
        "finetune",
        "base",
        "big",
    } <= set(names)
    for name in names:
        load_config(Path(__file__).parents[1] / "configs" / f"{name}.yaml")
    finetune = load_config(Path(__file__).parents[1] / "configs" / "finetune.yaml")
    assert [v.name for v in corpora.valid_sets(finetune.data)] == ["new", "old"]


def test_best_by_bleu_needs_bleu_and_the_demo_is_bounded_by_steps_not_the_clock():
    with pytest.raises(MtxError, match="train.best_metric bleu needs train.bleu_every above 0"):
        load_config(None, ["train.best_metric=bleu", "train.bleu_every=0"])
    toy = load_config(Path(__file__).parents[1] / "configs" / "toy.yaml")
    assert toy.train.max_minutes == 0  # `make demo` trains the same model on any machine
    assert (toy.train.best_metric, toy.train.patience) == ("bleu", 3)


@given(st.one_of(st.sampled_from(all_keys()), st.text(max_size=30)), st.text(max_size=20))
@example("model.d_\nmodel", "1")
@example("model.n_heads", "0")
def test_random_overrides_never_crash_outside_a_clear_error(key, value):
    try:
        load_config(None, [f"{key}={value}"])
    except MtxError as e:
        assert str(e) and "\n" not in str(e)


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(
    st.one_of(
        st.dictionaries(
            st.sampled_from(["model", "train", "data", "decode", "run_dir"]), yaml_values
        ),
        yaml_values,
    ).map(yaml.safe_dump)
    | st.text(max_size=100)
)
def test_random_config_files_never_crash_outside_a_clear_error(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            load_config(path)
        except MtxError as e:
            assert str(e) and "\n" not in str(e)


def test_defaults_are_the_papers():
    cfg = Config()
    assert (cfg.model.d_model, cfg.model.d_ff, cfg.model.n_heads) == (512, 2048, 8)
    assert (cfg.train.adam_beta1, cfg.train.adam_beta2, cfg.train.adam_eps) == (0.9, 0.98, 1e-9)
    assert cfg.train.label_smoothing == 0.1 and cfg.train.warmup_steps == 4000
    assert (cfg.decode.beam, cfg.decode.alpha, cfg.decode.max_len_b) == (4, 0.6, 50)


def test_every_number_declares_a_range_and_every_word_its_choices():
    """Each field says what it accepts beside its declaration: a number its range, a choice of
    words its Literal type (with its default among them), and every field a description."""
    import typing

    from mtx.config import declared

    defaults = Config().to_dict()
    for key, tp, f in declared():
        assert f.metadata["doc"], key
        if tp in (int, float):
            assert f.metadata["range"] is not None, f"{key} has no range"
        if typing.get_origin(tp) is typing.Literal:
            section, name = key.split(".")
            assert defaults[section][name] in typing.get_args(tp), key


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr_scale=-1", "train.lr_scale must be 0 or more, got -1.0"),
        ("train.adam_beta2=1.0", r"train.adam_beta2 must be in \[0, 1\), got 1.0"),
        ("train.adam_eps=0", "train.adam_eps must be positive, got 0.0"),
        ("train.clip_norm=nan", "train.clip_norm must be 0 or more, got nan"),
        ("train.max_minutes=inf", "train.max_minutes must be 0 or more, got inf"),
        ("train.threads=-2", "train.threads must be 0 or more"),
        ("data.max_ratio=0.5", "data.max_ratio must be at least 1, got 0.5"),
        ("data.character_coverage=0", r"data.character_coverage must be in \(0, 1\]"),
        ("data.spm_sample=-1", "data.spm_sample must be 0 or more"),
        ("decode.alpha=-0.1", "decode.alpha must be 0 or more"),
        ("decode.max_len_a=-1", "decode.max_len_a must be 0 or more"),
        ("decode.max_len_b=-1", "decode.max_len_b must be 0 or more"),
        ("model.layer_norm_eps=0", "model.layer_norm_eps must be positive"),
        ("serve.port=70000", "serve.port must be in 0..65535"),
        ("decode.stopping=soon", "decode.stopping must be k_finished, exact or never, got 'soon'"),
        ("train.freeze=[encoder, decoders]", "train.freeze: 'decoders' is not one of"),
    ],
)
def test_values_outside_their_declared_range_or_choices_name_the_key(override, message):
    with pytest.raises(MtxError, match=message):
        load_config(None, [override])


def test_the_help_of_an_option_that_sets_a_key_is_that_keys_declaration():
    from helpers.common import invoke

    from mtx.cli.app import setting_help

    shown = " ".join(invoke("translate", "--help").output.replace("│", " ").split())
    for key in ("decode.stopping", "decode.beam", "decode.top_p", "decode.dtype"):
        assert " ".join(setting_help(key).replace("\\[", "[").split()) in shown, key
    assert "k_finished, exact or never" in shown and "(in (0, 1])" in shown


def test_typed_decode_settings_are_checked_as_a_files_are():
    """A command's options reach the config typed (Config.with_decode), not as "key=value"
    strings, and are refused by the same declarations."""
    cfg = Config().with_decode(beam=2, alpha=0.0, shortlist="x.pt")
    assert (cfg.decode.beam, cfg.decode.alpha, cfg.decode.shortlist) == (2, 0.0, "x.pt")
    assert Config().with_decode() == Config()
    with pytest.raises(MtxError, match="decode.beam must be positive, got 0"):
        Config().with_decode(beam=0)
    with pytest.raises(MtxError, match="decode.dtype must be one of"):
        Config().with_decode(dtype="fp64")
