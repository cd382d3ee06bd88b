#!/bin/bash
# session 13, 2-core AMD EPYC family 25 model 17 (Zen 4) with AVX-512 hidden: AVX2 + FMA only, 2.6 GHz
O=${1:-/work/data/bench-s13}; mkdir -p $O; echo "start $(date +%T)"; cd /work/main
S="--tasks code,maths,grounded,chat,creative --draft-lengths 4 --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --no-reference"
run() { n=$1-$(echo $2 | tr ':/+' '___'); .venv/bin/python -m specdemo bench --draft $2 --backend $1 $S --out $O/$n > $O/$n.log 2>&1; echo "$n rc=$? $(date +%T)"; }
H=builtin:smollm2-135m-eagle3
run auto $H+ngram; run auto ngram; run auto $H
echo "end $(date +%T)"
