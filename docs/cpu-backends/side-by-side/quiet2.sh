#!/bin/bash
# Issue 18, second quiet window: llama-server lanes (started with a clean OpenMP environment),
# the before run again, and the ggml-bf16 backend.
cd /work/main; . .venv/bin/activate; unset OMP_WAIT_POLICY GOMP_SPINCOUNT
O=/work/data/bench18; /work/notes/pause-all.sh; sleep 2
echo "start $(date +%T)"
rm -f $O/ports.txt; port=8201
for d in none ngram-simple ngram-map-k ngram-map-k4v ngram-mod ngram-cache; do
  setsid nohup python -m specdemo serve llama.cpp --model builtin:smollm2-135m --draft $d --port $port > $O/server-$d.log 2>&1 &
  echo "$d $port" >> $O/ports.txt
  for i in $(seq 60); do curl -s 127.0.0.1:$port/health | grep -q ok && break; sleep 1; done
  port=$((port+1))
done
for p in $(pgrep llama-server); do echo "server $p env: $(tr '\0' '\n' < /proc/$p/environ | grep -c OMP_WAIT)"; done
echo "servers up $(date +%T)"
for t in code maths grounded chat creative; do for p in 8202 8203 8204 8205 8206; do
  d=$(awk -v p=$p '$2==p{print $1}' $O/ports.txt)
  python -m specdemo bench --plain-endpoint http://127.0.0.1:8201 --spec-endpoint http://127.0.0.1:$p --tasks $t --concurrency 1 --prompts-per-task 2 --max-new-tokens 96 --repeats 2 --out $O/server-$d-$t > $O/server-$d-$t.log 2>&1; echo "server $d $t rc=$? $(date +%T)"
done; done
pkill -f "specdemo serve llama.cpp --model builtin:smollm2-135m --draft"; sleep 2
S="--tasks code,maths,grounded,chat,creative --draft-lengths auto --prompts-per-task 2 --max-new-tokens 96 --repeats 2 --no-reference"
for d in ngram builtin:smollm2-135m-eagle3; do for b in transformers ggml-bf16; do
  n=$(echo $d | tr ':' '_')-$b
  python -m specdemo bench --draft $d --backend $b $S --out $O/$n > $O/$n.log 2>&1; echo "$n rc=$? $(date +%T)"
done; done
for t in Q4_1 BF16; do b=ggml; [ $t = BF16 ] && b=ggml-bf16
  python -m specdemo costs --backend $b --max-n 16 --llama-bench --json > $O/costs-$b.json 2>/dev/null; echo "costs $b rc=$? $(date +%T)"; done
/work/notes/resume-all.sh; echo "end $(date +%T)"
