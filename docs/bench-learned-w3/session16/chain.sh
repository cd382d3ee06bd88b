#!/bin/sh
# session 15 chain, for the next session if this machine survives: regenerate the full data
# (session 10's recipe), capture, E4 = shipped E2 + 1 epoch, held-out 12 per task. Resumable:
# rerun this script; each stage resumes (--resume) or is skipped when its .done file exists.
set -e
cd /work/main
LR=${LR:-1e-3}
D=/work/data/full
# generate (70-minute windows, wall time: a SIGSTOP pause counts) until the 8,760 answers E4 needs exist
# (session 16: one window ended with 5,699 while the chain was mostly stopped, and the cut below took them all)
while [ ! -f $D.gen.done ]; do
  .venv/bin/python -m specdemo train-draft --target builtin:smollm2-135m --out $D --answers-per-prompt 3 \
    --temperatures 0.7,1.0 --max-tokens 192 --generate-batch 16 --stop-after answers --generate-minutes 70 --resume >> $D.gen.log 2>&1
  [ "$(wc -l < $D/answers.jsonl)" -ge 8760 ] && echo done > $D.gen.done
done
A=/work/data/E4.answers.jsonl  # the first 8,760 answers, as E1/E2 trained on (session 10's cut)
[ -f $A ] || head -n 8760 $D/answers.jsonl > $A
if [ ! -f /work/data/E4.done ]; then
  .venv/bin/python -m specdemo train-draft --target builtin:smollm2-135m --answers $A --out /work/data/E4 \
    --init builtin:smollm2-135m-eagle3 --keep-draft-vocab --epochs 1 --learning-rate $LR --train-dtype bfloat16 \
    --draft-vocab 8192 --ttt-steps 3 --capture-backend native --report-prompts 20 --report-k 4 --resume >> /work/data/E4.log 2>&1
  .venv/bin/python scripts/heldout_tasks.py /work/data/E4 --tasks chat,code,maths,chinese --per-task 12 \
    --json /work/data/E4/heldout-12.json > /work/data/E4.heldout.log 2>&1
  echo done > /work/data/E4.done
fi
