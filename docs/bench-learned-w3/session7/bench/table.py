import json, sys
from pathlib import Path
B = Path("/work/data/bench23")
import os
NEW = os.environ.get("NEW", "_work_data_full2")
runs = [("auto", "ngram", "ngram"), ("auto", "_work_data_full2", "old head (6,755 answers, session 6)"),
        ("auto", NEW, "new head"), ("auto", NEW + "_ngram", "new head + ngram")]
tasks = ["chat", "code", "maths", "creative", "grounded"]
print("| backend | drafter | k | " + " | ".join(tasks) + " |")
print("|---|---|---|" + "---|" * len(tasks))
plains = {}
for backend, name, label in runs:
    f = B / f"{backend}-{name}" / "bench.json"
    if not f.exists():
        continue
    d = json.load(open(f))
    for k in (4, "auto"):
        cells = {c["task"]: c for c in d["cells"] if c["draft_length"] == k}
        row = []
        for t in tasks:
            c = cells.get(t)
            if not c:
                row.append(""); continue
            plains.setdefault(backend, {}).setdefault(t, []).append(c["plain_tokens_per_s"])
            L = c.get("mean_acceptance_length")
            row.append(f"{c['tokens_per_s']:.1f} ({c['speedup']:.2f}x; L {L:.2f}{'' if c['identical'] else '; NOT identical'})" if L else f"{c['tokens_per_s']:.1f} ({c['speedup']:.2f}x)")
        print(f"| {backend} ({d['machine'].get('backend')}) | {label} | {k} | " + " | ".join(row) + " |")
for b, v in plains.items():
    print(b, "plain tok/s per task (min-max over runs):", {t: f"{min(x):.1f}-{max(x):.1f}" for t, x in v.items()})
