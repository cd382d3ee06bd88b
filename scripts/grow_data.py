"""Grow the committed drafter-training data: prompts at scale, the target's answers, a benchmark.

    python scripts/grow_data.py prompts  [--follow-ups] [--magpie N] [--minutes M]
    python scripts/grow_data.py answers  [--minutes M] [--chunk-minutes C] [--commit] [--backend w8a8|transformers] ...
    python scripts/grow_data.py import   FOLDER [--commit]
    python scripts/grow_data.py bench    [--slots 16,32,64] [--answers 64] [--json FILE]

``prompts`` appends to assets/train/prompts-scale.jsonl.gz: the seeded prompts
(``prompt_scale.seeded_rows``), with --follow-ups conversations continuing the target's own
greedy answers from the shards, with --magpie N prompts the target writes itself (for at most
--minutes). Every row is admitted only if it is no near-duplicate of a held-out prompt and leans
on no held-out family (``prompt_scale.Admission``).

``answers`` generates the answers no shard holds yet, chunk by chunk (each chunk one new shard
in assets/train/answers; with --commit each shard is committed at once), until --minutes are
spent or nothing is missing. Stopped at any point (Ctrl-C, a machine taken away), a later run on
any machine continues from what is committed.

``import`` re-packs shards generated on another machine (scripts/gpu_grow_train.sh) into new
shards here, leaving out answers the committed shards already hold.

``bench`` measures the answer generator's tokens/s on this machine at several batch widths
(answers of real training prompts, greedy, nothing written to the shards).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdemo.services.training import grow, prompt_scale, shards  # noqa: E402
from specdemo.services.training.split import load_jsonl  # noqa: E402

TARGET = "builtin:smollm2-135m"


def _load(target: str, device: str = "cpu"):
    from specdemo.models import loading
    try:
        return loading.load_model(target, device, "float32")
    except loading.ModelLoadError as exc:
        raise SystemExit(f"error: {exc}")


def _git_commit(paths: list[Path], message: str) -> bool:
    """Commit ``paths`` alone (other changes in the tree are left as they are); False if git refused."""
    root = Path(__file__).resolve().parents[1]
    rel = [str(p.resolve().relative_to(root)) for p in paths]
    add = subprocess.run(["git", "-C", str(root), "add", "--", *rel], capture_output=True, text=True)
    done = add.returncode == 0 and subprocess.run(
        ["git", "-C", str(root), "commit", "-q", "-m", message, "--", *rel], capture_output=True,
        text=True).returncode == 0
    if not done:
        print(f"grow: could not commit {', '.join(rel)} now (left for the next commit)", file=sys.stderr)
    return done


def cmd_prompts(args) -> int:
    base = load_jsonl(prompt_scale.PROMPTS_FILE)
    existing = prompt_scale.load_scale()
    rows = prompt_scale.seeded_rows(args.seed)
    if args.follow_ups or args.magpie:
        target = _load(args.target)
        if args.follow_ups:
            rows += grow.follow_ups_from_shards(target.tokenizer, base, shards.SHARDS_DIR, args.target, seed=args.seed)
        if args.magpie:
            budget = None if args.minutes is None else 60 * args.minutes
            written = grow.magpie_prompts(target, args.magpie, seed=args.seed + len(existing), slots=args.slots,
                                          budget_s=budget)
            rows += grow.dedupe_among(written)
            print(f"prompts: the target wrote {len(written)} prompts", file=sys.stderr)
    kept, reasons = prompt_scale.admit_all(rows, base, existing)
    prompt_scale.append_scale(kept)
    total = len(existing) + len(kept)
    print(f"prompts: {len(kept)} added, {total} in {prompt_scale.SCALE_FILE.name}; refused: {dict(reasons)}")
    if args.commit and kept:
        _git_commit([prompt_scale.SCALE_FILE], f"training prompts at scale: {total} rows")
    return 0


def cmd_answers(args) -> int:
    target = _load(args.target, args.device)
    rows = prompt_scale.training_rows()
    shard_dir = Path(args.shards)
    have, _ = shards.read_all(shard_dir, target=args.target)
    todo = grow.missing(rows, have, args.answers_per_prompt, seed=args.seed)
    temps = tuple(float(t) for t in args.temperatures.split(","))
    print(f"answers: {len(todo)} missing of {args.target}; {len(have)} in {len(shards.shard_paths(shard_dir))} shards",
          file=sys.stderr)
    began = time.perf_counter()
    total_tokens = total_s = 0.0
    while todo:
        left = None if args.minutes is None else 60 * args.minutes - (time.perf_counter() - began)
        if left is not None and left < 10:  # no chunk starts in the last seconds
            break
        budget = 60 * args.chunk_minutes if left is None else min(60 * args.chunk_minutes, left)
        chunk, todo = todo[:args.chunk], todo[args.chunk:]
        result = grow.answer_chunk(target, rows, chunk, shard_dir, max_new_tokens=args.max_tokens,
                                   temperatures=temps, backend=args.backend, slots=args.slots, budget_s=budget,
                                   target_name=args.target)
        total_tokens += result.answer_tokens
        total_s += result.seconds
        print(f"answers: {result.answers} answers, {result.answer_tokens} tokens in {result.seconds:.0f} s "
              f"({result.tokens_per_s:.0f} tokens/s) -> {result.shard.name if result.shard else 'nothing'}", flush=True)
        if result.shard is not None and args.commit:
            s = shards.summary(shard_dir)
            _git_commit([shard_dir], f"answers: shard {result.shard.name} ({result.answers} answers, "
                                        f"{result.answer_tokens} tokens; {s['answers']} answers, "
                                        f"{s['answer_tokens']} tokens in all)")
        if result.answers < len(chunk):  # the chunk's budget cut it: its unfinished answers go first
            have, _ = shards.read_all(shard_dir, target=args.target)
            todo = grow.unanswered(rows, have, chunk) + todo
    if total_s:
        print(f"answers: {total_tokens:.0f} tokens in {total_s:.0f} s, {total_tokens / total_s:.0f} tokens/s", flush=True)
    return 0


def cmd_import(args) -> int:
    """Re-pack the shards of another machine's run (``gpu_grow_train.sh``'s $OUT/shards) into
    new shards here, without the answers the shards here already hold."""
    rows = prompt_scale.training_rows()
    vocab = _load(args.target).vocab_size  # a shard with ids beyond it is refused before anything is written
    have, _ = shards.read_all(shards.SHARDS_DIR, target=args.target)
    theirs, notes = shards.read_all(Path(args.folder), target=args.target, vocab_size=vocab)
    for note in notes:
        print(f"import: skipped {note}", file=sys.stderr)
    added, written = grow.import_answers(theirs, have, rows, shards.SHARDS_DIR, args.target)
    print(f"import: {added} answers added ({len(theirs) - added} already held) -> "
          + (", ".join(p.name for p in written) or "nothing"))
    if written and args.commit:
        s = shards.summary()
        _git_commit([shards.SHARDS_DIR], f"answers: {added} imported from a GPU run ({s['answers']} answers, "
                                         f"{s['answer_tokens']} tokens in all)")
    return 0


def cmd_bench(args) -> int:
    import tempfile
    from specdemo.models import hardware
    target = _load(args.target, args.device)
    rows = prompt_scale.training_rows()
    order = grow.missing(rows, [], 1, seed=args.seed)[:args.answers]
    results = []
    for slots in [int(s) for s in args.slots.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            r = grow.answer_chunk(target, rows, order, Path(tmp), max_new_tokens=args.max_tokens, temperatures=(0.7,),
                                  backend=args.backend, slots=slots, budget_s=None, target_name=args.target)
        results.append({"slots": slots, "answers": r.answers, "answer_tokens": r.answer_tokens,
                        "seconds": round(r.seconds, 2), "tokens_per_s": round(r.tokens_per_s, 1)})
        print(f"bench: {args.backend}, {slots} at once: {r.answer_tokens} tokens in {r.seconds:.1f} s = "
              f"{r.tokens_per_s:.0f} tokens/s", flush=True)
    report = {"backend": args.backend, "device": args.device, "max_tokens": args.max_tokens,
              "machine": hardware.describe(hardware.detect()), "date": time.strftime("%Y-%m-%d"),
              "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", default=TARGET)
    common.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("prompts", parents=[common])
    p.add_argument("--commit", action="store_true", help="commit each new file at once")
    p.add_argument("--slots", type=int, default=32, help="sequences decoded together")
    p.add_argument("--follow-ups", action="store_true", help="conversations continuing the target's shard answers")
    p.add_argument("--magpie", type=int, default=0, help="this many prompts written by the target itself")
    p.add_argument("--minutes", type=float, help="time for --magpie")
    a = sub.add_parser("answers", parents=[common])
    a.add_argument("--commit", action="store_true", help="commit each new file at once")
    a.add_argument("--slots", type=int, default=32, help="sequences decoded together")
    a.add_argument("--minutes", type=float, help="stop starting chunks after this long (default: until done)")
    a.add_argument("--chunk", type=int, default=1000, help="answers a chunk (one shard)")
    a.add_argument("--chunk-minutes", type=float, default=20.0)
    a.add_argument("--max-tokens", type=int, default=384)
    a.add_argument("--answers-per-prompt", type=int, default=1, help="answer 0 greedy, the others sampled")
    a.add_argument("--temperatures", default="0.7,1.0")
    a.add_argument("--backend", default="w8a8", choices=["w8a8", "int8", "bf16", "transformers"])
    a.add_argument("--device", default="cpu")
    a.add_argument("--shards", default=str(shards.SHARDS_DIR), help="the shard folder to complete")
    i = sub.add_parser("import", parents=[common])
    i.add_argument("--commit", action="store_true", help="commit each new file at once")
    i.add_argument("folder", help="a folder of shards generated elsewhere")
    b = sub.add_parser("bench", parents=[common])
    b.add_argument("--slots", default="16,32,64", help="batch widths, comma-separated")
    b.add_argument("--answers", type=int, default=64)
    b.add_argument("--max-tokens", type=int, default=384)
    b.add_argument("--backend", default="w8a8", choices=["w8a8", "int8", "bf16", "transformers"])
    b.add_argument("--device", default="cpu")
    b.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    try:
        return {"prompts": cmd_prompts, "answers": cmd_answers, "import": cmd_import, "bench": cmd_bench}[args.cmd](args)
    except (prompt_scale.PromptSetError, grow.GrowError, shards.ShardError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
