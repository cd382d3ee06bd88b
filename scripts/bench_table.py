"""One markdown table of every ``bench`` folder under a directory (as scripts/bench_cpu_backends.sh
writes them): per backend, drafter and draft length, each task's speculative tokens/s, the speedup
over the same run's plain lane and the mean acceptance length; then each backend's range of plain
tokens/s and, where present, llama-server's lanes (``server-*`` folders).

    python scripts/bench_table.py DIR
"""
import json
import sys
from pathlib import Path

TASKS = ("chat", "code", "maths", "creative", "grounded")


def cell_text(c: dict) -> str:
    text = f"{c['tokens_per_s']:.1f} ({c['speedup']:.2f}x; L {c['mean_acceptance_length'] or 1:.2f})"
    return text if c.get("identical", True) else text + " NOT IDENTICAL"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    root = Path(argv[0])
    print("| backend | drafter | k | " + " | ".join(TASKS) + " |")
    print("|---|---|---|" + "---|" * len(TASKS))
    plain: dict[str, list[float]] = {}
    for f in sorted(root.glob("*/bench.json")):
        if f.parent.name.startswith("server-"):
            continue
        run = json.loads(f.read_text())
        backend = run["machine"].get("backend", "?")
        for k in sorted({c["draft_length"] for c in run["cells"]}, key=str):
            cells = {c["task"]: c for c in run["cells"] if c["draft_length"] == k}
            for c in cells.values():
                plain.setdefault(backend, []).append(c["plain_tokens_per_s"])
            row = [cell_text(cells[t]) if t in cells else "-" for t in TASKS]
            print(f"| {backend} | {run['draft']} | {k} | " + " | ".join(row) + " |")
    for backend, rates in plain.items():
        print(f"\n{backend}: plain {min(rates):.1f}-{max(rates):.1f} tokens/s")
    for f in sorted(root.glob("server-*/bench.json")):
        for c in json.loads(f.read_text())["cells"]:
            print(f"{f.parent.name} {c.get('task')}: plain {c.get('plain_tokens_per_s') or 0:.1f}, "
                  f"speculative {c.get('tokens_per_s') or 0:.1f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
