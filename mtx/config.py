"""Typed configuration: a tree of dataclasses, loaded from YAML, overridden by `--set key=value`.

Every field has a checked type and a comment; an unknown key is an error naming the closest
valid key; `Config.validate()` rejects impossible combinations before any work starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtx.errors import MtxError

PARTS = ("embeddings", "encoder", "decoder")  # what train.freeze may name (each model's parts)


def _require(section: str, settings, keys: tuple[str, ...], ok, what: str) -> None:
    """MtxError naming the first of `keys` (attributes of `settings`) whose value is not `ok`."""
    for key in keys:
        value = getattr(settings, key)
        if not ok(value):
            raise MtxError(f"{section}.{key} must be {what}, got {value}")


def _positive(section: str, settings, *keys: str) -> None:
    _require(section, settings, keys, lambda v: v > 0, "positive")


def _not_negative(section: str, settings, *keys: str) -> None:
    _require(section, settings, keys, lambda v: v >= 0, "0 or more")


@dataclass
class DataConfig:
    src_lang: str = "en"  # source language code; local files are PREFIX.{src_lang}
    tgt_lang: str = "de"  # target language code; local files are PREFIX.{tgt_lang}
    # Each split is a local prefix P (files P.{src_lang}, P.{tgt_lang}), a hub dataset
    # "hf:NAME[:CONFIG[:SPLIT]]", or the embedded synthetic corpus "toy:SPLIT".
    train: str = "toy:train"
    valid: str = "toy:valid"
    test: str = "toy:test"
    vocab_size: int = 8000  # joint SentencePiece BPE vocabulary size (a soft limit)
    max_len: int = 250  # drop training pairs with more subword tokens than this on either side
    max_ratio: float = 3.0  # drop training pairs whose token-length ratio exceeds this
    dedup: bool = False  # drop exact duplicate training pairs
    spm_sample: int = 2_000_000  # sentences sampled to train SentencePiece (0 = all)
    character_coverage: float = 1.0  # SentencePiece character coverage
    # encode with this SentencePiece model (a .model file, or a checkpoint, which embeds one)
    # instead of training one: to fine-tune a model on new data (vocab_size is then unused)
    spm_model: str = ""
    workers: int = 0  # processes that encode the data (0 = one per CPU core)

    def validate(self) -> None:
        _positive("data", self, "vocab_size", "max_len")
        _not_negative("data", self, "workers")
        if self.src_lang == self.tgt_lang:
            raise MtxError("data.src_lang and data.tgt_lang must differ")


ATTENTION_SCORES = ("additive", "general", "dot", "scaled_dot", "location")


@dataclass
class ModelConfig:
    d_model: int = 512  # model width
    d_ff: int = 2048  # inner width of the position-wise feed-forward network
    n_heads: int = 8  # attention heads; d_k = d_v = d_model / n_heads
    encoder_layers: int = 6  # encoder stack depth
    decoder_layers: int = 6  # decoder stack depth
    dropout: float = 0.1  # on sublayer outputs and on embedding + position sums (the paper's)
    attention_dropout: float = 0.0  # on attention weights (not in the paper)
    # Transformer weights: fairseq (Q/K/V Xavier with gain 1/sqrt(2), feed-forward layers and
    # Q/K/V biases as torch's nn.Linear; it learns more per update) or xavier (every matrix
    # Xavier, zero biases); the paper does not say (model/transformer.py)
    init: str = "fairseq"
    max_positions: int = 1024  # length of the sinusoidal position table
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon
    norm: str = "post"  # residual placement: post (the paper: LN(x + f(x))) or pre (x + f(LN(x)))
    positions: str = "sinusoidal"  # sinusoidal (the paper), learned, or relative (Shaw et al.)
    max_relative_position: int = 16  # relative positions: distances clipped to [-k, k]
    # The recurrent baseline (`arch: rnn`, model/rnn.py) uses d_model, the layer counts,
    # dropout and max_positions above, and these:
    arch: str = "transformer"  # transformer (the paper) or rnn (an attentional RNN, Luong et al.)
    rnn_cell: str = "lstm"  # rnn: lstm or gru
    attention: str = "general"  # rnn: additive, general, dot, scaled_dot or location

    def validate(self) -> None:
        m = self
        if m.arch not in ("transformer", "rnn"):
            raise MtxError(f"model.arch must be transformer or rnn, got {m.arch!r}")
        _positive("model", m, "d_model", "d_ff", "n_heads", "encoder_layers", "decoder_layers")
        _positive("model", m, "max_positions")
        _require("model", m, ("dropout", "attention_dropout"), lambda v: 0 <= v < 1, "in [0, 1)")
        _not_negative("model", m, "max_relative_position")
        if m.arch == "transformer" and m.d_model % m.n_heads:
            raise MtxError(
                f"model.d_model ({m.d_model}) must be divisible by model.n_heads ({m.n_heads})"
            )
        if m.init not in ("fairseq", "xavier"):
            raise MtxError(f"model.init must be fairseq or xavier, got {m.init!r}")
        if m.norm not in ("post", "pre"):
            raise MtxError(f"model.norm must be post or pre, got {m.norm!r}")
        if m.positions not in ("sinusoidal", "learned", "relative"):
            raise MtxError(
                f"model.positions must be sinusoidal, learned or relative, got {m.positions!r}"
            )
        if m.rnn_cell not in ("lstm", "gru"):
            raise MtxError(f"model.rnn_cell must be lstm or gru, got {m.rnn_cell!r}")
        if m.attention not in ATTENTION_SCORES:
            raise MtxError(
                f"model.attention must be one of {', '.join(ATTENTION_SCORES)}, got {m.attention!r}"
            )
        if m.arch == "rnn":
            if m.d_model % 2:
                raise MtxError(
                    f"model.d_model ({m.d_model}) must be even with model.arch rnn (each "
                    "direction of the bidirectional encoder has d_model / 2 units)"
                )
            for key, value, default in (
                ("norm", m.norm, "post"),
                ("positions", m.positions, "sinusoidal"),
                ("init", m.init, "fairseq"),
            ):
                if value != default:
                    raise MtxError(
                        f"model.{key} ({value}) is a transformer setting; model.arch is rnn"
                    )


@dataclass
class TrainConfig:
    max_tokens: int = 4096  # token budget of a batch (max length x sentences, per side)
    update_freq: int = 1  # batches accumulated into one update
    lr_scale: float = 1.0  # factor on the paper's learning-rate formula
    warmup_steps: int = 4000  # linear warm-up steps of the inverse-sqrt schedule
    max_steps: int = 100_000  # stop after this many updates
    max_minutes: float = 0.0  # stop after this many minutes of training (0 = no limit)
    label_smoothing: float = 0.1  # epsilon of label-smoothed cross-entropy
    adam_beta1: float = 0.9  # Adam beta1
    adam_beta2: float = 0.98  # Adam beta2
    adam_eps: float = 1e-9  # Adam epsilon
    clip_norm: float = 0.0  # clip the gradient norm to this (0 = off, as in the paper)
    seed: int = 1  # seeds initialisation, dropout and batch order
    valid_every: int = 1000  # validate and checkpoint every this many updates
    # Translate the validation split with decode.* and score it with sacreBLEU (BLEU, chrF) at
    # every this many validations, and at the last (0 = never: loss only)
    bleu_every: int = 1
    valid_bleu_lines: int = 0  # translate only the first N validation lines (0 = all)
    best_metric: str = "loss"  # what best.pt is best by: loss (lowest) or bleu (highest)
    patience: int = 0  # stop after this many validations without a better best_metric (0 = off)
    # also write every metric to RUN/tensorboard (pip install tensorboard)
    tensorboard: bool = False
    keep_last: int = 5  # step checkpoints (step-N.pt) kept beside last.pt and best.pt
    max_nonfinite: int = 10  # stop after this many updates in a row with a NaN/inf loss or gradient
    max_oom: int = 3  # stop after this many batches in a row run out of GPU memory
    log_every: int = 100  # write a metrics line every this many updates
    device: str = "auto"  # "auto" (CUDA if present), "cpu", "cuda", "cuda:N"
    # "auto" (bf16 autocast on GPUs that have it, else fp32), "fp32", "bf16", or "fp16"
    # (autocast with dynamic loss scaling, for GPUs without bf16)
    precision: str = "auto"
    # torch.compile the step (train/compiled.py): auto (on CUDA only; experimental), true, false
    compile: str = "false"
    # torch.compile's backend: inductor (generated kernels); aot_eager or eager trace the step
    # but run torch's own kernels (quick checks that it compiles)
    compile_backend: str = "inductor"
    # torch.compile's mode with inductor: default, reduce-overhead (CUDA graphs: one recorded
    # per batch shape) or max-autotune-no-cudagraphs (searches kernels: slow to compile)
    compile_mode: str = "default"
    # pad each side of a batch to a length from a bounded set: a multiple of up to this many
    # tokens, never more than 1/8 of the length (data/batching.py; 1 = exact lengths)
    pad_to: int = 8
    workers: int = 1  # background processes building batches (0 = in the training process)
    # Fine-tuning (train/init.py): start from this checkpoint's weights, with a fresh optimizer
    # at step 0 and this run's schedule; model.* keys left out of the config come from it
    init_from: str = ""
    init_keep_optimizer: bool = False  # init_from: keep its Adam moments (last.pt, step-N.pt)
    init_keep_step: bool = False  # init_from: continue its step count, and so its learning rate
    # parts left as they are: embeddings (shared with the output layer), encoder, decoder
    freeze: list[str] = field(default_factory=list)
    threads: int = 0  # CPU threads for torch (0 = torch's default)
    # torchrun: a collective that waits this many seconds fails and ends the job (a process
    # died or hangs); raise it where rank 0 writes large checkpoints to a slow disk
    dist_timeout: float = 60.0

    def validate(self) -> None:
        t = self
        _positive("train", t, "max_tokens", "update_freq", "pad_to", "max_steps", "valid_every")
        _positive("train", t, "log_every", "max_nonfinite", "max_oom", "dist_timeout")
        _require("train", t, ("label_smoothing",), lambda v: 0 <= v < 1, "in [0, 1)")
        _not_negative("train", t, "keep_last", "bleu_every", "valid_bleu_lines", "patience")
        _not_negative("train", t, "workers")
        if t.best_metric not in ("loss", "bleu"):
            raise MtxError(f"train.best_metric must be loss or bleu, got {t.best_metric!r}")
        if t.best_metric == "bleu" and t.bleu_every == 0:
            raise MtxError("train.best_metric bleu needs train.bleu_every above 0")
        if t.warmup_steps < 1:
            raise MtxError(f"train.warmup_steps must be at least 1, got {t.warmup_steps}")
        if t.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise MtxError(f"train.precision must be auto, fp32, bf16 or fp16, got {t.precision!r}")
        if t.compile not in ("auto", "true", "false"):
            raise MtxError(f"train.compile must be auto, true or false, got {t.compile!r}")
        if t.compile_backend not in ("inductor", "aot_eager", "eager"):
            raise MtxError(
                "train.compile_backend must be inductor, aot_eager or eager, got "
                f"{t.compile_backend!r}"
            )
        modes = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
        if t.compile_mode not in modes:
            raise MtxError(
                f"train.compile_mode must be one of {', '.join(modes)}, got {t.compile_mode!r}"
            )
        unknown = [part for part in t.freeze if part not in PARTS]
        if unknown:
            raise MtxError(f"train.freeze: no part {unknown[0]!r} (parts: {', '.join(PARTS)})")
        if set(t.freeze) == set(PARTS):
            raise MtxError("train.freeze: every part is frozen, so nothing would be trained")
        if (t.init_keep_optimizer or t.init_keep_step) and not t.init_from:
            raise MtxError(
                "train.init_keep_optimizer and train.init_keep_step need train.init_from"
            )


@dataclass
class DecodeConfig:
    beam: int = 4  # beam size (1 = greedy)
    alpha: float = 0.6  # length penalty ((5 + len) / 6) ** alpha
    max_len_a: float = 1.0  # max output length = a * source length + b
    max_len_b: int = 50  # see max_len_a
    batch_tokens: int = 4096  # source-token budget of a translation batch
    stopping: str = "k_finished"  # beam search: k_finished, exact or never (decode/search.py)
    sampling: bool = False  # draw each token at random instead of searching
    temperature: float = 1.0  # sampling: softmax(logits / temperature)
    top_k: int = 0  # sampling: only the k most probable tokens (0 = all)
    top_p: float = 1.0  # sampling: only the smallest set of tokens with this much probability
    seed: int = 0  # sampling: line i of the input draws from the stream seeded by (seed, i)
    # fp32, bf16, fp16, or int8 (CPU only: int8 weights, inputs quantized row by row); auto =
    # bf16 on a GPU that has it, else fp32
    dtype: str = "auto"

    def validate(self) -> None:
        dec = self
        _positive("decode", dec, "beam", "batch_tokens", "temperature")
        _not_negative("decode", dec, "top_k", "seed")
        if dec.stopping not in ("k_finished", "exact", "never"):
            raise MtxError(
                f"decode.stopping must be k_finished, exact or never, got {dec.stopping!r}"
            )
        if dec.dtype not in ("auto", "fp32", "bf16", "fp16", "int8"):
            raise MtxError(
                f"decode.dtype must be auto, fp32, bf16, fp16 or int8, got {dec.dtype!r}"
            )
        if not 0 < dec.top_p <= 1:
            raise MtxError(f"decode.top_p must be in (0, 1], got {dec.top_p}")


@dataclass
class ServeConfig:
    """`mtx serve` (serve/): limits and batching of the translation service."""

    host: str = "127.0.0.1"  # address to listen on (0.0.0.0: every interface)
    port: int = 8080  # TCP port to listen on (0: one the system picks, printed at start)
    batching: bool = True  # false: one request at a time, decoded alone (for comparison)
    # decoding processes, each with its share of the cores (serve/workers.py); 0 = auto: on
    # the CPU one per core, at most 4; on a GPU 1. The server's own process never decodes
    workers: int = 0
    max_wait_ms: float = 5.0  # wait at most this long for more sentences to fill a batch
    max_queue: int = 2048  # sentences waiting at most; a request beyond gets 503
    max_texts: int = 256  # texts in one request at most (413 beyond)
    max_chars: int = 4096  # characters in one text at most (413 beyond)
    max_body_bytes: int = 1_000_000  # bytes in one request body at most (413 beyond)
    max_beam: int = 8  # the largest beam (and n-best) a request may ask for
    timeout_s: float = 60.0  # a request waiting longer gets 504
    drain_s: float = 30.0  # on SIGTERM: finish queued sentences within this, then 503 the rest

    def validate(self) -> None:
        for key in ("max_queue", "max_texts", "max_chars", "max_body_bytes", "max_beam"):
            if getattr(self, key) < 1:
                raise MtxError(f"serve.{key} must be at least 1, got {getattr(self, key)}")
        if self.max_texts > self.max_queue:  # such a request could never be queued
            raise MtxError(
                f"serve.max_texts ({self.max_texts}) must not exceed serve.max_queue "
                f"({self.max_queue})"
            )
        if not 0 <= self.port < 65536:
            raise MtxError(f"serve.port must be in 0..65535 (0: any free port), got {self.port}")
        if not self.timeout_s > 0:
            raise MtxError(f"serve.timeout_s must be positive, got {self.timeout_s}")
        for key in ("max_wait_ms", "drain_s", "workers"):
            if getattr(self, key) < 0:
                raise MtxError(f"serve.{key} must be 0 or more, got {getattr(self, key)}")


@dataclass
class Config:
    run_dir: str = "runs/default"  # prepared data, checkpoints and metrics go here
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)

    def validate(self) -> Config:
        """Reject impossible settings with a message naming the key: each section's own
        (the ranges first), then those that tie sections together."""
        m, t, d = self.model, self.train, self.data
        d.validate()
        m.validate()
        t.validate()
        self.decode.validate()
        if t.max_tokens < d.max_len + 1:
            raise MtxError(
                f"train.max_tokens ({t.max_tokens}) must hold one pair of data.max_len "
                f"({d.max_len}) tokens plus EOS"
            )
        from mtx.data.batching import bucket_length

        longest = bucket_length(d.max_len + 1, t.pad_to)
        if longest > m.max_positions:
            raise MtxError(
                f"data.max_len ({d.max_len}) plus EOS, padded to {longest} tokens by "
                f"train.pad_to ({t.pad_to}), must fit model.max_positions ({m.max_positions})"
            )
        self.serve.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any, raw: str | None) -> Any:
    """Check `value` against the field type `tp`; `raw` is the --set text, if any."""
    if typing.get_origin(tp) is list:  # list[str]: a YAML list, or "a,b" on the command line
        if isinstance(value, str):
            value = [x.strip() for x in value.split(",") if x.strip()]
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):  # `compile: true` in YAML, for a key that takes a word
            return str(value).lower()
        if raw is not None:  # `--set run_dir=123` means the string "123"
            return raw
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-9 as a string
            try:
                return float(value)
            except ValueError:
                pass
    raise MtxError(f"config key {key} expects {_type_name(tp)}, got {value!r}")


def _unknown(key: str, valid: list[str]) -> MtxError:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return MtxError(f"unknown config key {key}{hint}")


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the config tree, e.g. `model.d_model`."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            keys += all_keys(tp, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _apply(obj: Any, values: dict[str, Any], prefix: str = "") -> None:
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for name, value in values.items():
        key = f"{prefix}{name}"
        if name not in names:
            raise _unknown(key, all_keys())
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise MtxError(f"config key {key} must be a mapping, got {value!r}")
            _apply(getattr(obj, name), value, key + ".")
        else:
            setattr(obj, name, _coerce(key, value, tp, None))


def set_key(cfg: Config, key: str, raw: str) -> None:
    """Apply one `--set key=value` override (value parsed as YAML, checked against the field)."""
    *path, name = key.split(".")
    obj: Any = cfg
    for part in path:
        if not dataclasses.is_dataclass(obj) or part not in {
            f.name for f in dataclasses.fields(obj)
        }:
            raise _unknown(key, all_keys())
        obj = getattr(obj, part)
    hints = typing.get_type_hints(type(obj)) if dataclasses.is_dataclass(obj) else {}
    if name not in hints or dataclasses.is_dataclass(hints[name]):
        raise _unknown(key, all_keys())
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        value = raw
    setattr(obj, name, _coerce(key, value, hints[name], raw))


def from_dict(values: dict[str, Any]) -> Config:
    cfg = Config()
    _apply(cfg, values)
    return cfg


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or the defaults when `path` is None), apply overrides, validate."""
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise MtxError(f"config file not found: {p}")
        try:
            values = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise MtxError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(values, dict):
            raise MtxError(f"{p}: the top level must be a mapping of config keys")
    try:
        cfg = from_dict(values)
    except MtxError as e:
        raise MtxError(f"{p}: {e}") from None
    apply_overrides(cfg, overrides)
    # the keys a user wrote (file or --set): train.init_from fills the model.* keys left out
    cfg.given = set(_dotted(values)) | {o.split("=", 1)[0].strip() for o in overrides or []}
    return cfg.validate()


def _dotted(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for name, value in values.items():
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{name}.")
        else:
            yield prefix + name


def apply_overrides(cfg: Config, overrides: list[str] | None) -> Config:
    for item in overrides or []:
        if "=" not in item:
            raise MtxError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        set_key(cfg, key.strip(), raw)
    return cfg
