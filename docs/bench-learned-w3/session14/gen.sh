#!/bin/sh
# session 14: chat answers at 0.7/1.0 (new samples) + greedy replay of the other tasks
cd /work/main
.venv/bin/python -m specdemo train-draft --target builtin:smollm2-135m --out /work/data/genA --prompts /work/data/prompts_chat.jsonl \
  --answers-per-prompt 3 --temperatures 0.7,1.0 --max-tokens 192 --generate-batch 16 --stop-after answers --resume > /work/data/genA.log 2>&1
.venv/bin/python -m specdemo train-draft --target builtin:smollm2-135m --out /work/data/genB --prompts /work/data/prompts_replay.jsonl \
  --answers-per-prompt 1 --max-tokens 192 --generate-batch 16 --stop-after answers --resume > /work/data/genB.log 2>&1
echo done > /work/data/gen.done
