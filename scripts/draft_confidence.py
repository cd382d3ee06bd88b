"""How well a drafter's confidence predicts acceptance: the shipped EAGLE-3 head on held-out
prompts (greedy, fixed k, the float32 transformers target), every drafted token's top
probability against whether the target accepted it, in ten bins (EAGLE-2, Li et al. 2024,
observed that a draft model's confidence approximates its acceptance rate). Prints the
acceptance rate per confidence bin and per draft position; ``--json`` keeps the rounds.

    python scripts/draft_confidence.py [--tasks chat] [--per-task 12] [--k 8] [--json OUT]

docs/learned-drafters.md ("Weighing drafts by confidence") gives one run. Acceptance figures
hold under load; nothing here is timed.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's specdemo
sys.path.insert(0, str(Path(__file__).resolve().parent))  # heldout_tasks beside this file

from heldout_tasks import picked_prompts  # noqa: E402

from specdemo.core import engine  # noqa: E402
from specdemo.core.drafters import base  # noqa: E402
from specdemo.models.learned import load_learned  # noqa: E402
from specdemo.models.loading import load_model  # noqa: E402
from specdemo.services.pipeline import Pipeline  # noqa: E402
from specdemo.services.training.report import evaluate  # noqa: E402


def record_rounds(rounds: list[dict]) -> None:
    """Wrap the draft sampler and greedy verification so that each round appends
    {"confidence": [top probability per drafted token], "accepted": n}."""
    proposal, verify = base.DraftSampler.proposal, engine.verify_greedy

    def proposal_kept(self, source):
        p = proposal(self, source)
        rounds.append({"confidence": list(p.confidence or [])})
        return p

    def verify_kept(drafts, ids):
        n, tokens = verify(drafts, ids)
        if rounds and "accepted" not in rounds[-1] and drafts:
            rounds[-1]["accepted"] = n
        return n, tokens

    base.DraftSampler.proposal = proposal_kept
    engine.verify_greedy = verify_kept


def tables(rounds: list[dict], bins: int = 10) -> tuple[list[list[int]], list[list[int]]]:
    """([accepted, judged] per confidence bin, [accepted, judged] per draft position): a token
    is judged when every token before it in its round was accepted."""
    by_bin = [[0, 0] for _ in range(bins)]
    by_pos: list[list[int]] = []
    for r in rounds:
        if "accepted" not in r:
            continue
        for j, c in enumerate(r["confidence"]):
            if j > r["accepted"]:
                break
            ok = int(j < r["accepted"])
            b = by_bin[min(int(c * bins), bins - 1)]
            b[0] += ok
            b[1] += 1
            while len(by_pos) <= j:
                by_pos.append([0, 0])
            by_pos[j][0] += ok
            by_pos[j][1] += 1
    return by_bin, by_pos


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head", default="builtin:smollm2-135m-eagle3")
    ap.add_argument("--tasks", default="chat")
    ap.add_argument("--per-task", type=int, default=12)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rounds: list[dict] = []
    record_rounds(rounds)
    target = load_model("builtin:smollm2-135m", "cpu", "float32")
    pipe = Pipeline(target, args.head, load_learned(args.head, target))
    picked = picked_prompts(args.tasks.split(","), args.per_task)
    result = evaluate({"head": pipe}, picked, k=args.k, max_new_tokens=args.max_new_tokens)
    by_bin, by_pos = tables(rounds)
    print(f"{args.head}, k = {args.k}, {len(picked)} prompts, {len(rounds)} rounds, "
          f"mean acceptance length {result['head']['mean_acceptance_length']:.2f}")
    print("| confidence | accepted / judged | rate |\n|---|---|---|")
    for i, (a, n) in enumerate(by_bin):
        print(f"| {i / len(by_bin):.1f}-{(i + 1) / len(by_bin):.1f} | {a}/{n} | "
              f"{a / n:.2f} |" if n else f"| {i / len(by_bin):.1f}-{(i + 1) / len(by_bin):.1f} | 0/0 | - |")
    print("per position:", ", ".join(f"{a / n:.2f}" for a, n in by_pos if n))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "by_bin": by_bin,
                                               "by_position": by_pos}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
