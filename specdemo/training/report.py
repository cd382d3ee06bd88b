"""The training report: acceptance of a trained drafter on held-out prompts, against ngram.

Runs the real engine (greedy, fixed draft length k) over prompts the drafter never saw and pools
the per-position counters, so the figures are the ones the app would show.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm.auto import tqdm

from ..stats import ratio


def evaluate(pipes: dict, prompts: list[dict], k: int = 4, max_new_tokens: int = 96) -> dict:
    """{drafter: {"mean_acceptance_length", "acceptance_rate", "per_position_acceptance",
    "tokens_per_s", "prompts"}} pooled over ``prompts`` (greedy, draft length k).

    Args:
        pipes: {name: pipeline.Pipeline} (same target, different drafters).
        prompts: rows {"task", "prompt"}.
    """
    from ..pipeline import DecodeSettings
    settings = DecodeSettings(max_new_tokens=max_new_tokens, draft_length=k)
    out = {}
    for name, pipe in pipes.items():
        drafted = accepted = forwards = tokens = 0
        elapsed = 0.0
        pos_d: list[int] = []
        pos_a: list[int] = []
        by_task: dict[str, list[int]] = {}
        for row in tqdm(prompts, desc=f"held-out prompts, {name}", unit="prompt"):
            stats = pipe.run(pipe.prompt_ids(row["prompt"]), settings, speculative=True).stats
            drafted += stats.drafted
            accepted += stats.accepted
            forwards += stats.target_forwards
            tokens += stats.new_tokens - 1
            elapsed += stats.elapsed_s
            for i, (d, a) in enumerate(zip(stats.position_drafted, stats.position_accepted)):
                if i == len(pos_d):
                    pos_d.append(0)
                    pos_a.append(0)
                pos_d[i] += d
                pos_a[i] += a
            task = by_task.setdefault(row.get("task", "chat"), [0, 0])
            task[0] += stats.new_tokens - 1
            task[1] += stats.target_forwards
        out[name] = {
            "mean_acceptance_length": ratio(tokens, forwards),
            "acceptance_rate": ratio(accepted, drafted),
            "per_position_acceptance": [ratio(a, d) for a, d in zip(pos_a, pos_d)],
            "mean_acceptance_length_by_task": {t: ratio(n, f) for t, (n, f) in by_task.items()},
            "prompts": len(prompts), "k": k, "max_new_tokens": max_new_tokens,
        }
    return out


def write(out_dir: Path, results: dict, train_info: dict) -> Path:
    """report.json and report.md in ``out_dir``; returns the markdown path."""
    (out_dir / "report.json").write_text(json.dumps({"heldout": results, "train": train_info}, indent=1))
    lines = ["# Drafter training report", "",
             f"Held-out prompts: {next(iter(results.values()))['prompts']} (never trained on), "
             f"greedy, k = {next(iter(results.values()))['k']}, up to "
             f"{next(iter(results.values()))['max_new_tokens']} new tokens each.", "",
             "| drafter | mean acceptance length | acceptance rate | per-position acceptance |",
             "|---|---|---|---|"]
    for name, r in results.items():
        per = ", ".join("n/a" if a is None else f"{a:.2f}" for a in r["per_position_acceptance"])
        mal = r["mean_acceptance_length"]
        acc = r["acceptance_rate"]
        lines.append(f"| {name} | {'n/a' if mal is None else f'{mal:.2f}'} | "
                     f"{'n/a' if acc is None else f'{acc:.2f}'} | {per} |")
    lines += ["", "Mean acceptance length by task:", ""]
    for name, r in results.items():
        tasks = ", ".join(f"{t} {'n/a' if v is None else f'{v:.2f}'}"
                          for t, v in r["mean_acceptance_length_by_task"].items())
        lines.append(f"- {name}: {tasks}")
    lines += ["", f"Training: {json.dumps(train_info.get('summary', {}))}", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path
