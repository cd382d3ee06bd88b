"""Mean acceptance length of EAGLE-3 heads on chat prompts whose *phrasing* no training prompt
uses (the two everyday templates the prompt set holds out whole), greedy, k = 4.

The train-draft report's held-out prompts are held out by topic only; this is the check across
templates. Acceptance figures hold under load; the timing fields do not.

    python scripts/heldout_phrasings.py HEAD_DIR [HEAD_DIR ...] [--per-template N] [--json OUT]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's specdemo

from specdemo.models.learned import load_learned
from specdemo.models.loading import load_model
from specdemo.services.pipeline import Pipeline
from specdemo.services.training import prompt_more
from specdemo.services.training.report import evaluate


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", nargs="+")
    ap.add_argument("--per-template", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    picked = [{"task": "chat", "prompt": p} for prompts in prompt_more.everyday_heldout().values()
              for p in prompts[:args.per_template]]
    target = load_model("builtin:smollm2-135m", "cpu", "float32")
    pipes = {h: Pipeline(target, h, load_learned(h, target)) for h in args.heads}
    pipes["ngram"] = Pipeline(target, "ngram")
    results = evaluate(pipes, picked, k=4, max_new_tokens=args.max_new_tokens)
    for name, r in results.items():
        print(f"{name}: mean acceptance length {r['mean_acceptance_length']:.2f}, per position "
              f"{', '.join(f'{x:.2f}' for x in r['per_position_acceptance'])} ({len(picked)} prompts)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prompts": [r["prompt"] for r in picked], "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
