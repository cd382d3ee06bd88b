"""The training report: acceptance of a trained drafter on held-out prompts, against ngram.

Runs the real engine (greedy, fixed draft length k) over prompts the drafter never saw and pools
the per-position counters, so the figures are the ones the app would show.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm.auto import tqdm

from ...core.stats import ratio


def evaluate(pipes: dict, prompts: list[dict], k: int = 4, max_new_tokens: int = 96,
             plain: bool = False, tree=None) -> dict:
    """{drafter: {"mean_acceptance_length", "acceptance_rate", "per_position_acceptance",
    "tokens_per_s", "draft_s_per_round", "draft_s_per_token", "prompts", ...}} pooled over
    ``prompts`` (greedy, draft length k).

    Held-out speed: ``tokens_per_s`` = new tokens after the first / seconds from the first new
    token to the last, summed over the prompts (the prefill is the same for every drafter);
    ``draft_s_per_round`` = seconds spent drafting / verification rounds (the drafting cost per
    round); ``draft_s_per_token`` = the same per drafted token; ``drafted_per_round`` = drafted
    tokens / rounds (below k where a drafter ends a round early). With ``plain`` a "plain" entry
    (no drafter, the first pipe's target) is added, and each drafter gets ``speedup`` (its
    tokens_per_s over plain's). Timings depend on the machine's load; compare rows of one run.

    Args:
        pipes: {name: pipeline.Pipeline} (same target, different drafters).
        prompts: rows {"task", "prompt"}.
        tree: a draft tree shape (``core.tree``) for the learned drafters' rounds, or None.
    """
    from ..pipeline import DecodeSettings  # lazy: imports torch
    settings = DecodeSettings(max_new_tokens=max_new_tokens, draft_length=k, tree=tree)
    out = {}
    if plain:
        pipes = {"plain": next(iter(pipes.values())), **pipes}
    for name, pipe in pipes.items():
        drafted = accepted = forwards = tokens = rounds = 0
        elapsed = draft_s = 0.0
        pos_d: list[int] = []
        pos_a: list[int] = []
        by_task: dict[str, list[int]] = {}
        for row in tqdm(prompts, desc=f"held-out prompts, {name}", unit="prompt"):
            stats = pipe.run(pipe.prompt_ids(row["prompt"]), settings,
                             speculative=not (plain and name == "plain")).stats
            drafted += stats.drafted
            accepted += stats.accepted
            forwards += stats.target_forwards
            tokens += stats.new_tokens - 1
            elapsed += stats.elapsed_s - (stats.ttft_s or 0.0)
            draft_s += stats.draft_s
            rounds += stats.rounds
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
            "tokens_per_s": ratio(tokens, elapsed), "draft_s_per_round": ratio(draft_s, rounds),
            "draft_s_per_token": ratio(draft_s, drafted), "drafted_per_round": ratio(drafted, rounds),
            "prompts": len(prompts), "k": k, "max_new_tokens": max_new_tokens,
        }
    if plain and out["plain"]["tokens_per_s"]:
        for name, r in out.items():
            r["speedup"] = (None if r["tokens_per_s"] is None
                            else ratio(r["tokens_per_s"], out["plain"]["tokens_per_s"]))
    return out


def _f(value, fmt: str = ".2f") -> str:
    return "n/a" if value is None else format(value, fmt)


def table(results: dict) -> list[str]:
    """Markdown rows: acceptance, held-out speed and drafting cost per drafter (one k)."""
    lines = ["| drafter | k | mean acceptance length | acceptance rate | tokens/s | speedup | "
             "drafting ms/round | per-position acceptance |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        per = ", ".join(_f(a) for a in r["per_position_acceptance"])
        ms = r.get("draft_s_per_round")
        lines.append(f"| {name} | {r['k']} | {_f(r['mean_acceptance_length'])} | "
                     f"{_f(r['acceptance_rate'])} | {_f(r.get('tokens_per_s'), '.1f')} | "
                     f"{_f(r.get('speedup'))} | {_f(None if ms is None else 1e3 * ms, '.1f')} | {per} |")
    return lines


def write(out_dir: Path, results: dict, train_info: dict, by_k: dict | None = None) -> Path:
    """report.json and report.md in ``out_dir``; returns the markdown path.

    Args:
        results: :func:`evaluate` at the headline k.
        by_k: {k: :func:`evaluate` at k} for more draft lengths (optional).
    """
    (out_dir / "report.json").write_text(json.dumps(
        {"heldout": results, "heldout_by_k": by_k or {}, "train": train_info}, indent=1))
    first = next(iter(results.values()))
    lines = ["# Drafter training report", "",
             f"Held-out prompts: {first['prompts']} (never trained on), greedy, k = {first['k']}, "
             f"up to {first['max_new_tokens']} new tokens each. Held-out speed: tokens/s after "
             "the first token; speedup over plain decoding in the same run; drafting ms/round = "
             "seconds spent drafting per verification round. Timings depend on the machine's "
             "load: compare rows of one report only.", ""]
    lines += table(results)
    for k, rows in (by_k or {}).items():
        if int(k) != first["k"]:
            lines += ["", f"k = {k}:", ""] + table(rows)
    lines += ["", "Mean acceptance length by task:", ""]
    for name, r in results.items():
        tasks = ", ".join(f"{t} {_f(v)}" for t, v in r["mean_acceptance_length_by_task"].items())
        lines.append(f"- {name}: {tasks}")
    lines += ["", f"Training: {json.dumps(train_info.get('summary', {}))}", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def heldout_prompts(rows: list[dict], n: int) -> list[dict]:
    """``n`` held-out rows, round-robin over tasks."""
    from . import data  # lazy: imports torch; --help stays fast
    held = data.split_rows(rows, heldout=True)
    by_task: dict[str, list[dict]] = {}
    for row in held:
        by_task.setdefault(row.get("task", "chat"), []).append(row)
    picked = []
    while len(picked) < min(n, len(held)):  # round-robin over tasks
        for task_rows in by_task.values():
            if task_rows and len(picked) < n:
                picked.append(task_rows.pop(0))
    return picked


def report(kind: str, out: Path, target, drafter, rows: list[dict], n: int, info: dict,
           ks: list[int] = (4,)) -> tuple[Path, dict]:
    """Held-out evaluation against ngram and plain decoding (report.md / report.json in
    ``out``) at each draft length of ``ks``; returns (the markdown path, the results at ks[0])."""
    from ...core.drafters.dflash import LoadedDFlash  # lazy: imports torch; --help stays fast
    from ...models.learned import LoadedEagle3  # lazy: imports torch; --help stays fast
    from ..pipeline import Pipeline  # lazy: imports torch; --help stays fast
    from .report import evaluate, write  # lazy: imports tqdm (--help)
    picked = heldout_prompts(rows, n)
    if kind == "eagle3":
        learned = LoadedEagle3(str(out), drafter, {"layout": "speculators", "missing": []})
    elif kind == "dspark":
        # lazy: imports torch; --help stays fast
        from ...core.drafters.dspark import LoadedDSpark, min_survival_setting
        learned = LoadedDSpark(str(out), drafter.float().eval(),
                               {"layout": "speculators", "config": drafter.config},
                               min_survival=min_survival_setting())
    else:
        learned = LoadedDFlash(str(out), drafter.float().eval(),
                               {"layout": "transformers", "config": drafter.config.to_dict()})
    pipes = {kind: Pipeline(target, str(out), learned), "ngram": Pipeline(target, "ngram")}
    by_k = {k: evaluate(pipes, picked, k=k, plain=True) for k in ks}
    return write(out, by_k[ks[0]], info, by_k), by_k[ks[0]]


def write_curve(out: Path, curve: list[dict], kind: str) -> Path:
    """data_size_curve.json, .md and (with matplotlib) .png: held-out mean acceptance length
    against answer tokens. Returns the markdown path."""
    (out / "data_size_curve.json").write_text(json.dumps(curve, indent=1))
    lines = [f"# Held-out mean acceptance length against data size ({kind})", "",
             "| fraction | answers | answer tokens | mean acceptance length | acceptance rate | "
             "tokens/s | speedup |", "|---|---|---|---|---|---|---|"]
    for c in curve:
        f = lambda v, fmt=".2f": "n/a" if v is None else format(v, fmt)  # noqa: E731
        lines.append(f"| {c['fraction']:g} | {c['answers']} | {c['answer_tokens']:,} | "
                     f"{f(c['mean_acceptance_length'])} | {f(c['acceptance_rate'])} | "
                     f"{f(c['tokens_per_s'], '.1f')} | {f(c['speedup'])} |")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot([c["answer_tokens"] for c in curve],
                [c["mean_acceptance_length"] or 0 for c in curve], "o-")
        ax.set_xscale("log")
        ax.set_xlabel("answer tokens trained on")
        ax.set_ylabel("held-out mean acceptance length")
        ax.set_title(f"{kind}: acceptance against data size")
        fig.tight_layout()
        fig.savefig(out / "data_size_curve.png", dpi=100)
        plt.close(fig)
        lines += ["", "![curve](data_size_curve.png)"]
    except ImportError:
        pass
    path = out / "data_size_curve.md"
    path.write_text("\n".join(lines) + "\n")
    return path

