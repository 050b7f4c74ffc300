#!/bin/sh
# Issue 22 items 2-4 demonstrations (experiments/results/finetune/REPORT.md).
# Usage: experiments/finetune/run_all.sh [OUT]   (from the repository root,
# with build/ built: ps_server, asyncps_python)
set -e
OUT=${1:-experiments/results/finetune}
TMP=${TMPDIR:-/tmp}/asyncps-finetune-$$
mkdir -p "$OUT" "$TMP"
export PYTHONPATH=$PWD/build/python
PY=/usr/bin/python3
S=experiments/finetune/finetune.py
# 1. Fine-tuning: pretrain 1 epoch locally, upload, 1 more epoch on 2 shards x 2 workers.
$PY $S pretrain --ckpt "$TMP/pretrained.pt" --out "$OUT/pretrain.json"
launch/psrun --servers 2 --workers 2 --run_dir "$TMP/run_ft" --progress off \
  --server_flags '--consistency=bsp --optimizer=adam --lr=0.0005' \
  --worker_cmd "$PY $PWD/$S finetune --ckpt $TMP/pretrained.pt --eval_every 100 --out $PWD/$OUT/finetune.json"
# 2. Adam + OneCycleLR (max lr 0.002), 2 epochs, on the shards vs on the workers.
for seed in ${SEEDS:-1 2}; do
  launch/psrun --servers 2 --workers 2 --run_dir "$TMP/run_server_$seed" --progress off \
    --server_flags '--consistency=bsp --optimizer=adam --lr=0.002 --max_lr=0.002' \
    --worker_cmd "$PY $PWD/$S optim --update server --epochs 2 --lr 0.002 --seed $seed --eval_every 200 --out $PWD/$OUT/optim_server_$seed.json"
  launch/psrun --servers 2 --workers 2 --run_dir "$TMP/run_worker_$seed" --progress off \
    --server_flags '--consistency=bsp --optimizer=sgd --lr=1 --max_lr=1 --momentum=0' \
    --worker_cmd "$PY $PWD/$S optim --update worker --epochs 2 --lr 0.002 --seed $seed --eval_every 200 --out $PWD/$OUT/optim_worker_$seed.json"
done
rm -rf "$TMP"
