#!/bin/bash
# after E3's training and report: held-out E3, then quiet costs and bench (nothing else running)
while [ ! -f /work/data/E3.done ]; do sleep 10; done
cd /work/main; O=/work/data/s14; mkdir -p $O
echo "heldout start $(date +%T)"
.venv/bin/python scripts/heldout_tasks.py /work/data/E3 --tasks chat,code,maths,chinese --per-task 12 --json $O/heldout-E3-12-per-task.json > $O/heldout.log 2>&1
echo "costs start $(date +%T)"
SPECDEMO_BACKEND=recalibrate .venv/bin/python -m specdemo costs --backend auto --llama-bench --max-n 8 --repeats 7 --json > $O/costs-auto.json 2> $O/costs-auto.err
SPECDEMO_NATIVE_PREFETCH=wide .venv/bin/python -m specdemo costs --backend native-w8a8 --max-n 8 --repeats 7 --json > $O/costs-w8a8-wide.json 2>/dev/null
.venv/bin/python -m specdemo costs --backend native-w8a8 --max-n 8 --repeats 7 --json > $O/costs-w8a8-chosen.json 2>/dev/null
echo "bench start $(date +%T)"
K=auto /work/data/bench.sh $O/bench
echo "all done $(date +%T)"
