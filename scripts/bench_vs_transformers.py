"""specdemo against transformers on the same prompts, model, dtype and length (not a timed test).

Runs ``python -m specdemo bench`` with the n-gram drafter and the transformers reference column,
then reads the numbers back from its ``bench.csv`` and checks them against the targets:

* our plain decoding is at least as fast as transformers' ``generate()``  (plain_vs_transformers >= 1);
* our n-gram speculation beats ``generate(prompt_lookup_num_tokens=k)`` at the same k by 1.15x
  on every task                                                              (vs_transformers >= 1.15);
* with ``auto``, speculation is never slower than our plain decoding on any task (speedup >= 1);
* on copy-heavy prompts (task ``grounded``) our best speedup is 3x or more.

Usage::

    python scripts/bench_vs_transformers.py --out bench-vs-transformers [bench flags...]

Any other flag is passed to ``bench`` (e.g. ``--repeats 3 --max-new-tokens 96 --dtype float32``).
Exit status 0 whether or not the targets are met; the verdicts are printed and written to
``DIR/vs_transformers.md``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdemo.interfaces.cli import main as specdemo_main  # noqa: E402

DEFAULTS = ["--draft", "ngram", "--tasks", "code,maths,grounded,chat,creative",
            "--draft-lengths", "2,4,10,auto", "--repeats", "3", "--max-new-tokens", "96"]


def verdicts(rows: list[dict]) -> list[tuple[str, str, str, bool]]:
    """(task, check, value as in the CSV, met) for every target, from bench.csv's rows."""
    ours = [r for r in rows if r["engine"] == "specdemo" and r["status"] == "ok"]
    out = []
    for task in dict.fromkeys(r["task"] for r in ours):
        cells = [r for r in ours if r["task"] == task]
        plain = cells[0]["plain_vs_transformers"]
        if plain:
            out.append((task, "plain >= transformers plain", plain, float(plain) >= 1.0))
        for r in cells:
            if r["vs_transformers"]:
                out.append((task, f"ngram k={r['draft_length']} >= 1.15x transformers prompt lookup",
                            r["vs_transformers"], float(r["vs_transformers"]) >= 1.15))
        auto = next((r for r in cells if r["draft_length"] == "auto"), None)
        if auto is not None and auto["speedup"]:
            out.append((task, "auto never slower than plain", auto["speedup"], float(auto["speedup"]) >= 1.0))
        if task == "grounded":
            best = max(cells, key=lambda r: float(r["speedup"] or 0))
            out.append((task, f"copy-heavy speedup >= 3x (best k={best['draft_length']})",
                        best["speedup"], float(best["speedup"] or 0) >= 3.0))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    args, rest = parser.parse_known_args(argv)
    given = {a.split("=")[0] for a in rest if a.startswith("--")}
    defaults = [v for i in range(0, len(DEFAULTS), 2) if DEFAULTS[i] not in given
                for v in DEFAULTS[i:i + 2]]
    status = specdemo_main(["bench", *defaults, *rest, "--out", args.out])
    if status:
        return status
    with open(Path(args.out) / "bench.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    lines = ["| task | target | value | met |", "|---|---|---|---|"]
    lines += [f"| {task} | {check} | {value} | {'yes' if met else 'no'} |"
              for task, check, value, met in verdicts(rows)]
    text = "\n".join(lines) + "\n"
    (Path(args.out) / "vs_transformers.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
