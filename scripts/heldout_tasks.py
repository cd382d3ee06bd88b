"""Mean acceptance length of EAGLE-3 heads on more held-out prompts per task than train-draft's
report takes (it takes 20 in all, round-robin over 8 tasks: 3 chat prompts), greedy, k = 4, the
float32 transformers target (the report's reference). The prompts are the first N of each task
in the prompt set's held-out split (the report's own come first), never trained on.

Acceptance figures hold under load; the timing fields do not.

    python scripts/heldout_tasks.py HEAD_DIR [HEAD_DIR ...] [--tasks chat,code] [--per-task N]
        [--max-new-tokens 96] [--ngram] [--json OUT]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's specdemo

from specdemo.models.learned import load_learned
from specdemo.models.loading import load_model
from specdemo.services.pipeline import Pipeline
from specdemo.services.training import data, prompt_set
from specdemo.services.training.report import evaluate


def picked_prompts(tasks: list[str] | None, per_task: int) -> list[dict]:
    """The first ``per_task`` held-out rows of each task (all tasks when ``tasks`` is None)."""
    by_task: dict[str, list[dict]] = {}
    for row in data.split_rows(prompt_set.load(), heldout=True):
        by_task.setdefault(row.get("task", "chat"), []).append(row)
    unknown = sorted(set(tasks or ()) - set(by_task))
    if unknown:
        raise SystemExit(f"--tasks: no held-out prompts of {', '.join(unknown)} "
                         f"(the tasks are {', '.join(sorted(by_task))})")
    return [row for task, rows in by_task.items() if tasks is None or task in tasks
            for row in rows[:per_task]]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", nargs="+")
    ap.add_argument("--tasks", default=None, help="comma-separated (default: every task)")
    ap.add_argument("--per-task", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--ngram", action="store_true", help="evaluate prompt lookup (ngram) too")
    ap.add_argument("--json", default=None)
    ap.add_argument("--tree", default=None, help="a draft tree: default or rank paths "
                    "(core.tree); the learned drafters' rounds verify trees")
    ap.add_argument("--backend", default="transformers",
                    help="the target's backend (default transformers float32, the report's)")
    args = ap.parse_args(argv)
    picked = picked_prompts(args.tasks.split(",") if args.tasks else None, args.per_task)
    from specdemo.core.tree import named_shape
    tree = named_shape(args.tree)
    target = load_model("builtin:smollm2-135m", "cpu", "float32")
    if args.backend != "transformers":
        from specdemo.services.backend_choice import use_backend
        target = use_backend(target, args.backend)[0]
    pipes = {h: Pipeline(target, h, load_learned(h, target)) for h in args.heads}
    if args.ngram:
        pipes["ngram"] = Pipeline(target, "ngram")
    results = evaluate(pipes, picked, k=4, max_new_tokens=args.max_new_tokens, tree=tree)
    for name, r in results.items():
        by_task = ", ".join(f"{t} {v:.2f}" for t, v in r["mean_acceptance_length_by_task"].items())
        print(f"{name}: mean acceptance length {r['mean_acceptance_length']:.2f} ({len(picked)} "
              f"prompts); by task: {by_task}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prompts": [{"task": r.get("task"), "prompt": r["prompt"]} for r in picked],
                       "results": results}, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
