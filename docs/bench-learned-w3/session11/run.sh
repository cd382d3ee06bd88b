#!/bin/bash
# Issues 18/19, wave 3 session 11, 2-core AMD EPYC (Zen 4: AVX-512, AVX512-VNNI, AVX512-BF16):
# costs (auto, llama-bench) and bench with ngram, the shipped head, the new head and new head +
# ngram on auto (native-w8a8), then the held-out everyday-chat phrasings. One window, nothing
# else running (the training job had finished).
# Usage: run.sh NEW_HEAD_DIR [OUT]
NEW=$1; O=${2:-/work/data/bench-s11}; mkdir -p $O
echo "start $(date +%T) new=$NEW"
cd /work/main
(SPECDEMO_BACKEND=recalibrate .venv/bin/python -m specdemo costs --backend auto --llama-bench --max-n 8 --repeats 7 --json > $O/costs-auto.json 2> $O/costs-auto.log); echo "costs rc=$? $(date +%T)"
S="--tasks code,maths,grounded,chat,creative --draft-lengths 4,auto --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --no-reference"
run() { n=$1-$(echo $2 | tr ':/+' '___'); .venv/bin/python -m specdemo bench --draft $2 --backend $1 $S --out $O/$n > $O/$n.log 2>&1; echo "$n rc=$? $(date +%T)"; }
H=builtin:smollm2-135m-eagle3
run auto ngram; run auto $H; run auto $H+ngram; run auto $NEW; run auto $NEW+ngram
.venv/bin/python scripts/heldout_phrasings.py $H $NEW > $O/heldout_phrasings.txt 2>&1; echo "phrasings rc=$? $(date +%T)"
echo "end $(date +%T)"
