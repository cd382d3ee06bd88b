#!/bin/bash
# Issues 18/19, wave 3 session 5: bench with the native backend (auto) against ggml and
# transformers, ngram / shipped head / new head / new head + ngram; llama-server plain and
# ngram-mod (its best n-gram mode last session) on the same prompts. One quiet window.
cd /work/main; . .venv/bin/activate
O=/work/data/bench21; /work/notes/pause-all.sh; sleep 2
echo "start $(date +%T)"
S="--tasks code,maths,grounded,chat,creative --draft-lengths 4,auto --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --no-reference"
run() { n=$1-$(echo $2 | tr ':/+' '___'); python -m specdemo bench --draft $2 --backend $1 $S --out $O/$n > $O/$n.log 2>&1; echo "$n rc=$? $(date +%T)"; }
for d in ngram builtin:smollm2-135m-eagle3 /work/data/full1-e2 /work/data/full1-e2+ngram; do run auto $d; done
for d in ngram builtin:smollm2-135m-eagle3; do run ggml $d; done
for d in ngram builtin:smollm2-135m-eagle3; do run transformers $d; done
port=8311; rm -f $O/ports.txt
for d in none ngram-mod; do
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT setsid nohup python -m specdemo serve llama.cpp --model builtin:smollm2-135m --draft $d --port $port > $O/server-$d.log 2>&1 &
  echo "$d $port" >> $O/ports.txt; port=$((port+1))
done
for i in $(seq 60); do ok=0; for p in 8311 8312; do curl -s 127.0.0.1:$p/health | grep -q ok && ok=$((ok+1)); done; [ $ok = 2 ] && break; sleep 2; done
echo "servers $ok healthy $(date +%T)"
for t in code maths grounded chat creative; do
  python -m specdemo bench --plain-endpoint http://127.0.0.1:8311 --spec-endpoint http://127.0.0.1:8312 --tasks $t --concurrency 1 --prompts-per-task 2 --max-new-tokens 96 --repeats 1 --out $O/server-ngram-mod-$t > $O/server-ngram-mod-$t.log 2>&1; echo "server ngram-mod $t rc=$? $(date +%T)"
done
pkill -f "specdemo serve llama.cpp --model builtin:smollm2-135m --draft"
/work/notes/resume-all.sh; echo "end $(date +%T)"
