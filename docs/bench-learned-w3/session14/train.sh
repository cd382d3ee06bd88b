#!/bin/sh
# session 14: E3 = shipped E2 + 1 epoch over the chat-heavy mix
set -e
cd /work/main
mkdir -p /work/data/mix
.venv/bin/python /work/data/mix.py
.venv/bin/python -m specdemo train-draft --target builtin:smollm2-135m --answers /work/data/mix/answers.jsonl --out /work/data/E3 \
  --init builtin:smollm2-135m-eagle3 --keep-draft-vocab --epochs 1 --train-dtype bfloat16 --draft-vocab 8192 --ttt-steps 3 \
  --capture-backend native --report-prompts 20 --report-k 4 --resume > /work/data/E3.log 2>&1
echo done > /work/data/E3.done
