#!/usr/bin/env bash
# Fine-tuning on real data, on the CPU: a Multi30k en->de model trained on Multi30k's training
# pairs (the "general" model, scored on test2016), fine-tuned on part of test2017 (captions
# of another year's images) and scored on the rest, before and after; test2016 scores show
# what fine-tuning forgot.
#
#   bash scripts/finetune_multi30k.sh [WORK]            (default WORK: runs/finetune)
#   GENERAL=CKPT bash scripts/finetune_multi30k.sh      (a general model trained already)
#
# test2017 is cut by line: 1-400 fine-tuning, 401-500 validation (best.pt), 501-1000 test.
# The general model: configs/multi30k.yaml (d_model 256, 3+3 layers, vocabulary 8000) with
# fairseq's few-update recipe, 600 updates. Prints one JSON line of scores per model and test
# set.
set -euo pipefail
WORK=${1:-runs/finetune}
M30K=${M30K:-../shared/data/multi30k}
MTX=${MTX:-python -m mtx}
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
     --set train.bleu_every=0 --set train.device=cpu)
  $MTX prepare --config configs/multi30k.yaml "${G[@]}"
  $MTX train --config configs/multi30k.yaml "${G[@]}" --overwrite
  GENERAL=$WORK/general/checkpoints/best.pt
fi

# The fine-tuning run's config names no model.* key: they come from the checkpoint. Its
# learning rate peaks at 1e-4 (step 50: lr_scale * 256^-0.5 * 50^-0.5), a tenth of the general
# run's peak: 400 pairs are seen many times over, and a rate like the general run's overwrites
# what the general model knew (BENCHMARKS.md, "Fine-tuning"). best.pt is the step of the lowest
# validation loss on the new domain.
cat > "$WORK/ft.yaml" <<EOF
run_dir: $WORK/ft
data:
  src_lang: en
  tgt_lang: de
  train: $WORK/data/ft_train
  valid: $WORK/data/ft_valid
  test: $WORK/data/ft_test
train:
  max_tokens: 2048
  warmup_steps: 50
  lr_scale: 0.0113
  max_steps: 100
  valid_every: 10
  bleu_every: 0
  device: cpu
EOF
$MTX prepare --config "$WORK/ft.yaml" --set "data.spm_model=$GENERAL"
$MTX train --config "$WORK/ft.yaml" --init-from "$GENERAL" --overwrite 2>&1 | tail -n 3
$MTX info "$WORK/ft/checkpoints/best.pt" | grep -E "started from|trained steps"

for ckpt in "$GENERAL" "$WORK/ft/checkpoints/best.pt"; do
  for test in "$M30K/test2016" "$WORK/data/ft_test"; do
    echo "$ckpt $test $($MTX evaluate --checkpoint "$ckpt" --src "$test.en" --ref "$test.de" --json)"
  done
done
