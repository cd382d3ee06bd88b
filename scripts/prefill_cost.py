"""Seconds to prefill a prompt of N tokens on each target backend (issue 42 item 7).

    nice -n 10 python scripts/prefill_cost.py [--target builtin:smollm2-135m]
        [--backends auto,transformers] [--tokens 1024,2048,4096] [--repeats 1]

Feeds N token ids through the backend's KV-cached target exactly as a race's prefill does (in
``core.kv.PREFILL_CHUNK`` chunks) after one untimed chunk-sized warm-up forward, and prints
seconds and tokens per second per (backend, N); ``auto`` is resolved to the backend it picks
here and named. The ids are a fixed pseudo-random sequence: the cost of a prefill does not
depend on which tokens it holds. Times are wall-clock medians of ``--repeats`` runs; on a
shared machine they vary with the other jobs.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def measure(target: str, backends: list[str], sizes: list[int], repeats: int) -> list[dict]:
    from specdemo.core.kv import PREFILL_CHUNK
    from specdemo.models.backends import target_kv
    from specdemo.services.backend_choice import with_backend
    from specdemo.models.loading import load_model
    base = load_model(target, "cpu", "float32")
    vocab = base.vocab_size
    rows = []
    for backend in backends:
        loaded, choice = with_backend(base, backend)
        name = getattr(loaded, "backend", "transformers")
        kv = target_kv(loaded)
        kv.forward([(7 * i) % (vocab - 1) + 1 for i in range(PREFILL_CHUNK)])  # first shapes
        for n in sizes:
            ids = [(7919 * i + 13) % (vocab - 1) + 1 for i in range(n)]
            times = []
            for _ in range(repeats):
                kv.reset()
                start = time.perf_counter()
                kv.forward(ids)
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            rows.append({"asked": backend, "backend": name, "tokens": n, "seconds": seconds,
                         "tokens_per_s": n / seconds})
            print(f"{backend} ({name}) {n} tokens: {seconds:.2f} s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="builtin:smollm2-135m")
    parser.add_argument("--backends", default="auto,transformers")
    parser.add_argument("--tokens", default="1024,2048,4096")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    rows = measure(args.target, args.backends.split(","),
                   [int(n) for n in args.tokens.split(",")], args.repeats)
    print(f"{platform.processor() or platform.machine()}, {args.target}, "
          f"median of {args.repeats}")
    print("| backend | tokens | seconds | tokens/s |\n|---|---|---|---|")
    for r in rows:
        label = r["backend"] if r["asked"] == r["backend"] else f"{r['asked']} ({r['backend']})"
        print(f"| {label} | {r['tokens']} | {r['seconds']:.2f} | {r['tokens_per_s']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
