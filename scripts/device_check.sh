#!/usr/bin/env bash
# The accelerator check (issues 18 and 21): one command, under 8 minutes on an NVIDIA GPU machine.
#
#   scripts/device_check.sh                # on the GPU machine, from the repository root
#   scripts/device_check.sh --cpu-dry-run  # the same steps on the CPU, shortened: tests the plumbing
#
# Steps, each with its own time limit, none stopping the others:
#   1. environment: Python, torch and its CUDA, nvidia-smi; when torch/transformers are missing,
#      pip install -r requirements.txt -r requirements-dev.txt (says what could not be installed:
#      the machine may have no PyPI);
#   2. the suite's CUDA tests (pytest -m cuda: greedy speculative == plain greedy in float32 with
#      every drafter family, seeded sampling with each drafter, the bfloat16 Gemma 4 assistant),
#      then the accelerator-path tests that run anywhere;
#   3. compare with the built-in model and the shipped EAGLE-3 drafter on the device, float32 and
#      the device's default dtype (bfloat16 on CUDA);
#   4. costs (forward time per width) of the built-in model on the device.
# Everything goes to one file, $OUT/device_check.txt ($OUT unset: ./device-check-out/), with a
# summary of the figures at its end; the exit status is 0 when every step passed.
set -u
cd "$(dirname "$0")/.."

DRY=0
if [[ "${1:-}" == "--cpu-dry-run" ]]; then DRY=1; elif [[ -n "${1:-}" ]]; then
  echo "usage: $0 [--cpu-dry-run]" >&2; exit 2
fi
OUTDIR="${OUT:-./device-check-out}"
mkdir -p "$OUTDIR"
REPORT="$OUTDIR/device_check.txt"
PY="${PYTHON:-python3}"
START=$(date +%s)
: > "$REPORT"
declare -a SUMMARY=()

log() { echo "$*" | tee -a "$REPORT"; }
section() { log ""; log "=== $* ($(( $(date +%s) - START )) s in)"; }
# run LIMIT NAME CMD...: run with a time limit, output into the report, status into the summary
BUDGET_S=470  # the whole check stays under 8 minutes: each step gets at most what is left
SCALE=1       # a dry run on a (busy) CPU gets 4x the time per step and a 30-minute budget
if [[ $DRY -eq 1 ]]; then BUDGET_S=1800; SCALE=4; fi
run() {
  local limit=$(( $1 * SCALE )) name=$2; shift 2
  local left=$(( BUDGET_S - ($(date +%s) - START) ))
  if (( left < 20 )); then
    log "--- $name: SKIPPED (the 8-minute budget is spent)"; SUMMARY+=("$name: SKIPPED (budget spent)")
    return 1
  fi
  (( limit > left )) && limit=$left
  section "$name: $*"
  timeout "$limit" "$@" >> "$REPORT" 2>&1
  local rc=$?
  local verdict="ok"
  [[ $rc -eq 124 ]] && verdict="TIMED OUT after ${limit} s"
  [[ $rc -ne 0 && $rc -ne 124 ]] && verdict="FAILED (exit $rc)"
  log "--- $name: $verdict"
  SUMMARY+=("$name: $verdict")
  return $rc
}

section "environment"
log "mode: $([[ $DRY -eq 1 ]] && echo 'CPU dry run (plumbing only; no GPU figures)' || echo 'accelerator')"
log "date: $(date -u +%FT%TZ)  host: $(hostname)  repo: $(git rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')"
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
$PY - >> "$REPORT" 2>&1 <<'EOF'
import importlib
for name in ("torch", "transformers", "accelerate", "safetensors", "gguf", "psutil", "pytest", "bitsandbytes"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except Exception as exc:
        print(f"{name}: not importable ({type(exc).__name__}: {exc})")
try:
    import torch
    print(f"cuda available: {torch.cuda.is_available()}; torch built for CUDA {torch.version.cuda}")
    if torch.cuda.is_available():
        print(f"device: {torch.cuda.get_device_name(0)}, "
              f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB, "
              f"bf16 supported: {torch.cuda.is_bf16_supported()}")
except Exception as exc:
    print(f"torch: {exc}")
EOF

if [[ $DRY -eq 1 ]]; then
  DEVICE=cpu; TOKENS=8; COSTS_ARGS=(--max-n 2 --repeats 1 --context 16)
else
  DEVICE=cuda; TOKENS=128; COSTS_ARGS=(--max-n 16 --repeats 5)
  if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; then
    log "CUDA is not available here: the device steps below will fail (use --cpu-dry-run on a CPU)"
    SUMMARY+=("CUDA: not available")
  fi
fi

# 2. tests: the CUDA ones (skipped without a GPU), then the accelerator paths that run anywhere
run 240 "pytest -m cuda" $PY -m pytest -q -rA -p no:cacheprovider -m cuda tests/test_accelerator_paths.py
if [[ $DRY -eq 0 ]]; then
  run 150 "pytest accelerator paths" $PY -m pytest -q -p no:cacheprovider -m "not slow" \
    tests/test_accelerator_paths.py tests/test_engine.py
fi

# 3. compare: the built-in model with the shipped drafter, on the device
PROMPT="Explain in three sentences why the sky is blue, then repeat the explanation word for word."
for DTYPE in float32 auto; do
  [[ $DRY -eq 1 && $DTYPE == auto ]] && continue  # auto is float32 on the CPU
  run 150 "compare $DTYPE" $PY -m specdemo compare --target builtin:smollm2-135m \
    --draft builtin:smollm2-135m-eagle3 --device "$DEVICE" --dtype "$DTYPE" \
    --max-new-tokens "$TOKENS" --draft-length 4 --json --prompt "$PROMPT"
done

# 4. costs: forward time per width
run 120 "costs" $PY -m specdemo costs --target builtin:smollm2-135m --device "$DEVICE" \
  "${COSTS_ARGS[@]}" --json

# summary: the figures, read back from the JSON lines in the report
section "summary"
for line in "${SUMMARY[@]}"; do log "$line"; done
$PY - "$REPORT" <<'EOF' | tee -a "$REPORT"
import json, sys
label = None
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    if line.startswith("=== "):
        label = line[4:].split(":")[0]
    line = line.strip()
    if not line.startswith("{"):
        continue
    try:
        data = json.loads(line)
    except ValueError:
        continue
    if "speculative" in data:
        p, s = data["plain"], data["speculative"]
        print(f"{label}: plain {p.get('tokens_per_s')} tokens/s, speculative {s.get('tokens_per_s')} "
              f"tokens/s, speedup {data.get('speedup')}, identical {data.get('identical')}, "
              f"acceptance_rate {s.get('acceptance_rate')}, "
              f"offloaded_layers {len(data.get('offloaded_layers') or {})}")
    else:
        keys = [k for k in data if "tokens_per_s" in k or k in ("device", "dtype", "backend", "forward_s", "forward_ratio", "bandwidth_GBps", "plain_vs_bound")]
        print(f"{label}: " + ", ".join(f"{k} {data[k]}" for k in keys))
EOF
log "total: $(( $(date +%s) - START )) s; report: $REPORT"
for line in "${SUMMARY[@]}"; do [[ $line == *": ok" ]] || exit 1; done
exit 0
