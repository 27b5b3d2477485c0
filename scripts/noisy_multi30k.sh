#!/usr/bin/env bash
# Noisy corpora on Multi30k de->en, the tables of BENCHMARKS.md ("Cleaning noisy corpora"):
# the 29k clean training pairs plus a third of noise (`mtx bench clean`: third-language
# captions, untranslated copies, misaligned pairs, boilerplate, encoding debris), then the
# same model (configs/multi30k.yaml, de->en) trained for the same updates on
#   clean    the 29k clean pairs, every cleaning rule off
#   noisy    clean + noise, every cleaning rule off
#   cleaned  clean + noise, data.clean's default rules
#   backward the 29k clean pairs en->de, every cleaning rule off (dual's backward scorer)
#   dual     clean + noise, the default rules but the lexical one, then dual conditional
#            cross-entropy filtering (forward: the clean run's model; backward: the backward
#            run's model, or BACKWARD=CKPT): the models' way to the misaligned pairs that the
#            lexical rule finds without them
# Run from the project root:
#
#   THIRD="train.fr train.cs" bash scripts/noisy_multi30k.sh
#
# STEPS, WARMUP, MAX_TOKENS, LR_SCALE, CLIP, SEED and THREADS set the training recipe
# (train.max_steps, train.warmup_steps, train.max_tokens, train.lr_scale, train.clip_norm,
# train.seed, train.threads; by default BENCHMARKS.md's "At train.lr_scale 1"); WORK,
# the run folder; RUNS, the runs to train, in order (default: all of them): two scripts with
# THREADS=1 and one run each train two runs side by side on two cores.
# THIRD: the French and Czech captions of Multi30k's training set (multi30k/dataset on
# GitHub, data/task1/raw/train.{fr,cs}.gz, gunzipped); without them the noise has no third
# language. Steps whose output exists are not run again; a training run stopped part way is
# resumed. Prints the rules' table, then one JSON line of test2016 scores per run.
set -euo pipefail
WORK=${WORK:-runs/noisy}
M30K=${M30K:-data/multi30k}
MTX=${MTX:-python -m mtx}
[ -f "$M30K/train.en" ] || $MTX fetch multi30k --output "$M30K"  # once: needs the network
STEPS=${STEPS:-800}
WARMUP=${WARMUP:-500}
MAX_TOKENS=${MAX_TOKENS:-4096}
LR_SCALE=${LR_SCALE:-1}  # train.lr_scale: the paper's formula unscaled (configs/multi30k.yaml: 2)
CLIP=${CLIP:-0}  # train.clip_norm (0: off, as in the paper)
SEED=${SEED:-1}  # train.seed
THREADS=${THREADS:-0}  # train.threads (0: torch's default)
mkdir -p "$WORK"

THIRD_FLAGS=()
for f in ${THIRD:-}; do THIRD_FLAGS+=(--third "$f"); done
[ -e "$WORK/rules.json" ] || $MTX bench clean --out "$WORK/noisy" --data "$M30K" \
  "${THIRD_FLAGS[@]}" --run-dir "$WORK/check" --json "$WORK/rules.json"

OFF=(--set data.dedup=false --set data.clean.langid=0 --set data.clean.copy=0
     --set data.clean.numbers=false --set data.clean.nontext=false
     --set data.clean.markup=false --set data.clean.max_nonletters=1
     --set data.clean.lexical=0)
BACKWARD=${BACKWARD:-$WORK/backward/checkpoints/last.pt}
runs=(clean noisy cleaned backward dual)
[ -n "${RUNS:-}" ] && read -ra runs <<< "$RUNS"  # some of them, in this order
for run in "${runs[@]}"; do
  S=(--set "run_dir=$WORK/$run" --set data.src_lang=de --set data.tgt_lang=en
     --set "data.valid=$M30K/val" --set "data.test=$M30K/test2016"
     --set "train.max_steps=$STEPS" --set "train.warmup_steps=$WARMUP"
     --set "train.max_tokens=$MAX_TOKENS" --set "train.lr_scale=$LR_SCALE"
     --set "train.clip_norm=$CLIP" --set "train.seed=$SEED" --set "train.threads=$THREADS"
     --set "train.valid_every=$STEPS")
  case $run in
    clean) S+=(--set "data.train=$M30K/train" "${OFF[@]}") ;;
    noisy) S+=(--set "data.train=$WORK/noisy" "${OFF[@]}") ;;
    backward) S+=(--set "data.train=$M30K/train" --set data.src_lang=en
                  --set data.tgt_lang=de "${OFF[@]}") ;;
    cleaned) S+=(--set "data.train=$WORK/noisy") ;;
    dual) S+=(--set "data.train=$WORK/noisy" --set data.clean.lexical=0
              --set "data.clean.dual_forward=$WORK/clean/checkpoints/last.pt"
              --set "data.clean.dual_backward=$BACKWARD") ;;
  esac
  [ -e "$WORK/$run/prepared/manifest.json" ] || $MTX prepare --config configs/multi30k.yaml "${S[@]}"
  resume=()  # a run stopped part way goes on; a finished one ends at once
  [ -e "$WORK/$run/checkpoints/last.pt" ] && resume=(--resume)
  $MTX train --config configs/multi30k.yaml "${S[@]}" "${resume[@]}"
done
for run in "${runs[@]}"; do
  [ "$run" = backward ] && continue  # en->de: scored on another direction
  echo "$run $($MTX evaluate --checkpoint "$WORK/$run/checkpoints/last.pt" \
    --src "$M30K/test2016.de" --ref "$M30K/test2016.en" --json)"
done
