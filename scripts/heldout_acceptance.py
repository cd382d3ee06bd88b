"""Held-out acceptance of EAGLE-3 heads, per task and per position, computed offline.

For the first N prompts of each task in the prompt set's held-out split (whole topic families
never trained on: ``services/training/split.py``), the float32 target's greedy answer is
generated once (cached in --cache), then one target forward over prompt + answer gives the
features, and each head drafts a chain of k tokens from every position along the target's own
path, feeding its own guesses as the engine does. A round accepts the leading draft tokens equal
to the target's next tokens; rounds are walked from the end of the prompt exactly as greedy
speculative decoding walks them, so the mean acceptance length (new tokens per target forward,
bonus token included) and the per-position acceptance are those of ``compare --draft-length K
--temperature 0 --backend transformers`` on the same prompts (checked against it).

    python scripts/heldout_acceptance.py HEAD_DIR_OR_BUILTIN [...] [--tasks chat,code,maths,chinese]
        [--per-task 12] [--k 4] [--max-new-tokens 96] [--cache FILE] [--json OUT]
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's specdemo

import torch

from specdemo.core.kv import KVModel
from specdemo.models.learned import load_learned
from specdemo.models.loading import load_model
from specdemo.services.pipeline import DecodeSettings, Pipeline
from specdemo.services.training import data, prompt_set


def heldout_rows(tasks, per_task):
    by_task = {}
    for row in data.split_rows(prompt_set.load(), heldout=True):
        by_task.setdefault(row.get("task", "chat"), []).append(row)
    return {t: by_task.get(t, [])[:per_task] for t in tasks}


def greedy_answers(target, rows_by_task, max_new, cache_path):
    cache = json.loads(Path(cache_path).read_text()) if cache_path and Path(cache_path).exists() else {}
    pipe = Pipeline(target, "none")
    for task, rows in rows_by_task.items():
        for row in rows:
            key = json.dumps(row.get("messages") or row["prompt"], ensure_ascii=False)
            if key in cache:
                continue
            ids = data.chat_ids(target.tokenizer, row["prompt"], row.get("messages"))
            r = pipe.run(ids, DecodeSettings(max_new_tokens=max_new), speculative=False)
            cache[key] = {"prompt_ids": ids, "answer": list(r.token_ids)}
            if cache_path:
                Path(cache_path).write_text(json.dumps(cache))
        print(f"greedy answers of {task}: {len(rows)} ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
    return cache


@torch.inference_mode()
def leading_matches(target, head, full, n_prompt, k):
    """{position p: number of leading chain draft tokens equal to full[p], full[p+1], ...} for
    every p from the end of the prompt on (the chain drafted with context full[:p])."""
    m = KVModel(target.model)
    m.reset()
    _, feats = m.forward_features(full, 1, head.feature_layers)
    n = len(full)
    hidden = head.project(feats.unsqueeze(0))  # (1, n, H)
    tok = torch.tensor([full[1:]])
    outs, logits, past = head.step(hidden[:, :n - 1], tok, torch.arange(n - 1).unsqueeze(0), None)
    d2t = head.draft_ids()
    out = {}
    for t in range(n_prompt - 2, n - 2):  # anchor t: the head has read features up to t, token t+1
        lg, h = logits[0, t], outs[:, t:t + 1]
        pk = (past[0][:, :, :t + 1], past[1][:, :, :t + 1])
        hits = 0
        for j in range(k):
            if t + 2 + j >= n:
                break
            guess = int(d2t[int(lg.argmax())])
            if guess != full[t + 2 + j]:
                break
            hits += 1
            if j + 1 == k or t + 3 + j >= n:
                break
            h, l2, pk = head.step(h, torch.tensor([[guess]]), torch.tensor([[t + 1 + j]]), pk)
            lg = l2[0, -1]
        out[t + 2] = hits
    return out


def walk(hits, n_prompt, n, k):
    """Greedy speculative decoding's rounds over the path: (new tokens, rounds, per-position
    [drafted, accepted])."""
    p, rounds, per = n_prompt, 0, [[0, 0] for _ in range(k)]
    while p < n:
        m = min(hits.get(p, 0), k, n - p - 1) if p < n - 1 else 0
        drafted = min(k, n - p)
        for j in range(min(drafted, m + 1)):
            per[j][0] += 1
            per[j][1] += int(j < m)
        rounds += 1
        p += m + 1
    return n - n_prompt, rounds, per


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", nargs="+",
                    help="EAGLE-3 heads to measure: a head folder or a builtin:NAME drafter, each "
                         "for the builtin:smollm2-135m target")
    ap.add_argument("--tasks", default="chat,code,maths,chinese",
                    help="comma-separated tasks of the held-out split to measure "
                         "(default: %(default)s)")
    ap.add_argument("--per-task", type=int, default=12,
                    help="held-out prompts per task, the first N of the split (default: "
                         "%(default)s)")
    ap.add_argument("--k", type=int, default=4,
                    help="draft length: tokens each head drafts a round (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=96,
                    help="tokens of the target's greedy answer per prompt (default: "
                         "%(default)s)")
    ap.add_argument("--cache", default=None,
                    help="JSON file of the greedy answers: read if present, written after "
                         "generating (default: not cached)")
    ap.add_argument("--json", default=None,
                    help="write the per-head, per-task results to this JSON file")
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    target = load_model("builtin:smollm2-135m", "cpu", "float32")
    rows = heldout_rows(args.tasks.split(","), args.per_task)
    answers = greedy_answers(target, rows, args.max_new_tokens, args.cache)
    result = {}
    for spec in args.heads:
        head = load_learned(spec, target).head.eval()
        if head.embedding_table() is None:
            head.attach(target.model.get_input_embeddings())
        result[spec] = {}
        for task, task_rows in rows.items():
            new = rounds = 0
            per = [[0, 0] for _ in range(args.k)]
            for row in task_rows:
                a = answers[json.dumps(row.get("messages") or row["prompt"], ensure_ascii=False)]
                full = a["prompt_ids"] + a["answer"]
                hits = leading_matches(target, head, full, len(a["prompt_ids"]), args.k)
                nw, rd, pp = walk(hits, len(a["prompt_ids"]), len(full), args.k)
                new, rounds = new + nw, rounds + rd
                for j in range(args.k):
                    per[j][0] += pp[j][0]
                    per[j][1] += pp[j][1]
            result[spec][task] = {"prompts": len(task_rows), "new_tokens": new, "target_forwards": rounds,
                                  "mean_acceptance_length": round(new / rounds, 3) if rounds else None,
                                  "per_position_acceptance": [round(b / a_, 3) if a_ else None for a_, b in per]}
            r = result[spec][task]
            print(f"{spec}\t{task}\tk={args.k}\tMAL {r['mean_acceptance_length']}\tper-position "
                  f"{r['per_position_acceptance']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
