#!/bin/bash
# session 16: this session's engine (confidence-aware auto + less per-round overhead) against main at 32b76a0, alternated; 2-core Xeon
O=${1:-/work/data/s16/ab3}; mkdir -p $O; echo "start $(date +%T)"
S="--tasks code,maths,grounded,chat,creative --draft-lengths auto --prompts-per-task 2 --max-new-tokens 96 --repeats 3 --no-reference"
run() { n=$1-$(basename $2)-$(echo $3 | tr ':/+' '___'); (cd $2 && /work/main/.venv/bin/python -m specdemo bench --draft $3 --backend auto $S --out $O/$n > $O/$n.log 2>&1); echo "$n rc=$? $(date +%T)"; }
H=builtin:smollm2-135m-eagle3
for i in 1 2; do for d in $H+ngram ngram $H; do run r$i /work/main $d; run r$i /tmp/old $d; done; done
echo "end $(date +%T)"
