#!/usr/bin/env bash
# The CPU-backend figures of docs/cpu-backends.md in one window on this machine:
#   1. costs: every backend available for the built-in model, and llama.cpp's llama-bench
#      (SPECDEMO_BACKEND=recalibrate: auto measures again and stores its choice);
#   2. bench on --backend auto (what auto chose) with prompt lookup, the shipped EAGLE-3 head and
#      the head with prompt lookup stacked over it (the default preset's drafter);
#   3. with --servers: llama.cpp's llama-server, plain against --spec-type ngram-mod, on the same
#      prompts (needs scripts/setup.sh engines).
# Every run writes under OUT (default: bench-out/cpu-backends, ignored by git). Stop other work
# on the machine first: the figures are this machine's only when nothing else runs.
#
#   scripts/bench_cpu_backends.sh [OUT] [--servers] [--repeats N]
#
# Then: python scripts/bench_table.py OUT  (one markdown table of every bench folder under OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=bench-out/cpu-backends SERVERS=0 REPEATS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --servers) SERVERS=1 ;;
    --repeats) REPEATS="$2"; shift ;;
    *) OUT="$1" ;;
  esac
  shift
done
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
echo "costs $(date +%T)"
SPECDEMO_BACKEND=recalibrate "$PY" -m specdemo costs --target builtin:smollm2-135m --backend auto \
  --llama-bench --max-n 8 --repeats 7 --json > "$OUT/costs-auto.json"
TASKS="--tasks code,maths,grounded,chat,creative --prompts-per-task 2 --max-new-tokens 96"
HEAD=builtin:smollm2-135m-eagle3
for draft in ngram "$HEAD" "$HEAD+ngram"; do
  name=auto-$(echo "$draft" | tr ':/+' '___')
  echo "bench $draft $(date +%T)"
  "$PY" -m specdemo bench --target builtin:smollm2-135m --draft "$draft" --backend auto $TASKS \
    --draft-lengths 4,auto --repeats "$REPEATS" --no-reference --out "$OUT/$name" > "$OUT/$name.log" 2>&1
done
if [ "$SERVERS" = 1 ]; then
  pids=()
  port=8311
  for d in none ngram-mod; do
    # llama-server waits at its OpenMP barriers as when run by hand (specdemo's setting is not inherited)
    env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$PY" -m specdemo serve llama.cpp \
      --model builtin:smollm2-135m --draft "$d" --port "$port" > "$OUT/server-$d.log" 2>&1 &
    pids+=($!)
    port=$((port + 1))
  done
  trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
  for _ in $(seq 60); do
    curl -sf http://127.0.0.1:8311/health > /dev/null && curl -sf http://127.0.0.1:8312/health > /dev/null && break
    sleep 2
  done
  for t in code maths grounded chat creative; do
    echo "llama-server ngram-mod $t $(date +%T)"
    "$PY" -m specdemo bench --plain-endpoint http://127.0.0.1:8311 --spec-endpoint http://127.0.0.1:8312 \
      --tasks "$t" --concurrency 1 --prompts-per-task 2 --max-new-tokens 96 --repeats "$REPEATS" \
      --out "$OUT/server-ngram-mod-$t" > "$OUT/server-ngram-mod-$t.log" 2>&1
  done
fi
echo "done $(date +%T): $OUT"
