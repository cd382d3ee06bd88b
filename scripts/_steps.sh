# The step runner of scripts/device_check.sh and scripts/gpu_grow_train.sh: sourced by them, not
# run. A failed or timed-out step does not stop the next; the summary says how each ended.
#
#   steps_begin DEFAULT_OUT REPORT_NAME "$@"
#       the argument: none, or --cpu-dry-run (DRY=1); anything else prints the usage line and
#       exits 2 before anything is written. Sets OUTDIR ($OUT, else DEFAULT_OUT; created),
#       REPORT ($OUTDIR/REPORT_NAME, emptied), PY ($PYTHON, else the set-up's .venv/bin/python
#       when there is one, else python3), START (seconds since the epoch) and SUMMARY (empty).
#   log TEXT...       one line on the terminal and in the report
#   section TEXT...   a blank line and a heading with the seconds since START
#   run LIMIT_S NAME CMD...
#       CMD under a limit of LIMIT_S * STEP_SCALE seconds (STEP_SCALE: 1 unless set), at most
#       what is left of STEP_BUDGET_S (unset: no budget; under 15 s left: the step is SKIPPED),
#       its output into the report, "NAME: verdict" into SUMMARY (a timeout's verdict ends with
#       STEP_TIMEOUT_NOTE when set); returns CMD's exit status.
#   steps_summary     the summary section: one line a step
#   steps_exit        exit 0 when every step was ok, else 1

steps_begin() {
  local default_out=$1 report_name=$2; shift 2
  DRY=0
  if [[ "${1:-}" == "--cpu-dry-run" ]]; then DRY=1; elif [[ -n "${1:-}" ]]; then
    echo "usage: $0 [--cpu-dry-run]" >&2; exit 2
  fi
  OUTDIR="${OUT:-$default_out}"
  mkdir -p "$OUTDIR"
  REPORT="$OUTDIR/$report_name"
  PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
  START=$(date +%s)
  : > "$REPORT"
  SUMMARY=()
}

log() { echo "$*" | tee -a "$REPORT"; }
section() { log ""; log "=== $* ($(( $(date +%s) - START )) s in)"; }

run() {
  local limit=$(( $1 * ${STEP_SCALE:-1} )) name=$2; shift 2
  if [[ -n "${STEP_BUDGET_S:-}" ]]; then
    local left=$(( STEP_BUDGET_S - ($(date +%s) - START) ))
    if (( left < 15 )); then
      log "--- $name: SKIPPED (the ${STEP_BUDGET_S}-second budget is spent)"
      SUMMARY+=("$name: SKIPPED (budget spent)")
      return 1
    fi
    (( limit > left )) && limit=$left
  fi
  section "$name: $*"
  timeout "$limit" "$@" >> "$REPORT" 2>&1
  local rc=$?
  local verdict="ok"
  [[ $rc -eq 124 ]] && verdict="TIMED OUT after ${limit} s${STEP_TIMEOUT_NOTE:+ $STEP_TIMEOUT_NOTE}"
  [[ $rc -ne 0 && $rc -ne 124 ]] && verdict="FAILED (exit $rc)"
  log "--- $name: $verdict"
  SUMMARY+=("$name: $verdict")
  return $rc
}

steps_summary() {
  section "summary"
  local line
  for line in "${SUMMARY[@]}"; do log "$line"; done
}

steps_exit() {
  local line
  for line in "${SUMMARY[@]}"; do [[ $line == *": ok" ]] || exit 1; done
  exit 0
}
