"""Side-by-side table: our bench runs and llama-server n-gram lanes, per task (concurrency 1)."""
import json, sys
from pathlib import Path
O = Path("/work/data/bench18")
TASKS = ["code", "maths", "grounded", "chat", "creative"]
ours = {}
for run in sys.argv[1:]:
    d = json.loads((O / run / "bench.json").read_text())
    for c in d["cells"]:
        if c["engine"] == "specdemo" and c["draft_length"] == "auto":
            ours.setdefault(run, {})[c["task"]] = c
server = {}
for typ in ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]:
    for t in TASKS:
        f = O / f"server-{typ}-{t}" / "concurrency.json"
        if f.exists():
            rows = json.loads(f.read_text())["rows"]
            server.setdefault(typ, {})[t] = {r["lane"]: r for r in rows if r["concurrency"] == 1}
print("| lane | " + " | ".join(TASKS) + " |")
print("|---|" + "---|" * len(TASKS))
for run, cells in ours.items():
    print(f"| ours {run}: plain tok/s | " + " | ".join(f"{cells[t]['plain_tokens_per_s']:.1f}" if t in cells else "-" for t in TASKS) + " |")
    print(f"| ours {run}: speculative tok/s (speedup, mean acceptance length, identical) | " + " | ".join(
        f"{cells[t]['tokens_per_s']:.1f} ({cells[t]['speedup']:.2f}x, {cells[t]['mean_acceptance_length']:.2f}, {'yes' if cells[t]['identical'] else 'NO'})" if t in cells else "-" for t in TASKS) + " |")
plains = {t: [server[ty][t]["plain"]["total_tokens_per_s"] for ty in server if t in server[ty]] for t in TASKS}
import statistics
print("| llama-server plain tok/s (median of its runs) | " + " | ".join(f"{statistics.median(plains[t]):.1f}" if plains[t] else "-" for t in TASKS) + " |")
for ty, cells in server.items():
    def cell(t):
        if t not in cells: return "-"
        s, p = cells[t]["speculative"], cells[t]["plain"]
        acc = f"{s['accepted']}/{s['drafted']}"
        return f"{s['total_tokens_per_s']:.1f} ({s['total_tokens_per_s'] / p['total_tokens_per_s']:.2f}x, {acc})"
    print(f"| llama-server --spec-type {ty} tok/s (vs its plain, accepted/drafted) | " + " | ".join(cell(t) for t in TASKS) + " |")
