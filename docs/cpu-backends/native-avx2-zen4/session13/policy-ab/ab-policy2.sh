#!/bin/bash
# session 13: head + ngram on auto, before (6bdd833) and after (per-source policy, probe fix, lookup gated as propose), alternated, quiet
O=${1:-/work/data/bench-s13/abpol2}; mkdir -p $O; echo "start $(date +%T)"
S="--tasks code,maths,grounded,chat,creative --draft-lengths auto --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --no-reference --backend auto"
H=builtin:smollm2-135m-eagle3
for r in 1 2 3 4; do for v in old new; do
  d=/work/main; [ $v = old ] && d=/tmp/wt-pol
  n=$v-$r
  (cd $d && PYTHONPATH=$d /work/main/.venv/bin/python -m specdemo bench --draft $H+ngram $S --out $O/$n > $O/$n.log 2>&1); echo "$n rc=$? $(date +%T)"
done; done
echo "end $(date +%T)"
