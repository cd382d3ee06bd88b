#!/bin/bash
# Issue 19, wave 3 session 7: bench on native (auto): ngram / shipped head / new head / new head + ngram.
# Usage: run.sh NEW_HEAD_DIR ; one quiet window (background jobs paused).
cd /work/main; . .venv/bin/activate
NEW=$1; O=/work/data/bench23; /work/notes/pause-all.sh; sleep 2
echo "start $(date +%T) new=$NEW"
S="--tasks code,maths,grounded,chat,creative --draft-lengths 4,auto --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --no-reference"
run() { n=$1-$(echo $2 | tr ':/+' '___'); python -m specdemo bench --draft $2 --backend $1 $S --out $O/$n > $O/$n.log 2>&1; echo "$n rc=$? $(date +%T)"; }
for d in ngram builtin:smollm2-135m-eagle3 $NEW $NEW+ngram; do run auto $d; done
/work/notes/resume-all.sh; echo "end $(date +%T)"
