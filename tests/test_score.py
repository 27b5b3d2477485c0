"""mtx score (decode/score.py, cli/scoring.py): forced decoding, the same score alone and in
any batch, the search's own log-probability, ensembles, and the command's input and errors."""

import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest
from helpers.common import invoke
from helpers.translating import outputs

from mtx.decode import score
from mtx.decode.score import Scorer
from mtx.decode.translator import Translator
from mtx.tokens import EOS_ID
from tests.conftest import MULTI30K

LINES = 150


def pairs(n: int = LINES) -> tuple[list[str], list[str]]:
    src = (MULTI30K / "test2016.en").read_text(encoding="utf-8").splitlines()[:n]
    tgt = (MULTI30K / "test2016.de").read_text(encoding="utf-8").splitlines()[:n]
    return src, tgt


def translator(run, *sets: str, paths=None) -> Translator:
    paths = paths or [run / "checkpoints" / "best.pt"]
    return Translator.from_checkpoints(paths, list(sets), device="cpu")


def test_a_pairs_score_is_the_same_alone_and_in_any_batch(multi30k_run):
    src, tgt = pairs()
    together = Scorer(translator(multi30k_run).parts).score(src, tgt)
    small = Scorer(translator(multi30k_run, "decode.batch_tokens=200").parts)
    reverse = small.score(src[::-1], tgt[::-1])[::-1]
    alone = [small.score([s], [t])[0] for s, t in zip(src[:40], tgt[:40])]
    assert [s.per_token for s in together] == [s.per_token for s in reverse]
    assert [s.total for s in together] == [s.total for s in reverse]
    assert [s.per_token for s in together[:40]] == [s.per_token for s in alone]
    assert all(s.tokens == len(s.per_token) and s.total <= 0 for s in together)
    assert all(math.isclose(s.mean, s.total / s.tokens) for s in together)


def test_the_score_of_the_search_output_is_its_log_probability(multi30k_run):
    """Forced decoding of what greedy search found gives the log-probability the search
    accumulated for it, token by token (incremental decoding and one pass: up to rounding)."""
    tr = translator(multi30k_run, "decode.beam=1")
    src, _ = pairs(60)
    hyps = [h[0] for h in outputs(tr, src)]
    codec = tr.parts.codec
    scores = Scorer(tr.parts).score_ids(
        [codec.encode(x) for x in src], [[*h.tokens, EOS_ID] for h in hyps]
    )
    for h, s in zip(hyps, scores):
        assert s.tokens == len(h.tokens) + 1
        assert abs(s.total - h.log_prob) < 1e-3 * s.tokens, (s.total, h.log_prob)


def test_an_ensemble_of_copies_scores_as_its_model_and_two_models_in_between(multi30k_run):
    ckpts = multi30k_run / "checkpoints"
    src, tgt = pairs(40)
    one = Scorer(translator(multi30k_run).parts).score(src, tgt)
    copies = Scorer(translator(multi30k_run, paths=[ckpts / "best.pt"] * 2).parts).score(src, tgt)
    for a, b in zip(one, copies):
        assert max(abs(x - y) for x, y in zip(a.per_token, b.per_token)) < 1e-5
    step = sorted(ckpts.glob("step-*.pt"))[0]  # another model: a mean of probabilities
    other = Scorer(translator(multi30k_run, paths=[step]).parts).score(src, tgt)
    both = Scorer(translator(multi30k_run, paths=[ckpts / "best.pt", step]).parts).score(src, tgt)
    for a, b, m in zip(one, other, both):
        for x, y, z in zip(a.per_token, b.per_token, m.per_token):
            assert abs(z - math.log((math.exp(x) + math.exp(y)) / 2)) < 1e-4


def mtx_score(*args: str, stdin: str = "") -> SimpleNamespace:
    """`mtx score ARGS` in this process (Typer's runner): exit code, stdout, stderr."""
    r = invoke("score", "--device", "cpu", *args, input=stdin)
    return SimpleNamespace(returncode=r.exit_code, stdout=r.stdout, stderr=r.stderr)


def test_mtx_score_reads_files_or_stdin_and_writes_tsv_or_json(multi30k_run, tmp_path):
    src, tgt = pairs(12)
    (tmp_path / "s.en").write_text("\n".join(src) + "\n")
    (tmp_path / "s.de").write_text("\n".join(tgt) + "\n")
    ckpt = ["--checkpoint", str(multi30k_run / "checkpoints" / "best.pt")]
    files = mtx_score(*ckpt, "--src", str(tmp_path / "s.en"), "--tgt", str(tmp_path / "s.de"))
    assert files.returncode == 0, files.stderr
    stdin = mtx_score(*ckpt, stdin="".join(f"{s}\t{t}\n" for s, t in zip(src, tgt)))
    assert stdin.stdout == files.stdout and len(files.stdout.splitlines()) == 12
    rows = [line.split("\t") for line in files.stdout.splitlines()]
    assert all(len(r) == 3 and int(r[2]) > 1 for r in rows)
    as_json = mtx_score(*ckpt, "--json", "--per-token", stdin="".join(f"{s}\t{t}\n" for s, t in zip(src, tgt)))  # fmt: skip
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    for r, row in zip(records, rows):
        assert len(r["per_token"]) == r["tokens"] == int(row[2])
        assert (
            abs(r["total"] - float(row[0])) < 1e-5 and abs(r["total"] - sum(r["per_token"])) < 1e-9
        )
    scorer = Scorer(translator(multi30k_run).parts)
    direct = scorer.score(src, tgt)
    assert [round(s.total, 6) for s in direct] == [float(r[0]) for r in rows]


@pytest.mark.parametrize(
    "args, stdin, message",
    [
        (["--src", "A"], "", "--src and --tgt go together"),
        ([], "a man\tein Mann\nno tab here\n", "stdin line 2: no tab between the source and"),
        (["--src", "A", "--tgt", "B3"], "", "has 2 lines but"),
        (["--src", "A", "--tgt", "missing"], "", "file not found"),
    ],
)
def test_mtx_score_refuses_bad_input_in_one_line(multi30k_run, tmp_path, args, stdin, message):
    (tmp_path / "A").write_text("a man\ntwo dogs\n")
    (tmp_path / "B3").write_text("ein Mann\nzwei Hunde\ndrei\n")
    args = [str(tmp_path / a) if a in ("A", "B3", "missing") else a for a in args]
    out = mtx_score("--checkpoint", str(multi30k_run / "checkpoints" / "best.pt"), *args,
                    stdin=stdin)  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr


def test_mtx_score_output_holds_stdouts_lines_resumes_and_refuses_before_writing(
    multi30k_run, tmp_path
):
    """--output (jobs/corpus.py): the file is what stdout prints; a run cut short goes on with
    --resume to the same file; a target too long or unpaired lines are refused in one line
    with nothing written."""
    src, tgt = pairs(40)
    (tmp_path / "s.en").write_text("\n".join(src) + "\n")
    (tmp_path / "s.de").write_text("\n".join(tgt) + "\n")
    files = ["--checkpoint", str(multi30k_run / "checkpoints" / "best.pt"), "--src",
             str(tmp_path / "s.en"), "--tgt", str(tmp_path / "s.de"), "--per-token"]  # fmt: skip
    out = tmp_path / "scores.txt"
    stdout = mtx_score(*files).stdout
    done = mtx_score(*files, "--output", str(out), "--chunk-lines", "16")
    assert done.returncode == 0 and out.read_text() == stdout, done.stderr
    assert "scored 40 pairs into" in done.stderr
    kept = "".join(stdout.splitlines(keepends=True)[:17])
    out.write_text(kept + stdout.splitlines(keepends=True)[17][:9])  # killed mid-line 18
    again = mtx_score(*files, "--output", str(out), "--chunk-lines", "16", "--resume")
    assert again.returncode == 0 and out.read_text() == stdout, again.stderr
    assert "scored 23 pairs" in again.stderr and "17 done before" in again.stderr
    long = " ".join(["Hund"] * (Scorer(translator(multi30k_run).parts).limit + 5))
    (tmp_path / "long.de").write_text("\n".join(tgt[:2] + [long] + tgt[3:]) + "\n")
    (tmp_path / "short.de").write_text("\n".join(tgt[:39]) + "\n")
    for bad, message in (
        ("long.de", "line 3: the target has"),
        ("short.de", "short.de has 39: they must pair up"),
    ):
        files[5] = str(tmp_path / bad)
        refused = mtx_score(*files, "--output", str(tmp_path / "new.txt"))
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "new.txt").exists()
    no_files = mtx_score(*files[:2], "--output", str(tmp_path / "new.txt"), stdin="a\tb\n")
    assert (
        no_files.returncode == 2 and "--output and --resume take --src and --tgt" in no_files.stderr
    )


def test_a_target_longer_than_the_model_takes_is_refused_with_its_line(multi30k_run):
    scorer = Scorer(translator(multi30k_run).parts)
    long = " ".join(["Hund"] * (scorer.limit + 5))
    with pytest.raises(Exception, match="line 2: the target has"):
        scorer.score(["a", "b"], ["ein", long])


def test_cross_entropies_score_a_too_long_target_inf_and_chunk_alike(multi30k_run, monkeypatch):
    """Scorer.cross_entropies, the one scoring API of distillation and dual filtering: a
    target longer than the model takes is +inf (never an error); chunks change nothing."""
    scorer = Scorer(translator(multi30k_run).parts)
    long = " ".join(["Hund"] * (scorer.limit + 5))
    src, tgt = ["a man", "two dogs", "a cat"], ["ein Mann", long, "eine Katze"]
    xent = scorer.cross_entropies(src, tgt)
    assert xent[1] == float("inf")
    assert xent[0] == -scorer.score([src[0]], [tgt[0]])[0].mean
    assert xent[2] == -scorer.score([src[2]], [tgt[2]])[0].mean
    monkeypatch.setattr(score, "CHUNK", 1)
    assert scorer.cross_entropies(src, tgt) == xent


@pytest.mark.slow  # a benchmark's own run
def test_mtx_bench_score_times_scoring_beside_translating(multi30k_run):
    out = subprocess.run(
        [sys.executable, "-m", "mtx", "bench", "score", "--checkpoint",
         str(multi30k_run / "checkpoints" / "best.pt"), "--src", str(MULTI30K / "test2016.en"),
         "--lines", "30", "--beam", "2", "--rounds", "1", "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["benchmark"] == "score" and r["lines"] == 30
    assert list(r["jobs"]) == ["score", "translate, beam 2"]
    assert all(j["seconds"] > 0 and j["pairs_per_s"] > 0 for j in r["jobs"].values())
    assert r["jobs"]["score"]["vs_score"] == 1.0 and 0.0 <= r["real_above_shuffled"] <= 1.0
