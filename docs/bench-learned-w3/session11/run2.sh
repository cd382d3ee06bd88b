#!/bin/bash
# Issues 18/19, session 11, 2-core AMD EPYC Zen 4 (AVX512-VNNI): costs (auto, llama-bench) and bench
# with ngram, the newly shipped head and head + ngram on auto; nothing else running.
O=${1:-/work/data/bench-s11}; mkdir -p $O; echo "start $(date +%T)"; cd /work/main
(SPECDEMO_BACKEND=recalibrate .venv/bin/python -m specdemo costs --backend auto --llama-bench --max-n 8 --repeats 7 --json > $O/costs-auto.json 2> $O/costs-auto.log); echo "costs rc=$? $(date +%T)"
S="--tasks code,maths,grounded,chat,creative --draft-lengths 4 --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --no-reference"
run() { n=$1-$(echo $2 | tr ':/+' '___'); .venv/bin/python -m specdemo bench --draft $2 --backend $1 $S --out $O/$n > $O/$n.log 2>&1; echo "$n rc=$? $(date +%T)"; }
H=builtin:smollm2-135m-eagle3
run auto $H+ngram; run auto ngram; run auto $H
echo "end $(date +%T)"
