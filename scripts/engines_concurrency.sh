#!/usr/bin/env bash
# The concurrency figure of docs/engines.md: llama.cpp's llama-server on the built-in model's GGUF,
# plain and with n-gram drafting (--spec-type ngram-mod, the best of its n-gram modes on this
# model: docs/cpu-backends.md), each with 8 slots (--parallel 8, so 8 requests decode at once)
# and 2 threads, raced by `bench --plain-endpoint --spec-endpoint` at 1, 2, 4 and 8 concurrent
# requests. Writes OUT/concurrency.{csv,json,png} and OUT/report.md; every row names the CPU and
# the 1-minute load average at its level's start and end. Needs scripts/setup.sh engines
# (llama-server); stop other work on the machine first.
#
#   scripts/engines_concurrency.sh OUT [bench flags, e.g. --repeats 1 --max-new-tokens 16]
#
# The defaults: --concurrency 1,2,4,8 --tasks grounded,code,chat --max-new-tokens 64 --repeats 3;
# flags given here come after them and win.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/engines_concurrency.sh OUT [bench flags]}
shift
PY=${PYTHON:-.venv/bin/python}
SPEC=${SPEC_DRAFT:-ngram-mod}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
mkdir -p "$OUT"
urls=()
for draft in none "$SPEC"; do
  # llama-server waits at its OpenMP barriers as when run by hand (specdemo's setting is not inherited)
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$PY" -m specdemo serve llama.cpp \
    --model builtin:smollm2-135m --draft "$draft" --port 0 --parallel 8 --threads 2 \
    --ctx-size 8192 > "$OUT/server-$draft.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 120); do
    url=$(grep -o 'ready at http://[0-9.:]*' "$OUT/server-$draft.log" | cut -d' ' -f3 || true)
    [ -n "$url" ] && break
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$OUT/server-$draft.log"; exit 2; }
    sleep 1
  done
  [ -n "$url" ] || { echo "llama-server ($draft) did not start"; cat "$OUT/server-$draft.log"; exit 2; }
  urls+=("$url")
done
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo n/a)"
"$PY" -m specdemo bench --plain-endpoint "${urls[0]}" --spec-endpoint "${urls[1]}" \
  --concurrency 1,2,4,8 --tasks grounded,code,chat --max-new-tokens 64 --repeats 3 \
  --note "servers: serve llama.cpp --parallel 8 --threads 2 --ctx-size 8192, plain and --draft $SPEC" \
  --out "$OUT" "$@"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo n/a)"
