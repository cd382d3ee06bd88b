#!/bin/bash
# session 14, 2-core Intel Xeon (model 207, AVX-512 VNNI/BF16/FP16, no AMX shown): the shipped E2 head against E3
O=${1:-/work/data/bench-s14}; mkdir -p $O; echo "start $(date +%T)"; cd /work/main
S="--tasks code,maths,grounded,chat,creative --draft-lengths ${K:-4,auto} --prompts-per-task 2 --max-new-tokens 96 --repeats 3 --no-reference"
run() { n=$1-$(echo $2 | tr ':/+' '___'); .venv/bin/python -m specdemo bench --draft $2 --backend $1 $S --out $O/$n > $O/$n.log 2>&1; echo "$n rc=$? $(date +%T)"; }
OLD=builtin:smollm2-135m-eagle3; NEW=${NEW:-/work/data/E3}
run auto $OLD+ngram; run auto ngram; run auto $OLD; run auto $NEW+ngram; run auto $NEW
echo "end $(date +%T)"
