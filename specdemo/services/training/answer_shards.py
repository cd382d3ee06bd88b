"""``train-draft --answers-dir``: the target's answers kept in shards (:mod:`.shards`) are used,
and what a run generates is packed into a new shard there."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .errors import TrainingError

def fit_shard_answers(answers: list[dict], recipe, directory) -> tuple[list[dict], int, int]:
    """The shard answers (``shards.read_all``) this run's generation settings allow: answer
    indices below ``--answers-per-prompt`` (the others dropped, counted), each cut to
    ``--max-tokens`` (counted). Cutting is sound: decoding draws each token from the target
    given the tokens before it, and the token limit does not enter, so an answer's first N
    tokens are what generating N tokens gives (for a greedy answer the same tokens, for a
    sampled one a sample at the same temperature).

    Returns:
        (answers, how many were cut, how many were dropped).
    Raises:
        TrainingError: one sentence when a shard's answer was generated at
            another temperature than this run's for its index (answer 0 greedy, answer a > 0 at
            ``--temperatures``), or with a smaller token limit than ``--max-tokens`` (or none
            recorded): its answers may stop short of what this run would generate.
    """
    temps = recipe.temperature if isinstance(recipe.temperature, (list, tuple)) \
        else (recipe.temperature,)
    limit = recipe.max_new_tokens
    kept, cut, dropped = [], 0, 0
    for a in answers:
        index = a["answer_index"]
        if index >= recipe.answers_per_prompt:
            dropped += 1
            continue
        want = 0.0 if index == 0 else float(temps[(index - 1) % len(temps)])
        if abs(a["temperature"] - want) > 1e-3:
            raise TrainingError(f"--answers-dir {directory}: {a['shard']} holds answer {index} of a prompt "
                 f"generated at temperature {a['temperature']:g}, but this run generates answer "
                 f"{index} at {want:g} (answer 0 greedy, the others at --temperatures): run "
                 f"with the shards' temperatures or give another --answers-dir")
        if a["max_new_tokens"] is None or a["max_new_tokens"] < limit:
            had = ("does not record its --max-tokens" if a["max_new_tokens"] is None
                   else f"holds answers of at most {a['max_new_tokens']} tokens")
            raise TrainingError(f"--answers-dir {directory}: {a['shard']} {had}, fewer than this run's "
                 f"--max-tokens {limit} (its answers may stop short): run with --max-tokens "
                 f"{a['max_new_tokens'] or 'N'} or less, or give another --answers-dir")
        if len(a["answer"]) > limit:
            a = {**a, "answer": a["answer"][:limit]}
            cut += 1
        kept.append(a)
    return kept, cut, dropped


def answers_from_shards(args, target, train_rows: list[dict], out: Path, recipe) -> None:
    """Add the answers of ``--answers-dir``'s shards (this target's, for these prompts) to
    ``out/answers.jsonl`` unless they are there, so that generation makes only what is missing.
    The shards must match the run's generation settings (:func:`fit_shard_answers`: same
    temperatures, a token limit at least ``--max-tokens``; longer answers are cut to it)."""
    from . import data, shards  # lazy: imports torch; --help stays fast
    try:
        kept, notes = shards.read_all(args.answers_dir, target=args.target,
                                      vocab_size=target.vocab_size)
    except shards.ShardError as exc:
        raise TrainingError(str(exc))
    for note in notes:
        print(f"--answers-dir: skipped {note}", file=sys.stderr)
    kept, cut, dropped = fit_shard_answers(kept, recipe, args.answers_dir)
    if cut:
        print(f"--answers-dir: {cut} answers cut to --max-tokens {recipe.max_new_tokens} "
              "(a greedy answer's first tokens are the shorter greedy answer; a sampled one's a "
              "sample at the same temperature)", file=sys.stderr)
    if dropped:
        print(f"--answers-dir: {dropped} answers left out: their answer index is not below "
              f"--answers-per-prompt {recipe.answers_per_prompt}", file=sys.stderr)
    rows, mismatched = shards.as_answer_rows(kept, train_rows,
                                             lambda r: data.chat_ids(target.tokenizer, r["prompt"], r.get("messages")))
    if mismatched:
        print(f"--answers-dir: {mismatched} answers skipped: their prompts tokenize to another "
              "length now (a changed chat template)", file=sys.stderr)
    path = out / data.ANSWERS
    done = {(r["prompt_index"], r["answer_index"]) for r in data.load_answers(out)} if path.exists() else set()
    new = [r for r in rows if (r["prompt_index"], r["answer_index"]) not in done]
    with data._append(path) as f:
        for r in new:
            f.write(json.dumps(r) + "\n")
    print(f"--answers-dir: {len(rows)} answers of {args.target} in {args.answers_dir} "
          f"({len(new)} added to {path.name})", file=sys.stderr)


def answers_to_shards(args, target, train_rows: list[dict], out: Path, recipe) -> None:
    """Pack the answers generated in ``out`` that ``--answers-dir`` lacks into new shards."""
    from . import data, shards  # lazy: imports torch; --help stays fast
    if not (out / data.ANSWERS).exists():
        return
    try:
        have, _ = shards.read_all(args.answers_dir, target=args.target)
    except shards.ShardError as exc:
        raise TrainingError(f"{exc} (the answers generated are kept in {out / data.ANSWERS})")
    known = {(a["key"], a["answer_index"]) for a in have}
    fresh = [r for r in data.load_answers(out)
             if r["prompt_index"] < len(train_rows)
             and (shards.prompt_key(train_rows[r["prompt_index"]]), r["answer_index"]) not in known]
    if not fresh:
        return
    meta = {"target": args.target, "max_new_tokens": recipe.max_new_tokens,
            "generated_on": str(target.device)}
    try:
        paths = shards.write_shards(args.answers_dir, fresh, train_rows, meta)
    except OSError as exc:
        raise TrainingError(f"--answers-dir {args.answers_dir} cannot be written ({exc.strerror or exc}); the "
             f"answers generated are kept in {out / data.ANSWERS}")
    print(f"--answers-dir: {len(fresh)} new answers packed into "
          + ", ".join(p.name for p in paths) + f" in {args.answers_dir}", file=sys.stderr)

