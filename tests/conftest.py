import os
from pathlib import Path

import pytest
import torch
from helpers.common import mtx
from hypothesis import settings

from mtx.config import ModelConfig, load_config
from mtx.data.prepare import prepare

torch.set_num_threads(2)
# no time limit per example: a property holds or not however busy the machine is
settings.register_profile("mtx", deadline=None)
settings.load_profile("mtx")


def pytest_sessionstart(session) -> None:
    """The machine, at the top of every run (with -q too): a failure report then says where
    it failed."""
    reporter = session.config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(machine())


def machine() -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")),
        "unknown CPU",
    )
    forced = os.environ.get("ATEN_CPU_CAPABILITY")
    kernels = torch.backends.cpu.get_cpu_capability() + (f" (forced: {forced})" if forced else "")
    return (
        f"cpu: {model}, {os.cpu_count()} cores; ATen kernels {kernels}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


# A training run small enough for tests: a few hundred updates a second on 2 CPU cores.
TINY_RUN = [
    "model.d_model=32",
    "model.d_ff=64",
    "model.n_heads=2",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "train.max_tokens=512",
    "train.log_every=2",
    "train.valid_every=100",
    "train.bleu_every=0",  # validation by loss only; the BLEU tests turn it on
    "train.device=cpu",
    "data.vocab_size=200",
    "data.clean.langid=0",  # as configs/toy.yaml: the toy corpus is not natural language
]


def tiny_model_config(**overrides) -> ModelConfig:
    values = dict(d_model=32, d_ff=64, n_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0)
    values.update(overrides)
    return ModelConfig(**values)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """The toy corpus prepared once for TINY_RUN; runs link to it."""
    run = tmp_path_factory.mktemp("prep")
    prepare(load_config(None, [f"run_dir={run}", *TINY_RUN]), log=lambda *_: None)
    return run / "prepared"


# Both directions of the toy corpus in one model: a multilingual run (mtx/corpora.py)
BOTH_WAYS = (
    "data.corpora=["
    "{src_lang: en, tgt_lang: de, train: 'toy:train', valid: ['toy:valid'], test: 'toy:test'},"
    "{src_lang: de, tgt_lang: en, train: 'toy:train', valid: ['toy:valid'], test: 'toy:test'}]"
)


@pytest.fixture(scope="session")
def prepared_both_ways(tmp_path_factory):
    """The toy corpus in both directions prepared once for TINY_RUN (BOTH_WAYS)."""
    run = tmp_path_factory.mktemp("prep-both")
    prepare(load_config(None, [f"run_dir={run}", *TINY_RUN, BOTH_WAYS]), log=lambda *_: None)
    return run / "prepared"


def run_config(run, prepared, *extra):
    """The TINY_RUN config of a run directory that shares the prepared data."""
    run.mkdir(parents=True, exist_ok=True)
    if not (run / "prepared").exists():
        os.symlink(prepared, run / "prepared")
    return load_config(None, [f"run_dir={run}", *TINY_RUN, *extra])


def run_overrides(run, *extra) -> list[str]:
    """The same settings as a list of key=value overrides."""
    return [f"run_dir={run}", *TINY_RUN, *extra]


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory):
    """configs/toy.yaml trained for 250 steps through the CLI (about a minute on 2 CPU cores);
    checkpoints step-125.pt, step-250.pt, last.pt and best.pt."""
    run = tmp_path_factory.mktemp("toy")
    sets = ["--set", f"run_dir={run}", "--set", "train.max_steps=250"]
    # no time bound: the tests count on steps 125 and 250 even on a busy machine
    sets += ["--set", "train.valid_every=125", "--set", "train.max_minutes=0"]
    for command in ("prepare", "train"):
        mtx(command, "--config", ROOT / "configs/toy.yaml", *sets)
    return run


MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
# the benchmarks read Multi30k from $M30K (default data/multi30k, `mtx fetch multi30k`): here,
# the local copy
os.environ["M30K"] = str(MULTI30K)


@pytest.fixture(scope="session")
def multi30k_run(tmp_path_factory):
    """configs/multi30k.yaml on the real data with a tiny model trained for 300 steps through
    the CLI (about a minute on 2 CPU cores): enough to end its sentences."""
    assert MULTI30K.is_dir(), f"the real data is missing: {MULTI30K}"
    run = tmp_path_factory.mktemp("multi30k")
    values = {
        "run_dir": run,
        "data.train": MULTI30K / "train",
        "data.valid": MULTI30K / "val",
        "data.test": MULTI30K / "test2016",
        "data.vocab_size": 2000,
        "model.d_model": 64,
        "model.d_ff": 128,
        "model.n_heads": 2,
        "model.encoder_layers": 1,
        "model.decoder_layers": 1,
        "model.dropout": 0.1,
        "train.max_tokens": 2048,
        "train.max_steps": 300,
        "train.warmup_steps": 100,
        "train.lr_scale": 2.0,
        "train.valid_every": 300,
        "train.log_every": 10,
        "train.device": "cpu",
    }
    sets = [x for key, value in values.items() for x in ("--set", f"{key}={value}")]
    for command in ("prepare", "train"):
        mtx(command, "--config", ROOT / "configs/multi30k.yaml", *sets)
    return run
