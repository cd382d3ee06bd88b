#!/bin/bash
# Issue 18/19, wave 3 session 9, 2-core AMD EPYC (Zen 3, AVX2, no AVX-512): bench with the
# shipped head and ngram on native-int8 (before) and native-w8a8 (after), explicit backends,
# then auto; llama-server plain and ngram-mod on the same prompts. One quiet window.
O=/work/data/bench-w8a8
echo "start $(date +%T)"
S="--tasks code,maths,grounded,chat,creative --draft-lengths 4,auto --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --no-reference"
run() { n=$1-$(echo $2 | tr ':/+' '___'); (cd /work/main && /work/main/.venv/bin/python -m specdemo bench --draft $2 --backend $1 $S --out $O/$n > $O/$n.log 2>&1); echo "$n rc=$? $(date +%T)"; }
H=builtin:smollm2-135m-eagle3
run native-w8a8 ngram; run native-w8a8 $H; run native-w8a8 $H+ngram
run native-int8 ngram; run native-int8 $H
(cd /work/main && SPECDEMO_BACKEND=recalibrate .venv/bin/python -m specdemo costs --backend auto --llama-bench --max-n 8 --repeats 7 --json > $O/costs-auto.json 2> $O/costs-auto.log); echo "costs rc=$? $(date +%T)"
cd /work/main; . .venv/bin/activate
port=8311
for d in none ngram-mod; do
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT setsid nohup python -m specdemo serve llama.cpp --model builtin:smollm2-135m --draft $d --port $port > $O/server-$d.log 2>&1 &
  port=$((port+1))
done
for i in $(seq 60); do ok=0; for p in 8311 8312; do curl -s 127.0.0.1:$p/health | grep -q ok && ok=$((ok+1)); done; [ $ok = 2 ] && break; sleep 2; done
echo "servers $ok healthy $(date +%T)"
for t in code maths grounded chat creative; do
  python -m specdemo bench --plain-endpoint http://127.0.0.1:8311 --spec-endpoint http://127.0.0.1:8312 --tasks $t --concurrency 1 --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --out $O/server-ngram-mod-$t > $O/server-ngram-mod-$t.log 2>&1; echo "server ngram-mod $t rc=$? $(date +%T)"
done
pkill -f "specdemo serve llama.cpp --model builtin:smollm2-135m --draft"
echo "end $(date +%T)"
