#!/bin/bash
# A/B: the committed native kernel (/tmp/orig) against the working tree's (NF_V8), interleaved
for round in 1 2 3; do
for side in orig new; do
  dir=/work/main; [ $side = orig ] && dir=/tmp/orig
  out=/work/data/avx2/ab-$side-$round.json
  (cd $dir && /work/main/.venv/bin/python -m specdemo costs --target builtin:smollm2-135m --backend native --max-n 8 --repeats 7 --json > $out 2>/dev/null)
  python3 - $out $side <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); v=d['backends']['native']
print(sys.argv[2], 'plain', round(d['plain_tokens_per_s'],1), 'f1', round(v['forward_s']['1']*1000,1), 'f8', round(v['forward_s']['8']*1000,1), 'ratios', [round(x,2) for x in list(v['forward_ratio'].values())[1:]], 'load', d['load_average'])
PY
done; done
