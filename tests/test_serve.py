"""`mtx serve` as a user meets it: a real server process on 127.0.0.1 and a real HTTP client.

The model is the Multi30k fixture's (conftest.py); the texts are test2016's.
"""

import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import MULTI30K
from helpers import translating
from helpers.common import invoke

from mtx.bench.server import Server
from mtx.checkpoint import Checkpoint
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.files import sha256_file
from mtx.formats import exported_from
from mtx.tokens import SOURCE_BUCKET

LINES = (MULTI30K / "test2016.en").read_text(encoding="utf-8").splitlines()[:96]
# a worker that never sends a batch for want of waiting: only a full budget or SIGTERM does
STALLED = ("serve.max_wait_ms=3600000", "decode.batch_tokens=100000")


@pytest.fixture(scope="module")
def checkpoint(multi30k_run):
    return multi30k_run / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def reference(checkpoint):
    """`mtx translate`'s output for LINES, and each line's score translated alone."""
    out = subprocess.run(
        [sys.executable, "-m", "mtx", "translate", "--checkpoint", str(checkpoint)],
        input="\n".join(LINES) + "\n", capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    tr = Translator.from_checkpoints(checkpoint, device="cpu")
    scores = [translating.outputs(tr, [line])[0][0].score for line in LINES]
    return dict(zip(LINES, zip(out, scores)))


@pytest.fixture(scope="module")
def server(checkpoint):
    # small batches, so that a request of several lines spans batches
    # two decoding processes (serve/workers.py), whatever this machine's cores
    sets = ("decode.batch_tokens=64", "serve.max_texts=40", "serve.max_chars=600")
    with Server(checkpoint, *sets, "serve.max_body_bytes=30000", "serve.workers=2") as s:
        yield s
        assert s.stop() == 0, "".join(s.lines)


def test_concurrent_clients_get_exactly_what_mtx_translate_gives(server, reference):
    """Four clients send test2016 lines in random groups, interleaved: every answer equals
    `mtx translate`'s line, and its score equals the line's score decoded alone, bit for bit."""
    order = list(LINES)
    random.Random(7).shuffle(order)
    groups, i, rng = [], 0, random.Random(8)
    while i < len(order):
        n = rng.choice((1, 1, 2, 3, 5, 8))
        groups.append(order[i : i + n])
        i += n
    answers, errors = [], []

    def client(mine):
        for texts in mine:
            status, answer = server.translate(texts)
            if status != 200:
                errors.append(answer)
                continue
            answers.extend(zip(texts, answer["translations"], answer["scores"]))

    threads = [threading.Thread(target=client, args=(groups[k::4],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(answers) == len(LINES)
    for text, translation, score in answers:
        assert (translation, score) == reference[text], text
    assert server.metric("mtx_batch_sentences_count") < len(LINES)  # some batches held several


def test_an_empty_text_gets_an_empty_translation_in_its_place(server, reference):
    status, answer = server.translate([LINES[0], "", "   ", LINES[1]])
    assert status == 200
    assert answer["translations"] == [reference[LINES[0]][0], "", "", reference[LINES[1]][0]]
    assert answer["scores"][1:3] == [None, None]


def test_nbest_and_beam_choices_are_the_searchs(server, checkpoint):
    status, answer = server.translate(LINES[2], beam=3, nbest=3)
    assert status == 200
    tr = Translator.from_checkpoints(checkpoint, ["decode.beam=3"], device="cpu")
    hyps = translating.outputs(tr, [LINES[2]], nbest=3)[0]
    assert answer["nbest"][0] == [{"text": h.text, "score": h.score} for h in hyps]
    status, greedy = server.translate(LINES[2], beam=1)
    assert greedy["translations"] == translating.texts(tr, [LINES[2]], beam=1)


BAD = [  # (what, body, status, words in the error)
    ("not JSON", b"{bad", 422, "not valid JSON"),
    ("invalid UTF-8", b'{"text": "\xff\xfe caf\xe9"}', 422, "UTF-8"),
    ("too deeply nested", b"[" * 100_000 + b"]" * 100_000, 413, "max_body_bytes"),
    ("JSON that is not an object", b"[1, 2]", 422, "valid dictionary"),
    ("no text", {}, 422, "text: Field required"),
    ("a number for text", {"text": 3}, 422, "text: must be a string or a list"),
    ("a number in the list", {"text": ["a", 4]}, 422, "text[1]"),
    ("an unknown key", {"text": "a", "bem": 2}, 422, "bem: Extra inputs"),
    ("a string for beam", {"text": "a", "beam": "4"}, 422, "beam"),
    ("beam 0", {"text": "a", "beam": 0}, 422, "beam must be in 1..8"),
    ("beam over serve.max_beam", {"text": "a", "beam": 99}, 422, "serve.max_beam"),
    ("nbest over the beam", {"text": "a", "beam": 2, "nbest": 3}, 422,
     "nbest 3 needs a beam of at least 3"),
    ("nbest 0", {"text": "a", "nbest": 0}, 422, "nbest must be at least 1, got 0"),
    ("an unknown format", {"text": "a", "format": "pdf"}, 422,
     "format must be plain, paragraphs, html or xml, got 'pdf'"),
    ("an empty list", {"text": []}, 422, "empty list"),
    ("a lone surrogate", b'{"text": "a \\ud800 b"}', 422, "lone surrogate"),
    ("a string for attention", {"text": "a", "attention": "yes"}, 422, "attention"),
    ("too many texts", {"text": ["a"] * 41}, 413, "serve.max_texts is 40"),
    ("a text too long", {"text": "a " * 301}, 413, "serve.max_chars is 600"),
    ("a body too large", {"text": ["\u00e9" * 200] * 40}, 413, "serve.max_body_bytes (30000)"),
    ("an empty constraint", {"text": {"text": "a", "constraints": [" "]}}, 422,
     "text: constraints[0] is empty"),
    ("a prefix past the longest output", {"text": ["a", {"text": "A dog.", "prefix": "Hund " * 80}]},
     422, "text[1]: the prefix has"),
    ("an unknown key in a text", {"text": [{"text": "a", "prefx": "b"}]}, 422, "text[0].prefx"),
]  # fmt: skip


def test_every_kind_of_bad_request_gets_a_clear_json_error_and_the_next_one_is_served(
    server, reference
):
    before = server.metric('mtx_requests_total{outcome="invalid"}')
    for what, body, status, words in BAD:
        got, headers, answer = server.request("POST", "/translate", body)
        assert got == status, (what, answer)
        assert isinstance(answer, dict) and words in answer["error"], (what, answer)
        assert "\n" not in answer["error"] and answer["status"] == status
    assert server.request("GET", "/translate")[0] == 405
    status, _, answer = server.request("GET", "/nowhere")
    assert status == 404 and answer["error"] == "Not Found"
    invalid = sum(1 for _, _, status, _ in BAD if status == 422)
    assert server.metric('mtx_requests_total{outcome="invalid"}') - before == invalid
    # control characters and odd Unicode are translated, not a crash
    status, answer = server.translate(["\x00\x07 a \x1b[31m dog \u202e", "\U0001f600 " * 50])
    assert status == 200 and len(answer["translations"]) == 2
    status, answer = server.translate(LINES[3])
    assert status == 200 and answer["translations"] == [reference[LINES[3]][0]]
    assert server.get("/ready")[0] == 200


def test_texts_with_controls_get_what_mtx_translate_json_gives(server, checkpoint, reference):
    """A request mixing texts with controls and plain ones: each answer is `mtx translate
    --json`'s for that line, the plain ones as before, with how many constraints each lacks."""
    texts = [{"text": LINES[0], "prefix": "Zwei"}, LINES[1],
             {"text": LINES[2], "constraints": ["Straße"], "avoid": ["Mann"]},
             {"text": LINES[4], "alternatives": 2}]  # fmt: skip
    status, answer = server.translate(texts)
    assert status == 200, answer
    rows = [t if isinstance(t, dict) else {"text": t} for t in texts]
    out = subprocess.run(
        [sys.executable, "-m", "mtx", "translate", "--checkpoint", str(checkpoint), "--json"],
        input="".join(json.dumps(r) + "\n" for r in rows), capture_output=True, text=True,
        check=True,
    ).stdout.splitlines()  # fmt: skip
    expected = [json.loads(x) for x in out]
    assert answer["results"] == expected  # the one JSON form of a result (decode/result.py)
    assert answer["translations"] == [e["translation"] for e in expected]  # deprecated shape
    assert answer["scores"] == [e["score"] for e in expected]
    assert answer["unmet"] == [0, 0, 0, 0]
    assert answer["alternatives"][:3] == [None, None, None]
    assert [a["text"] for a in answer["alternatives"][3]] == [
        a["translation"] for a in expected[3]["alternatives"]
    ]
    assert answer["translations"][0].startswith("Zwei ")
    assert answer["translations"][1] == reference[LINES[1]][0]
    assert "Straße" in answer["translations"][2].replace(".", " ").split()
    assert "Mann" not in answer["translations"][2].replace(".", " ").split()


def test_health_ready_info_metrics_docs_and_the_page(server, checkpoint):
    assert server.get("/health")[2] == {"status": "ok"}
    assert server.get("/ready")[2] == {"ready": True}
    status, _, info = server.get("/info")
    sets = ["--set", "decode.batch_tokens=64", "--set", "serve.max_texts=40"]
    cli = json.loads(invoke("info", str(checkpoint), "--json", *sets).output)
    served = info["checkpoints"][0]
    assert {k: v for k, v in served.items() if k != "config"} == {
        k: v for k, v in cli.items() if k != "config"
    }
    assert served["config"]["decode"] == cli["config"]["decode"]  # with the server's --set
    assert info["engine"] == "mtx" and info["serve"]["max_texts"] == 40
    text = server.get("/metrics")[2]
    for name in ("mtx_requests_total", "mtx_sentences_total", "mtx_tokens_in_total",
                 "mtx_tokens_out_total", "mtx_queue_depth", "mtx_batch_sentences_bucket",
                 "mtx_request_seconds_bucket"):  # fmt: skip
        assert name in text
    assert "/translate" in server.get("/openapi.json")[2]["paths"]
    # no page that would fetch Swagger UI from a CDN: the server fetches nothing from outside
    assert server.get("/docs")[0] == 404 and server.get("/redoc")[0] == 404
    status, headers, page = server.get("/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert 'id="source"' in page and "http://" not in page and "https://" not in page


def test_attention_for_the_page(server, reference):
    status, answer = server.translate(LINES[4], attention=True)
    assert status == 200
    att = answer["attention"][0]
    assert att["output"][-1] == att["source"][-1] == "</s>"
    assert len(att["weights"]) == len(att["output"])
    for row in att["weights"]:  # each output subword's attention sums to 1 over the source
        assert len(row) == len(att["source"]) and abs(sum(row) - 1) < 1e-4
    assert answer["translations"] == [reference[LINES[4]][0]]


def lines_of_padded_length(checkpoint, length: int, n: int) -> list[str]:
    tr = Translator.from_checkpoints(checkpoint, device="cpu")
    encode = tr.parts.codec.encode
    same = [x for x in LINES if -(-len(encode(x)) // SOURCE_BUCKET) * SOURCE_BUCKET == length]
    assert len(same) >= n
    return same[:n]


def test_sentences_of_concurrent_requests_go_in_one_batch_when_the_budget_fills(checkpoint):
    texts = lines_of_padded_length(checkpoint, 16, 6)
    sets = ("serve.max_wait_ms=3600000", "decode.batch_tokens=96", "serve.workers=1")
    with Server(checkpoint, *sets) as s:
        answers = {}
        threads = [
            threading.Thread(target=lambda t=t: answers.setdefault(t, s.translate(t)))
            for t in texts
        ]
        for t in threads:  # six requests of 16 tokens fill the budget of 96: one batch
            t.start()
        for t in threads:
            t.join()
        assert all(status == 200 for status, _ in answers.values())
        assert s.metric("mtx_batch_sentences_count") == 1
        assert s.metric("mtx_batch_sentences_sum") == 6
        assert len(s.decoders()) == 1  # serve.workers=1: one decoding process all the same
        assert s.stop() == 0


def test_a_full_queue_answers_503_and_a_signal_without_draining_503_what_is_queued(checkpoint):
    # serve.timeout_s far beyond the test: the request holding the queue stays there however
    # slowly this machine runs the rest
    sets = (*STALLED, "serve.max_queue=3", "serve.max_texts=3", "serve.timeout_s=3600")
    with Server(checkpoint, *sets, "serve.drain_s=0") as s:
        waiting = {}
        t = threading.Thread(target=lambda: waiting.update(r=s.translate(LINES[:3])))
        t.start()
        s.wait_for_queue(3)
        status, headers, answer = s.request("POST", "/translate", {"text": "One more."})
        assert status == 503 and headers["retry-after"] == "1"
        assert "serve.max_queue is 3" in answer["error"]
        assert s.metric('mtx_requests_total{outcome="queue_full"}') == 1
        # SIGTERM with serve.drain_s 0: what is queued gets a clean 503, and the exit is 0
        assert s.stop() == 0, "".join(s.lines)
        t.join()
        status, answer = waiting["r"]
        assert status == 503 and "stopped before" in answer["error"]


def test_a_request_waiting_longer_than_the_timeout_gets_504_and_leaves_the_queue(checkpoint):
    with Server(checkpoint, *STALLED, "serve.timeout_s=1", "serve.workers=1") as s:
        status, answer = s.translate(LINES[:3])
        assert status == 504 and "serve.timeout_s (1 s)" in answer["error"]
        assert s.metric("mtx_queue_depth") == 0
        assert s.metric('mtx_requests_total{outcome="timeout"}') == 1
        status, answer = s.translate(LINES[5])  # the next one times out alike, not a crash
        assert status == 504 and s.metric('mtx_requests_total{outcome="timeout"}') == 2
        assert s.stop() == 0, "".join(s.lines)


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)]
)
def test_a_signal_drains_the_queue_answers_everything_and_exits_0(checkpoint, reference, sig):
    with Server(checkpoint, *STALLED, "serve.drain_s=60") as s:
        groups = [LINES[i : i + 2] for i in range(10, 22, 2)]
        answers = {}

        def client(texts):
            answers[tuple(texts)] = s.translate(texts)

        threads = [threading.Thread(target=client, args=(g,)) for g in groups]
        for t in threads:
            t.start()
        s.wait_for_queue(12)  # all six requests are in the server, none decoded
        assert s.stop(sig) == 0, "".join(s.lines)
        for t in threads:
            t.join()
    for texts in groups:
        status, answer = answers[tuple(texts)]
        assert status == 200, answer
        assert answer["translations"] == [reference[x][0] for x in texts]


def test_a_decoding_process_that_dies_is_replaced_and_no_request_is_lost(checkpoint, reference):
    texts = lines_of_padded_length(checkpoint, 16, 8)
    # 8 lines of 16 tokens, a budget of 64: at least two batches, and the idle workers take
    # them in turn (batcher.py), so both processes get one, the dead one included
    sets = ("serve.workers=2", "serve.max_wait_ms=3600000", "decode.batch_tokens=64")
    with Server(checkpoint, *sets) as s:
        assert s.get("/info")[2]["workers"] == 2 and s.metric("mtx_workers") == 2
        before = s.decoders()
        assert len(before) == 2
        os.kill(before[0], signal.SIGKILL)
        status, answer = s.translate(texts)
        assert status == 200, answer
        assert answer["translations"] == [reference[x][0] for x in texts]
        assert answer["scores"] == [reference[x][1] for x in texts]
        assert s.metric("mtx_batch_sentences_sum") == 8  # the retry is not a second batch
        after = s.decoders()
        assert len(after) == 2 and before[0] not in after and before[1] in after
        assert s.stop() == 0, "".join(s.lines)
    assert not any(Path(f"/proc/{pid}").exists() for pid in after)  # none outlives the server


def test_without_the_extra_serve_says_what_to_install(checkpoint, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a)
    )
    result = invoke("serve", "--checkpoint", str(checkpoint))
    assert result.exit_code == 2
    assert "pip install 'mtx[serve]'" in result.output and "uvicorn" in result.output


def test_serve_refuses_bad_settings_in_one_line(checkpoint):
    for sets, words in (
        (["serve.max_queue=0"], "serve.max_queue must be at least 1"),
        (["serve.port=70000"], "serve.port must be in 0..65535"),
        (["serve.timeout_s=0"], "serve.timeout_s must be positive"),
        (["serve.max_queue=10"], "serve.max_texts (256) must not exceed serve.max_queue (10)"),
        (["decode.sampling=true"], "decode.sampling=false"),
    ):
        args = ["serve", "--checkpoint", str(checkpoint)]
        result = invoke(*args, *[x for s in sets for x in ("--set", s)])
        assert result.exit_code == 2 and words in result.output, result.output
    result = invoke("serve", "--checkpoint", str(checkpoint), "--engine", "x")
    assert result.exit_code == 2 and "--engine must be one of mtx, ctranslate2" in result.output


def test_the_ctranslate2_engine_serves_an_export_made_once(checkpoint, tmp_path):
    from mtx.serve.engine import make_engine

    ct2_dir = tmp_path / "model.ct2"
    engine = make_engine("ctranslate2", [checkpoint], [], "cpu", ct2_dir)
    assert (ct2_dir / "model.bin").is_file()
    asked = engine.translator.options(beam=2, nbest=2)
    results = engine.translate(LINES[:4], asked)
    assert [len(r.translation.outputs) for r in results] == [2, 2, 2, 2]
    outputs = [r.translation.outputs for r in results]
    assert all(o[0].text and o[0].score >= o[1].score for o in outputs)
    stamp = (ct2_dir / "model.bin").stat().st_mtime_ns
    again = make_engine("ctranslate2", [checkpoint], [], "cpu", ct2_dir)  # reused, not redone
    assert (ct2_dir / "model.bin").stat().st_mtime_ns == stamp
    assert [r.translation for r in again.translate(LINES[:4], asked)] == [
        r.translation for r in results
    ]


def test_a_cached_ctranslate2_export_of_a_changed_checkpoint_is_made_again_or_refused(
    checkpoint, tmp_path
):
    """The export beside the checkpoint (CKPT.ct2, which mtx made) follows the checkpoint: a
    changed checkpoint is exported again, never served from the old export. One in a
    --ct2-dir the user named is refused in one line instead."""
    from mtx.serve.engine import make_engine

    ckpt = tmp_path / "model.pt"
    shutil.copy(checkpoint, ckpt)
    first = make_engine("ctranslate2", [ckpt], [], "cpu", None)
    assert (tmp_path / "model.ct2" / "model.bin").is_file()
    greedy = first.translator.options(beam=1)
    before = [r.translation for r in first.translate(LINES[:8], greedy)]
    changed = Checkpoint.load(ckpt)
    changed.model = {k: v.flip(0) if k == "embed.weight" else v for k, v in changed.model.items()}
    changed.save(ckpt)
    again = make_engine("ctranslate2", [ckpt], [], "cpu", None)
    assert exported_from(tmp_path / "model.ct2") == sha256_file(ckpt)
    assert [r.translation for r in again.translate(LINES[:8], greedy)] != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ct2", "model.pt"]
    shutil.copy(checkpoint, ckpt)  # the export is now of another checkpoint again
    with pytest.raises(MtxError, match=r"model.ct2 was exported from another checkpoint"):
        make_engine("ctranslate2", [ckpt], [], "cpu", tmp_path / "model.ct2")


def test_the_first_decoding_process_describes_its_engine_so_the_server_counts_tokens_alike(
    checkpoint,
):
    """The server's own process holds a Front (settings and tokenizer, as the first decoding
    process describes them) that counts each text's source tokens as the translator does."""
    from mtx.serve.engine import describe_engine, make_engine
    from mtx.serve.front import Front

    engine = make_engine("mtx", [checkpoint], ["decode.beam=3"], "cpu", None)
    about = describe_engine(engine, [checkpoint], ["decode.beam=3"])
    front = Front(pickle.loads(pickle.dumps(about)))  # as it travels over the pipe
    assert not hasattr(front, "translator") and not hasattr(front, "model")
    assert front.cfg.decode.beam == 3 and front.attention and about.setup.device == "cpu"
    assert about.checkpoints[0]["config"]["decode"]["beam"] == 3  # `mtx info` with the --set
    tr = engine.translator
    for text in LINES[:50] + ["", "  spaced   out  ", "word " * 400]:
        assert front.length(text) == len(tr.parts.codec.encode(text))
    ensemble = make_engine("mtx", [checkpoint, checkpoint], [], "cpu", None)
    assert not Front(describe_engine(ensemble, [checkpoint, checkpoint], [])).attention
    with pytest.raises(MtxError, match="decode.sampling=false"):
        make_engine("mtx", [checkpoint], ["decode.sampling=true"], "cpu", None)


def test_the_servers_own_process_never_loads_torch(server):
    """Only the decoding processes hold torch and the model (serve/front.py)."""

    def loads_torch(pid: int) -> bool:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()

    assert len(server.decoders()) == 2 and all(loads_torch(p) for p in server.decoders())
    assert not loads_torch(server.proc.pid)


def test_a_line_with_no_words_is_the_empty_translation_everywhere(server, checkpoint, tmp_path):
    """`mtx translate` (plain, --json, a corpus job) and `mtx serve` give a text with no words
    the empty translation, undecoded, with null scores."""
    lines = [LINES[0], "", "   ", LINES[1]]
    status, answer = server.translate(lines)
    assert status == 200 and answer["translations"][1:3] == ["", ""]
    ckpt = ("--checkpoint", str(checkpoint))
    plain = invoke("translate", *ckpt, "--device", "cpu", input="\n".join(lines) + "\n")
    assert plain.stdout.splitlines() == answer["translations"]
    rows = "".join(json.dumps({"text": x}) + "\n" for x in lines)
    out = [
        json.loads(x) for x in invoke("translate", *ckpt, "--json", input=rows).stdout.splitlines()
    ]
    assert out[1] == out[2] == {"translation": "", "score": None, "log_prob": None, "unmet": 0}
    assert [x["translation"] for x in out] == answer["translations"]
    (tmp_path / "in.en").write_text("\n".join(lines) + "\n")
    invoke("translate", *ckpt, "--input", tmp_path / "in.en", "--output", tmp_path / "out.de")
    assert (tmp_path / "out.de").read_text().splitlines() == answer["translations"]
    nbest = invoke("translate", *ckpt, "--nbest", "2", input="\n")  # n lines, as n-best gives
    assert nbest.stdout.splitlines() == ["0 |||  ||| nan ||| nan"] * 2
    # with a format too: a document without words has no score (null), as in plain
    for fmt in ("paragraphs", "html"):
        rows = "".join(json.dumps({"text": x}) + "\n" for x in ("", "   "))
        got = invoke("translate", *ckpt, "--json", "--format", fmt, input=rows).stdout
        assert [json.loads(x)["score"] for x in got.splitlines()] == [None, None], (fmt, got)
        status, answer = server.translate(["", "  "], format=fmt)
        assert status == 200 and answer["scores"] == [None, None], answer
