#!/bin/bash
# session 16: confidence-aware draft length (auto) on and off, alternated; 2-core Xeon
O=${1:-/work/data/s16/ab}; mkdir -p $O; echo "start $(date +%T)"; cd /work/main
S="--tasks ${TASKS:-code,maths,grounded,chat,creative} --draft-lengths auto --prompts-per-task 2 --max-new-tokens 96 --repeats ${R:-3} --no-reference"
run() { n=$1-$2-$(echo $3 | tr ':/+' '___'); SPECDEMO_DRAFT_CONFIDENCE=$2 .venv/bin/python -m specdemo bench --draft $3 --backend auto $S --out $O/$n > $O/$n.log 2>&1; echo "$n rc=$? $(date +%T)"; }
H=builtin:smollm2-135m-eagle3
for i in ${ROUNDS:-1 2}; do run r$i 1 $H+ngram; run r$i 0 $H+ngram; run r$i 1 $H; run r$i 0 $H; done
echo "end $(date +%T)"
