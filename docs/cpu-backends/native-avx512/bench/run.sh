#!/bin/bash
# Issues 18/19, wave 3 session 10, 2-core AMD EPYC (Zen 4: AVX-512, AVX512-VNNI, AVX512-BF16):
# costs (all backends, llama-bench) and bench with ngram, the shipped head and head + ngram on
# transformers (before) and auto (after), then llama-server plain and ngram-mod on the same
# prompts. One window with the data-generation job stopped (SIGSTOP).
O=${1:-/work/data/bench-s10}; mkdir -p $O
echo "start $(date +%T)"
cd /work/main
(SPECDEMO_BACKEND=recalibrate .venv/bin/python -m specdemo costs --backend auto --llama-bench --max-n 8 --repeats 7 --json > $O/costs-auto.json 2> $O/costs-auto.log); echo "costs rc=$? $(date +%T)"
S="--tasks code,maths,grounded,chat,creative --draft-lengths 4,auto --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --no-reference"
run() { n=$1-$(echo $2 | tr ':/+' '___'); .venv/bin/python -m specdemo bench --draft $2 --backend $1 $S --out $O/$n > $O/$n.log 2>&1; echo "$n rc=$? $(date +%T)"; }
H=builtin:smollm2-135m-eagle3
run auto ngram; run auto $H; run auto $H+ngram
run transformers ngram; run transformers $H
port=8311
for d in none ngram-mod; do
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT setsid nohup .venv/bin/python -m specdemo serve llama.cpp --model builtin:smollm2-135m --draft $d --port $port > $O/server-$d.log 2>&1 &
  port=$((port+1))
done
for i in $(seq 60); do ok=0; for p in 8311 8312; do curl -s 127.0.0.1:$p/health | grep -q ok && ok=$((ok+1)); done; [ $ok = 2 ] && break; sleep 2; done
echo "servers $ok healthy $(date +%T)"
for t in code maths grounded chat creative; do
  .venv/bin/python -m specdemo bench --plain-endpoint http://127.0.0.1:8311 --spec-endpoint http://127.0.0.1:8312 --tasks $t --concurrency 1 --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --out $O/server-ngram-mod-$t > $O/server-ngram-mod-$t.log 2>&1; echo "server ngram-mod $t rc=$? $(date +%T)"
done
pkill -f "specdemo serve llama.cpp --model builtin:smollm2-135m --draft"
echo "end $(date +%T)"
