"""Held-out comparison of learned drafter families (EAGLE-3, DFlash, DSpark): mean acceptance
length and per-position acceptance per task, at each draft length k, and the drafting cost per
round, through the engine's own decoding (greedy, the float32 transformers target by default,
``services.training.report.evaluate``).

The prompts are the first N of each task in the prompt set's held-out split (whole topic
families never trained on: ``services/training/split.py``). A drafter given as ``DIR@S`` is a
DSpark folder run with ``SPECDEMO_DSPARK_MIN_SURVIVAL=S`` (0: whole blocks; the default 0.04
stops drafting a block once the confidence head's predicted prefix survival falls below it).
Block drafters propose at most their block's drafts a round (DFlash B - 1, DSpark B), so a k
above that is capped by the drafter.

Acceptance figures hold under load; the drafting cost (ms per round) does not: compare rows of
one run, on one machine. The JSON records the command, the CPU's vector extensions, the process's
niceness and the load average at the start and the end, so a reader can tell a quiet run from a
shared one; it is rewritten after every row (``complete`` false until the last). ``drafted_per_round`` (tokens drafted / rounds) shows where a drafter ends rounds
before k (a DSpark confidence cut, a block smaller than k).

    python scripts/heldout_families.py DRAFTER [DRAFTER ...] [--tasks chat,code,maths,chinese]
        [--per-task 8] [--k 4,8] [--max-new-tokens 64] [--backend transformers] [--json OUT]
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's specdemo
sys.path.insert(0, str(Path(__file__).resolve().parent))  # heldout_tasks beside this file

from heldout_tasks import picked_prompts  # noqa: E402

from specdemo.models.learned import load_learned  # noqa: E402
from specdemo.models.loading import load_model  # noqa: E402
from specdemo.services.pipeline import Pipeline  # noqa: E402
from specdemo.services.training.report import evaluate  # noqa: E402


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: the vector extensions that decide a CPU forward's speed, as /proc/cpuinfo names them
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def cpu_flags() -> list[str]:
    """Which of :data:`VECTOR_FLAGS` the CPU has (``/proc/cpuinfo``; [] where it is unreadable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in VECTOR_FLAGS if f in have]
    except OSError:
        pass
    return []


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafters", nargs="+", help="folders, builtin:NAME, or DSPARK_DIR@MIN_SURVIVAL")
    ap.add_argument("--tasks", default="chat,code,maths,chinese")
    ap.add_argument("--per-task", type=int, default=8)
    ap.add_argument("--k", default="4,8")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--backend", default="transformers")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    tasks = args.tasks.split(",")
    ks = [int(k) for k in args.k.split(",")]
    target = load_model("builtin:smollm2-135m", "cpu", "float32")
    if args.backend != "transformers":
        from specdemo.services.backend_choice import use_backend
        target = use_backend(target, args.backend)[0]
    start = time.perf_counter()
    results = {"command": " ".join(["python scripts/heldout_families.py", *argv]),
               "cpu": cpu_name(), "cores": os.cpu_count(), "cpu_flags": cpu_flags(),
               "nice": os.nice(0), "load_average_start": load_average(), "backend": args.backend,
               "tasks": tasks, "per_task": args.per_task, "max_new_tokens": args.max_new_tokens,
               "rows": []}
    for name in args.drafters:
        spec, _, survival = name.partition("@")
        if survival:
            os.environ["SPECDEMO_DSPARK_MIN_SURVIVAL"] = survival
        else:
            os.environ.pop("SPECDEMO_DSPARK_MIN_SURVIVAL", None)
        pipe = Pipeline(target, spec, load_learned(spec, target))
        for k in ks:
            row = {"drafter": name, "k": k, "tasks": {}}
            rounds_ms = []
            for task in tasks:
                r = evaluate({name: pipe}, picked_prompts([task], args.per_task), k=k,
                             max_new_tokens=args.max_new_tokens)[name]
                row["tasks"][task] = {"mean_acceptance_length": r["mean_acceptance_length"],
                                      "per_position_acceptance": r["per_position_acceptance"],
                                      "acceptance_rate": r["acceptance_rate"],
                                      "drafted_per_round": r["drafted_per_round"],
                                      "draft_ms_per_round": None if r["draft_s_per_round"] is None
                                      else round(1000 * r["draft_s_per_round"], 2)}
                rounds_ms.append(row["tasks"][task]["draft_ms_per_round"])
                print(f"{name}\tk={k}\t{task}\tMAL {r['mean_acceptance_length']}\tper-position "
                      f"{r['per_position_acceptance']}\tdrafted/round {r['drafted_per_round']}\t"
                      f"draft ms/round {row['tasks'][task]['draft_ms_per_round']}", flush=True)
            mals = [row["tasks"][t]["mean_acceptance_length"] for t in tasks]
            row["mean_over_tasks"] = round(sum(mals) / len(mals), 3) if None not in mals else None
            row["draft_ms_per_round"] = (round(sum(rounds_ms) / len(rounds_ms), 2)
                                         if None not in rounds_ms else None)
            results["rows"].append(row)
            print(f"{name}\tk={k}\tmean over tasks {row['mean_over_tasks']}", flush=True)
            if args.json:  # after every row, so a stopped run keeps the rows it finished
                Path(args.json).write_text(json.dumps({**results, "complete": False}, indent=1))
    results["load_average_end"] = load_average()
    results["seconds"] = round(time.perf_counter() - start, 1)
    results["complete"] = True
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
