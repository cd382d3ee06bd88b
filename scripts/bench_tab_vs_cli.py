"""Does the app's Benchmark tab measure what ``python -m specdemo bench`` measures? One cell, both ways.

    python scripts/bench_tab_vs_cli.py [--task grounded] [--draft-length 4] [--rounds 2] [--root DIR]

Runs the same cell (built-in SmolLM2, ngram drafter, greedy, 64 new tokens, one prompt, 3
repeats, no reference column) alternately through the CLI and through the Benchmark tab of a
running ``python app.py`` (its ``/benchmark`` endpoint, what the Run button calls), and prints
plain and speculative tokens/s and the speedup of each, with the tab/CLI ratios. ``--root``
points at another checkout to measure older code the same way. Machine load is printed too.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COLUMNS = ("plain_tokens_per_s", "tokens_per_s", "speedup")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cell(csv_path: str | Path, task: str, k: str) -> dict:
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            if row["task"] == task and row["draft_length"] == k and row["engine"] == "specdemo":
                return {c: float(row[c]) for c in COLUMNS}
    raise LookupError(f"no cell {task} k={k} in {csv_path}")


def cli(root: Path, task: str, k: str) -> dict:
    out = tempfile.mkdtemp(prefix="bench-cli-")
    subprocess.run([sys.executable, "-m", "specdemo", "bench", "--target", "builtin:smollm2-135m",
                    "--draft", "ngram", "--tasks", task, "--draft-lengths", k, "--max-new-tokens",
                    "64", "--repeats", "3", "--prompts-per-task", "1", "--no-reference", "--out", out],
                   cwd=root, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return cell(Path(out) / "bench.csv", task, k)


def tab(client, task: str, k: str) -> dict:
    result = client.predict(None, "builtin:smollm2-135m", "ngram", [task], [k], 64, 3, 1, 0.0,
                            False, [], api_name="/benchmark")
    return cell(result[-2], task, k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="grounded")
    parser.add_argument("--draft-length", default="4")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    from gradio_client import Client
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="bench-app-")) / "app.log"
    app = subprocess.Popen([sys.executable, "app.py", "--no-browser", "--port", str(port)],
                           cwd=args.root, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180  # until the preload is done: older code does not say
        while time.monotonic() < deadline and "ready: send a prompt" not in log.read_text():
            time.sleep(1)
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        for i in range(args.rounds):
            for how, measure in (("cli", lambda: cli(args.root, args.task, args.draft_length)),
                                 ("tab", lambda: tab(client, args.task, args.draft_length))):
                load = os.getloadavg()[0]
                print(json.dumps({"round": i, "how": how, **measure(), "load_1min": load}), flush=True)
    finally:
        app.terminate()
        app.wait(timeout=60)


if __name__ == "__main__":
    main()
