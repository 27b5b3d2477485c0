#!/usr/bin/env bash
# Fine-tuning on real data: a Multi30k en->de model trained on Multi30k's training pairs (the
# "general" model, scored on test2016), fine-tuned with configs/finetune.yaml on part of
# test2017 (captions of another year's images) and scored on the rest, before and after;
# test2016 scores show what fine-tuning forgot. Run from the project root:
#
#   GENERAL=CKPT bash scripts/finetune_multi30k.sh     (a general model trained already)
#   bash scripts/finetune_multi30k.sh                  (trains one first: configs/multi30k.yaml
#                                                       with fairseq's few-update recipe)
#
# test2017 is cut by line into runs/finetune/data: 1-400 fine-tuning, 401-500 validation,
# 501-1000 test. Prints one JSON line of scores per model and test set.
# `python -m benchmarks.finetune` compares this run with others (BENCHMARKS.md).
set -euo pipefail
WORK=runs/finetune
M30K=${M30K:-data/multi30k}
MTX=${MTX:-python -m mtx}
[ -f "$M30K/train.en" ] || $MTX fetch multi30k --output "$M30K"  # once: needs the network
mkdir -p "$WORK/data"
for l in en de; do
  head -n 400 "$M30K/test2017.$l" > "$WORK/data/ft_train.$l"
  sed -n 401,500p "$M30K/test2017.$l" > "$WORK/data/ft_valid.$l"
  tail -n 500 "$M30K/test2017.$l" > "$WORK/data/ft_test.$l"
done

if [ -z "${GENERAL:-}" ]; then
  # the settings of benchmarks/per_update.py (fairseq's Multi30k recipe), en->de, 600 updates
  G=(--set "run_dir=$WORK/general" --set "data.train=$M30K/train" --set "data.valid=$M30K/val"
     --set "data.test=$M30K/test2016" --set model.dropout=0.1 --set train.warmup_steps=500
     --set train.lr_scale=0.3578 --set train.max_steps=600 --set train.valid_every=600
     --set train.bleu_every=0)
  $MTX prepare --config configs/multi30k.yaml "${G[@]}"
  $MTX train --config configs/multi30k.yaml "${G[@]}" --overwrite
  GENERAL=$WORK/general/checkpoints/best.pt
fi

$MTX prepare --config configs/finetune.yaml --set "data.spm_model=$GENERAL"
$MTX train --config configs/finetune.yaml --init-from "$GENERAL" --overwrite 2>&1 | tail -n 8
$MTX info "$WORK/ft/checkpoints/best.pt" | grep -E "started from|trained steps"

for ckpt in "$GENERAL" "$WORK/ft/checkpoints/best.pt"; do
  for test in "$M30K/test2016" "$WORK/data/ft_test"; do
    echo "$ckpt $test $($MTX evaluate --checkpoint "$ckpt" --src "$test.en" --ref "$test.de" --json)"
  done
done
