#!/bin/sh
# session 15: E3c = shipped E2 + 1 epoch over the session-14 chat-heavy mix at lr 2e-4 , answer positions only (E3b: prompt positions too)
set -e
cd /work/main
.venv/bin/python -m specdemo train-draft --target builtin:smollm2-135m --answers /work/data/mix/answers.jsonl --out /work/data/E3c \
  --init builtin:smollm2-135m-eagle3 --keep-draft-vocab --epochs 1 --learning-rate 2e-4 --answer-loss-only --train-dtype bfloat16 --draft-vocab 8192 --ttt-steps 3 \
  --capture-backend native --report-prompts 20 --report-k 4 --resume > /work/data/E3c.log 2>&1
.venv/bin/python scripts/heldout_tasks.py /work/data/E3c --tasks chat,code,maths,chinese --per-task 12 --json /work/data/E3c/heldout-12.json > /work/data/E3c.heldout.log 2>&1
echo done > /work/data/E3c.done
