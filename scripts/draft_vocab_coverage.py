"""Share of the answer tokens, per task, that each EAGLE-3 head's draft vocabulary holds.

A token outside a head's draft vocabulary can never be drafted (nor learned in training), so this
is an upper bound on that head's acceptance for the task.

    python scripts/draft_vocab_coverage.py ANSWERS.jsonl HEAD_DIR [HEAD_DIR ...]

ANSWERS.jsonl: the ``answers.jsonl`` of ``train-draft`` (rows with ``ids``, ``n_prompt``, ``task``).
HEAD_DIR: folders with a speculators-layout ``model.safetensors`` holding ``t2d`` (V,) bool.
Prints a Markdown table.
"""
import collections
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    answers, heads = Path(argv[0]), [Path(a) for a in argv[1:]]
    masks = {h.name: load_file(h / "model.safetensors")["t2d"].bool() for h in heads}
    tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with answers.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            ids = torch.tensor(row["ids"][row["n_prompt"]:], dtype=torch.long)
            t = tally[row.get("task", "?")]
            t["tokens"] += len(ids)
            for name, mask in masks.items():
                t[name] += int(mask[ids].sum())
    print("| task | answer tokens | " + " | ".join(masks) + " |")
    print("|---|---|" + "---|" * len(masks))
    for task, t in tally.items():
        cells = " | ".join(f"{t[n] / max(1, t['tokens']):.1%}" for n in masks)
        print(f"| {task} | {t['tokens']:,} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
