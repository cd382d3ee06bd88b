#!/bin/bash
# Issue 18: bench before (transformers) / after (auto) with ngram and the shipped head, and
# llama-server plain vs each of its n-gram drafts on the same prompts, one quiet window.
cd /work/main; . .venv/bin/activate; unset OMP_WAIT_POLICY GOMP_SPINCOUNT
O=/work/data/bench18; /work/notes/pause-all.sh; sleep 2
echo "start $(date +%T)"
S="--tasks code,maths,grounded,chat,creative --draft-lengths auto --prompts-per-task 2 --max-new-tokens 96 --repeats 2 --no-reference"
for d in ngram builtin:smollm2-135m-eagle3; do for b in transformers auto; do
  n=$(echo $d | tr ':' '_')-$b
  python -m specdemo bench --draft $d --backend $b $S --out $O/$n > $O/$n.log 2>&1; echo "$n rc=$? $(date +%T)"
done; done
rm -f $O/ports.txt; $O/servers.sh
for i in $(seq 60); do ok=0; for p in 8201 8202 8203 8204 8205 8206; do curl -s 127.0.0.1:$p/health | grep -q ok && ok=$((ok+1)); done; [ $ok = 6 ] && break; sleep 2; done
echo "servers $ok healthy $(date +%T)"
for t in code maths grounded chat creative; do for p in 8202 8203 8204 8205 8206; do
  d=$(awk -v p=$p '$2==p{print $1}' $O/ports.txt)
  python -m specdemo bench --plain-endpoint http://127.0.0.1:8201 --spec-endpoint http://127.0.0.1:$p --tasks $t --concurrency 1 --prompts-per-task 2 --max-new-tokens 96 --repeats 2 --out $O/server-$d-$t > $O/server-$d-$t.log 2>&1; echo "server $d $t rc=$? $(date +%T)"
done; done
pkill -f "specdemo serve llama.cpp --model builtin:smollm2-135m --draft"
/work/notes/resume-all.sh; echo "end $(date +%T)"
