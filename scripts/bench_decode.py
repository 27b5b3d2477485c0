"""Decoding speed race: mtx against Hugging Face MarianMT and CTranslate2 on the same weights.

    python scripts/bench_decode.py --checkpoint RUN/checkpoints/best.pt \
        --src ../shared/data/multi30k/test2016.en [--batch 32] [--beam 4 --beam 1] \
        [--threads 2] [--device cpu] [--dtype fp32] [--lines N] [--json]

The checkpoint is exported both ways into a temporary directory (`mtx export`). Every engine
then translates the same batches of pre-encoded sentences (at most --batch sentences of one
source length, see peers.py) with the same beam, alpha 0 and mtx's length limit, so that the
engines do the same work and should give the same output. Timed: the search only (not
tokenization), after one warm-up batch. Reported per engine and beam: seconds, sentences/s,
output tokens/s (EOS not counted, each engine's own outputs) and the share of lines equal to
mtx's output.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from peers import batches, ct2_generate, hf_generate

from mtx.data.batching import pad
from mtx.data.sources import read_lines
from mtx.decode.translator import Translator
from mtx.export import export

ENGINES = ("mtx", "hf", "ct2", "ct2-int8")
# --dtype: torch's dtype (mtx, Hugging Face) and CTranslate2's compute type (its int8 engine
# keeps int8 weights and computes the rest in this type)
DTYPES = {
    "fp32": (torch.float32, "float32", "int8_float32"),
    "bf16": (torch.bfloat16, "bfloat16", "int8_bfloat16"),
    "fp16": (torch.float16, "float16", "int8_float16"),
}


def timed(run, inputs) -> tuple[float, list[list[int]]]:
    """Seconds to run every batch (after a warm-up on the first), and the outputs in order."""
    run(*inputs[0])
    start = time.perf_counter()
    outputs = [ids for batch in inputs for ids in run(*batch)]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, type=Path)
    ap.add_argument("--src", required=True, type=Path, help="source sentences, one per line")
    ap.add_argument("--lines", type=int, default=0, help="only the first N lines (0 = all)")
    ap.add_argument("--batch", type=int, default=32, help="sentences per batch")
    ap.add_argument("--beam", type=int, action="append", help="beam sizes (default 4 and 1)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of every engine")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="every engine's")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    engines = args.engines.split(",")
    beams = args.beam or [4, 1]

    torch.set_num_threads(args.threads)
    lines = list(read_lines(args.src))
    lines = lines[: args.lines] if args.lines else lines
    overrides = ["decode.alpha=0", f"decode.dtype={args.dtype}"]
    tr = Translator.from_checkpoint(args.checkpoint, overrides, device=args.device)
    torch_dtype, ct2_type, ct2_int8_type = DTYPES[args.dtype]
    plan = batches(tr, lines, args.batch)
    order = [i for _, idx in plan for i in idx]
    srcs = [(pad([tr.encode(lines[i]) for i in idx]), limit) for limit, idx in plan]
    pieces = [([tr.sp.encode(lines[i], out_type=str) for i in idx], limit) for limit, idx in plan]

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        runners = {}
        if "mtx" in engines:

            def run_mtx(src, limit, beam):
                tr.cfg.decode.beam = beam
                return [h[0].tokens for h in tr.search(src.to(tr.device))]

            runners["mtx"] = (run_mtx, srcs, str(tr.dtype).removeprefix("torch."))
        if "hf" in engines:
            from transformers import MarianMTModel

            export(args.checkpoint, "hf", Path(tmp) / "hf")
            hf = MarianMTModel.from_pretrained(Path(tmp) / "hf").to(args.device, torch_dtype).eval()

            def run_hf(src, limit, beam):
                return hf_generate(hf, src.to(args.device), limit, beam)

            runners["hf"] = (run_hf, srcs, str(hf.dtype).removeprefix("torch."))
        for name, quantization, compute in (
            ("ct2", None, ct2_type),
            ("ct2-int8", "int8", ct2_int8_type),
        ):
            if name not in engines:
                continue
            import ctranslate2

            export(args.checkpoint, "ctranslate2", Path(tmp) / name, quantization)
            model = ctranslate2.Translator(
                str(Path(tmp) / name),
                device=args.device,
                intra_threads=args.threads,
                compute_type=compute,
            )

            def run_ct2(batch, limit, beam, model=model):
                return [ids for ids, _ in ct2_generate(model, tr, batch, limit, beam)]

            runners[name] = (run_ct2, pieces, model.compute_type)

        for beam in beams:
            reference = None
            for name in engines:
                run, inputs, dtype = runners[name]
                seconds, outputs = timed(run, [(*x, beam) for x in inputs])
                tokens = sum(len(o) for o in outputs)
                results.append(
                    {
                        "engine": name,
                        "dtype": dtype,
                        "beam": beam,
                        "batch": args.batch,
                        "lines": len(order),
                        "seconds": seconds,
                        "sentences_per_s": len(order) / seconds,
                        "tokens_per_s": tokens / seconds,
                        "same_as_mtx": None
                        if reference is None
                        else sum(a == b for a, b in zip(outputs, reference)) / len(order),
                    }
                )
                if name == "mtx":
                    reference = outputs
    by = {(r["engine"], r["beam"]): r for r in results}
    for r in results:
        for peer in ("hf", "ct2"):
            if r["engine"] == "mtx" and (peer, r["beam"]) in by:
                r[f"speedup_vs_{peer}"] = r["tokens_per_s"] / by[(peer, r["beam"])]["tokens_per_s"]
    if args.json:
        print(
            json.dumps(
                {
                    "device": args.device,
                    "dtype": args.dtype,
                    "threads": args.threads,
                    "results": results,
                }
            )
        )
        return
    print(
        f"{len(order)} lines, batches of {args.batch}, device {args.device}, {args.dtype}, "
        f"threads {args.threads}"
    )
    print("| engine | beam | seconds | sentences/s | tokens/s | same as mtx |")
    print("|---|---|---|---|---|---|")
    for r in results:
        same = "-" if r["same_as_mtx"] is None else f"{100 * r['same_as_mtx']:.1f}%"
        print(
            f"| {r['engine']} | {r['beam']} | {r['seconds']:.2f} | {r['sentences_per_s']:.1f} "
            f"| {r['tokens_per_s']:.0f} | {same} |"
        )
    for r in results:
        for peer in ("hf", "ct2"):
            if f"speedup_vs_{peer}" in r:
                print(f"mtx / {peer} tokens/s, beam {r['beam']}: {r[f'speedup_vs_{peer}']:.2f}x")


if __name__ == "__main__":
    main()
