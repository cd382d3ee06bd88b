"""Race the default pairing on open-ended prompts and report the median speedup per prompt.

Runs ``python -m specdemo compare --preset <default> --json`` (auto backend, auto draft length)
``--repeats`` times per prompt and prints one JSON object: per prompt the median speedup, the
speedups seen, mean acceptance length, whether the outputs were identical, the backend the
lanes ran on, and the machine, commit and date of the run.

    python scripts/race_default_pairing.py --repeats 3 --out race-default.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys

PROMPTS = {
    "chat-neighbour": "Write a short note to my neighbour asking them to water my plants while I am away next week.",
    "chat-packing": "I am going camping for two nights in the mountains in October. What should I pack?",
    "code-dedupe": "Write a Python function that removes duplicate words from a sentence but keeps the original order.",
    "chinese-travel": "我下個月要去台南玩三天，請推薦一些必吃的小吃和適合散步的地方。",
    "counting": "Count from 1 to 20, separated by commas.",
}


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                flags = open("/proc/cpuinfo", encoding="utf-8").read()
                return line.split(":", 1)[1].strip() + (" (AVX-512)" if "avx512f" in flags else " (AVX2)")
    except OSError:
        pass
    return platform.processor() or platform.machine()


def commit() -> str:
    """The checkout's short commit id, with '+changes' when the work tree differs from it."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+changes" if git("status", "--porcelain", "-uno") else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-135m-eagle3-ngram", help="preset to race (default: the app's default)")
    parser.add_argument("--repeats", type=int, default=3, help="races per prompt (default 3)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="tokens per race (default 96)")
    parser.add_argument("--extra", default="", help="extra compare options, e.g. '--draft-length 4'")
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()
    report = {"machine": cpu_name(), "commit": commit(), "date": datetime.date.today().isoformat(),
              "preset": args.preset, "extra": args.extra, "prompts": {}}
    for name, prompt in PROMPTS.items():
        runs = []
        for _ in range(args.repeats):
            cmd = [sys.executable, "-m", "specdemo", "compare", "--preset", args.preset, "--json",
                   "--max-new-tokens", str(args.max_new_tokens), "--prompt", prompt, *args.extra.split()]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            runs.append(json.loads(out))
        speedups = [r["speedup"] for r in runs]
        report["prompts"][name] = {
            "median_speedup": round(statistics.median(speedups), 3),
            "speedups": [round(s, 3) for s in speedups],
            "mean_acceptance_length": [r["speculative"]["mean_acceptance_length"] for r in runs],
            "mean_draft_length": [round(r["speculative"]["mean_draft_length"], 2) for r in runs],
            "plain_tokens_per_s": [round(r["plain"]["tokens_per_s"], 1) for r in runs],
            "identical": all(r["identical"] for r in runs),
            "backend": sorted({r["speculative"].get("backend", "?") for r in runs}),
        }
        print(name, report["prompts"][name], file=sys.stderr, flush=True)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
