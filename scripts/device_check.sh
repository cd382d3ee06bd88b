#!/usr/bin/env bash
# The accelerator check (issues 18, 21 and 50): one command, about 5 minutes on an NVIDIA GPU.
#
#   scripts/device_check.sh                # on the GPU machine, from the repository root
#   scripts/device_check.sh --cpu-dry-run  # the same steps on the CPU, shortened: tests the plumbing
#
# Steps, each with its own time limit, none stopping the others (scripts/_steps.sh runs them; the
# measuring ones are subcommands of scripts/device_check.py, which append JSON records as they go,
# so a step cut by its limit keeps what it measured); nothing imports gradio (the GPU machine has
# none):
#   1. environment: the commit, the GPU and its driver, torch, transformers, bitsandbytes; when
#      torch/transformers are missing, pip install -r requirements.txt -r requirements-dev.txt;
#   2. the suite's CUDA tests (pytest -m cuda: greedy speculative == plain greedy in float32 with
#      every drafter family, seeded sampling, the bfloat16 Gemma 4 assistant, the cuda-graphs
#      backend's captured graphs);
#   3. races (our compare) of the built-in model with the shipped EAGLE-3 head (k=4, auto, the
#      default tree; stacked with prompt lookup, auto: the app's default), ngram and self, in
#      float32 and bfloat16, on a chat, a code, a Chinese and a copying prompt;
#   4. costs (forward time per width 1-16);
#   5. the reference lane: transformers' generate() on the same GPU, plain, prompt lookup and
#      the target assisting itself, in float32 and bfloat16;
#   6. plain decoding: ours (transformers backend, cuda-graphs) against generate() with a
#      dynamic and a static cache; races on the cuda-graphs backend;
#   7. a 4-bit bitsandbytes target, if bitsandbytes loads;
#   8. the CPU's projection: the default, eagle3 k=4 and ngram races on this machine's CPU
#      (float32, --backend auto), to set the page's projection beside the GPU's speedups.
# The log is $OUT/device_check.txt ($OUT unset: ./device-check-out/); the results file, one
# record per (kind, engine or backend, drafter, dtype, prompt) with the environment, the tests'
# outcome, the costs and each speedup beside its projection, is $OUT/device_check.json (copy it
# to docs/results/); the exit status is 0 when every step passed.
set -u
cd "$(dirname "$0")/.."

source scripts/_steps.sh
steps_begin ./device-check-out device_check.txt "$@"
STEP_BUDGET_S=300  # the whole check stays near 5 minutes: each step gets at most what is left
STEP_SCALE=1       # a dry run on a (busy) CPU gets 6x the time per step and a 40-minute budget
if [[ $DRY -eq 1 ]]; then STEP_BUDGET_S=2400; STEP_SCALE=6; fi
STEP_TIMEOUT_NOTE="(its records so far are kept)"

section "environment"
log "mode: $([[ $DRY -eq 1 ]] && echo 'CPU dry run (plumbing only; no GPU figures)' || echo 'accelerator')"
log "date: $(date -u +%FT%TZ)  repo: $(git rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')"
log "python: $($PY --version 2>&1)"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$REPORT" 2>&1
else
  log "nvidia-smi: not found"
fi

if ! $PY -c "import torch, transformers, accelerate, pytest" 2> /dev/null; then
  section "installing requirements (torch, transformers, accelerate or pytest missing)"
  if ! timeout 240 $PY -m pip install -q --disable-pip-version-check -r requirements.txt \
      -r requirements-dev.txt >> "$REPORT" 2>&1; then
    log "pip install of the requirements failed as a whole; trying one package at a time"
    for req in $(grep -hv '^\s*#' requirements.txt requirements-dev.txt | sed 's/#.*//' | awk '{print $1}'); do
      [[ -z "$req" ]] && continue
      if ! timeout 120 $PY -m pip install -q --disable-pip-version-check "$req" >> "$REPORT" 2>&1; then
        log "could not install: $req"
        SUMMARY+=("could not install: $req")
      fi
    done
  fi
fi

RECORDS="$OUTDIR/records.jsonl"
JUNIT="$OUTDIR/cuda-tests.xml"
COSTS="$OUTDIR/costs.json"
RESULTS="$OUTDIR/device_check.json"
rm -f "$RECORDS" "$JUNIT" "$COSTS" "$RESULTS"
CHECK=(env PYTHONUNBUFFERED=1 "$PY" scripts/device_check.py)

# prompts per step: every drafter meets every prompt on a GPU; a dry run covers each prompt
# and each drafter in both dtypes with half the pairs (the plumbing is the same)
if [[ $DRY -eq 1 ]]; then
  DEVICE=cpu; TOKENS=8; COSTS_ARGS=(--max-n 2 --repeats 1 --context 16)
  F32=(--prompts chat,chinese); BF16=(--prompts code,copying); REF=(--prompts chat)
  GRAPHS=(--prompts copying --drafters "eagle3 tree,ngram,self")
else
  DEVICE=cuda; TOKENS=128; COSTS_ARGS=(--max-n 16 --repeats 5)
  F32=(); BF16=(); REF=(); GRAPHS=(--prompts chat,copying)
  if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; then
    log "CUDA is not available here: the device steps below will fail (use --cpu-dry-run on a CPU)"
    SUMMARY+=("CUDA: not available")
  fi
fi
COMMON=(--out "$RECORDS" --device "$DEVICE" --tokens "$TOKENS")

# 1. the environment as a record: commit, GPU, driver, torch, transformers, bitsandbytes
run 30 "env" "${CHECK[@]}" env --out "$RECORDS"

# 2. the CUDA tests (skipped without a GPU: the dry run checks that they are collected)
run 90 "pytest -m cuda" $PY -m pytest -q -rA -p no:cacheprovider -m cuda --junitxml="$JUNIT" \
  tests/test_accelerator_paths.py tests/test_cuda_graph_backend.py

# 3. races: every drafter on every prompt, float32 then bfloat16 (transformers: auto's choice off the CPU)
run 75 "races float32" "${CHECK[@]}" races "${COMMON[@]}" --dtype float32 "${F32[@]}"
run 75 "races bfloat16" "${CHECK[@]}" races "${COMMON[@]}" --dtype bfloat16 "${BF16[@]}"

# 4. costs: forward time per width
run 40 "costs" bash -c "$PY -m specdemo costs --target builtin:smollm2-135m --device $DEVICE \
  ${COSTS_ARGS[*]} --json > $COSTS && cat $COSTS"

# 5. the reference lane: transformers' generate() on the same device
run 60 "reference" bash -c "${CHECK[*]} reference ${COMMON[*]} --dtype bfloat16 ${REF[*]} && \
  ${CHECK[*]} reference ${COMMON[*]} --dtype float32 ${REF[*]}"

# 6. plain decoding against generate() with a static cache; races on the cuda-graphs backend
run 90 "plain vs static cache" bash -c "${CHECK[*]} plain ${COMMON[*]} --dtype bfloat16 --prompts chat && \
  ${CHECK[*]} plain ${COMMON[*]} --dtype float32 --prompts chat"
run 45 "races cuda-graphs" "${CHECK[@]}" races "${COMMON[@]}" --dtype bfloat16 \
  --backend cuda-graphs "${GRAPHS[@]}"

# 7. a 4-bit bitsandbytes target, if bitsandbytes loads here
run 40 "bitsandbytes 4-bit" "${CHECK[@]}" bnb4 "${COMMON[@]}"

# 8. the CPU's projection for the same races (the page's line on a CPU), last: the GPU's first
run 60 "races on the CPU" "${CHECK[@]}" races --out "$RECORDS" --device cpu --tokens "$TOKENS" \
  --dtype float32 --backend auto --prompts chat,copying --drafters "default,eagle3 k=4,ngram"

# summary: one results file, and its figures in a few lines at the end of the report
steps_summary
"$PY" scripts/device_check.py summary --records "$RECORDS" --junit "$JUNIT" --costs "$COSTS" \
  --mode "$([[ $DRY -eq 1 ]] && echo cpu-dry-run || echo accelerator)" --steps "${SUMMARY[@]}" \
  --out "$RESULTS" 2>&1 | tee -a "$REPORT"
log "total: $(( $(date +%s) - START )) s; report: $REPORT; results: $RESULTS"
steps_exit
