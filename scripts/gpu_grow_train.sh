#!/usr/bin/env bash
# The drafter's GPU run: answers at large batch, then an EAGLE-3 head trained on every answer,
# in at most 9 minutes on one NVIDIA GPU; what it makes lands in $OUT for the caller to collect.
#
#   scripts/gpu_grow_train.sh                # on the GPU machine, from the repository root
#   scripts/gpu_grow_train.sh --cpu-dry-run  # the same steps on the CPU with tiny sizes: the plumbing
#
# Steps (each with its own time limit; a failed step does not stop the next; scripts/_steps.sh runs them):
#   1. environment: Python, torch and its CUDA, the GPU;
#   2. answers: scripts/grow_data.py answers on the GPU (transformers' batched generate, 512
#      sequences at once, float32) for 3.5 minutes (ANSWER_MIN), over the prompts no shard holds, in an
#      order seeded apart from the CPU job's (--seed 1), packed into new shards in a copy of the
#      committed ones (the tree is not changed) and copied to $OUT/shards (bring them home with `python scripts/grow_data.py import DIR`, which skips
#      answers the committed shards already hold, then commit);
#   3. training: train-draft --online-features from the shipped head (builtin:smollm2-135m-eagle3),
#      on every committed and new answer (shipped prompt set + prompts at scale), bfloat16, the
#      learning-rate schedule fitted to 2.5 minutes (TRAIN_MIN), then a held-out report on 12 prompts; the head lands in $OUT/head.
# Everything goes to $OUT/gpu_grow_train.txt ($OUT unset: ./gpu-grow-out/); exit status 0 when
# every step passed. Held-out figures of the head are taken afterwards, on any machine, by
# scripts/heldout_acceptance.py (float32 reference) so they compare with the shipped head's.
set -u
cd "$(dirname "$0")/.."

source scripts/_steps.sh
steps_begin ./gpu-grow-out gpu_grow_train.txt "$@"
mkdir -p "$OUTDIR/shards"

if [[ $DRY -eq 1 ]]; then
  DEVICE=cpu; ANSWER_MIN=1; SLOTS=8; CHUNK=16; TRAIN_MIN=0.3; EXTRA=(--max-steps 4 --max-prompts 400 --report-prompts 0); MAXTOK=32; DTYPE=float32
  BATCH_TOKENS=1024
else
  DEVICE=cuda; ANSWER_MIN=3.5; SLOTS=512; CHUNK=20000; TRAIN_MIN=2.5; EXTRA=(--report-prompts 12); BATCH_TOKENS=16384; MAXTOK=384; DTYPE=bfloat16
fi
log "mode: $([[ $DRY -eq 1 ]] && echo 'CPU dry run (tiny sizes; plumbing only)' || echo 'GPU')"
log "date: $(date -u +%FT%TZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$REPORT" 2>&1
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), '| transformers', transformers.__version__)" >> "$REPORT" 2>&1

WORK="$OUTDIR/work-answers"  # a copy of the committed shards: the tree itself is not changed
rm -rf "$WORK"; cp -r assets/train/answers "$WORK"
before=$(ls "$WORK" | sort)
run $(( 60 * ${ANSWER_MIN%.*} + 120 )) "answers" $PY scripts/grow_data.py answers --backend transformers \
  --device "$DEVICE" --slots "$SLOTS" --chunk "$CHUNK" --chunk-minutes "$ANSWER_MIN" --minutes "$ANSWER_MIN" \
  --seed 1 --shards "$WORK" --max-tokens "$MAXTOK"
for f in $(ls "$WORK" | sort); do
  grep -qxF "$f" <<< "$before" || cp "$WORK/$f" "$OUTDIR/shards/"
done
log "new shards: $(ls "$OUTDIR/shards" | tr '\n' ' ')"

run $(( 60 * ${TRAIN_MIN%.*} + 240 )) "train" $PY -m specdemo train-draft --target builtin:smollm2-135m \
  --out "$OUTDIR/head" --kind eagle3 --scale-prompts --answers-dir "$WORK" \
  --answers-per-prompt 1 --max-tokens "$MAXTOK" --generate-minutes 0 --init builtin:smollm2-135m-eagle3 \
  --online-features --train-dtype "$DTYPE" --device "$DEVICE" --epochs 2 --train-minutes "$TRAIN_MIN" \
  --batch-tokens "$BATCH_TOKENS" "${EXTRA[@]}"
rm -rf "$WORK" "$OUTDIR/head/checkpoint.pt" "$OUTDIR/head/answers.jsonl"  # large; the head and its reports stay

steps_summary
grep -E "^answers: .*tokens/s" "$REPORT" | tail -3 | tee -a "$REPORT" > /dev/null
steps_exit
