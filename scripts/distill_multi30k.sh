#!/usr/bin/env bash
# Sequence-level distillation on Multi30k en->de, the tables of BENCHMARKS.md ("Small, fast
# models"): a teacher (configs/multi30k.yaml, 800 updates at train.lr_scale 1), its
# translations of the training sources filtered by cross-entropy (`mtx distill`), and one
# student (STUDENT_CONFIG: configs/multi30k-student.yaml, the teacher's encoder and a one-layer
# SSRU decoder, or configs/multi30k-student-tiny.yaml, half as wide with an encoder of its own)
# trained for the same updates on the distilled corpus and on the original one, each with
# train.ema. Run from the project root:
#
#   bash scripts/distill_multi30k.sh                 (trains the teacher first)
#   TEACHER=CKPT bash scripts/distill_multi30k.sh    (a teacher trained already)
#   STUDENT_INIT=1 ...                               (both students take the teacher's
#                            embeddings and encoder, frozen: train.init_parts, train.freeze)
#   STUDENT_CONFIG=configs/multi30k-student-tiny.yaml ...   (the tiny student, from scratch)
#   NBEST=8 ...              (each line: the teacher's 8 best, the one closest to the reference)
#
# Steps whose output exists are not run again. Prints one JSON line of scores per model,
# weights (the moving average, or the raw weights of the same run) and test set, then the
# decoding race of the teacher and the student on test2016.
set -euo pipefail
WORK=${WORK:-runs/distill}
M30K=${M30K:-data/multi30k}
MTX=${MTX:-python -m mtx}
[ -f "$M30K/train.en" ] || $MTX fetch multi30k --output "$M30K"  # once: needs the network
TEACHER_STEPS=${TEACHER_STEPS:-800}
STUDENT_CONFIG=${STUDENT_CONFIG:-configs/multi30k-student.yaml}
STUDENT_STEPS=${STUDENT_STEPS:-800}
EMA=${EMA:-0.995}   # a horizon of 200 updates: the runs here are short
STUDENT_INIT=${STUDENT_INIT:-}
NBEST=${NBEST:-}
CLOSEST=()
[ -n "$NBEST" ] && CLOSEST=(--ref "$M30K/train.de" --nbest "$NBEST" --beam "$NBEST")

if [ -z "${TEACHER:-}" ]; then
  T=(--set "run_dir=$WORK/teacher" --set "data.train=$M30K/train" --set "data.valid=$M30K/val"
     --set "data.test=$M30K/test2016" --set train.warmup_steps=500 --set train.lr_scale=1
     --set train.seed=1 --set "train.max_steps=$TEACHER_STEPS")
  if [ ! -e "$WORK/teacher/checkpoints/best.pt" ]; then
    $MTX prepare --config configs/multi30k.yaml "${T[@]}"
    $MTX train --config configs/multi30k.yaml "${T[@]}"
  fi
  TEACHER=$WORK/teacher/checkpoints/best.pt
fi

if [ ! -e "$WORK/distilled/distill.json" ]; then
  $MTX distill --checkpoint "$TEACHER" --src "$M30K/train.en" --output-dir "$WORK/distilled" \
    --drop-worst 0.05 --resume "${CLOSEST[@]}"
fi
cat "$WORK/distilled/distill.json"

S_INIT=()
SUFFIX=
[ "$STUDENT_CONFIG" = configs/multi30k-student.yaml ] || SUFFIX=-$(basename "$STUDENT_CONFIG" .yaml)
if [ -n "$STUDENT_INIT" ]; then
  S_INIT=(--set "train.init_from=$TEACHER" --set "train.init_parts=[embeddings, encoder]"
          --set "train.freeze=[embeddings, encoder]")
  SUFFIX=$SUFFIX-frozen
fi
for data in original distilled; do
  train_set=$M30K/train
  [ "$data" = distilled ] && train_set=$WORK/distilled/distilled
  run=$WORK/student-$data$SUFFIX
  S=(--set "run_dir=$run" --set "data.train=$train_set"
     --set "data.valid=$M30K/val" --set "data.test=$M30K/test2016"
     --set "train.max_steps=$STUDENT_STEPS" --set train.warmup_steps=500
     --set "train.valid_every=$STUDENT_STEPS" --set "train.ema=$EMA")
  if [ ! -e "$run/checkpoints/last.pt" ]; then
    $MTX prepare --config "$STUDENT_CONFIG" "${S[@]}" --set "data.spm_model=$TEACHER"
    $MTX train --config "$STUDENT_CONFIG" "${S[@]}" "${S_INIT[@]}"
  fi
  # the same run's weights without the moving average (train.ema keeps them beside it)
  [ -e "$run/raw.pt" ] || $MTX average "$run/checkpoints/last.pt" --raw --output "$run/raw.pt"
done

for ckpt in "$TEACHER" "$WORK"/student-{original,distilled}$SUFFIX/checkpoints/last.pt \
            "$WORK"/student-{original,distilled}$SUFFIX/raw.pt; do
  for test in test2016 test2017; do
    echo "$ckpt $test $($MTX evaluate --checkpoint "$ckpt" --src "$M30K/$test.en" \
      --ref "$M30K/$test.de" --json)"
  done
done

$MTX bench decode --checkpoint "$TEACHER" \
  --checkpoint "$WORK/student-distilled$SUFFIX/checkpoints/last.pt" --src "$M30K/test2016.en" \
  --engines mtx,mtx-int8,ct2-int8 --threads 2 --rounds 2
