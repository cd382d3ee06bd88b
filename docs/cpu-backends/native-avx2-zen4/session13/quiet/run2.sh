#!/bin/bash
# session 13, AVX2-only Zen 4 (AVX-512 hidden), 2.6 GHz: quiet costs with llama-bench, then bench at k = 4 and auto
O=${1:-/work/data/bench-s13/q}; mkdir -p $O; echo "start $(date +%T)"; cd /work/main
(SPECDEMO_BACKEND=recalibrate .venv/bin/python -m specdemo costs --backend auto --llama-bench --max-n 8 --repeats 7 --json > $O/costs-auto.json 2> $O/costs-auto.log); echo "costs rc=$? $(date +%T)"
S="--tasks code,maths,grounded,chat,creative --draft-lengths 4,auto --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --no-reference"
run() { n=$1-$(echo $2 | tr ':/+' '___'); .venv/bin/python -m specdemo bench --draft $2 --backend $1 $S --out $O/$n > $O/$n.log 2>&1; echo "$n rc=$? $(date +%T)"; }
H=builtin:smollm2-135m-eagle3
run auto $H+ngram; run auto ngram; run auto $H
echo "end $(date +%T)"
