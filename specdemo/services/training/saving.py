"""Writing a trained drafter's folder and its ``train.json`` (the recipe, the data, where each
stage ran, this machine and the versions)."""

from __future__ import annotations

import json
import platform
import time
from importlib import metadata
from pathlib import Path

from .recipes import recipe_json

SAVED_LAYOUTS = {"eagle3": "speculators layout", "dflash": "transformers layout; z-lab layout in zlab/",
                 "dspark": "speculators layout"}



def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "specdemo"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = checkout_commit() if name == "specdemo" else "n/a"
    return out


def checkout_commit() -> str:
    """``commit <short hash>`` of the git checkout specdemo runs from (it is not installed as a
    package), or "n/a"."""
    import subprocess
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return "n/a"
    return f"commit {done.stdout.strip()}" if done.returncode == 0 and done.stdout.strip() else "n/a"


def machine_facts() -> dict:
    import os

    import psutil
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "memory_bytes": psutil.virtual_memory().total, "system": platform.platform()}


def save(kind: str, drafter, out: Path, recipe, target, answers, timings, state, started,
         where: dict) -> dict:
    """Write the drafter folder and train.json (``where``: where generation, capture and
    training ran); returns the train.json content."""
    from ...core.drafters import eagle_io  # lazy: imports torch; --help stays fast
    from . import dflash_train  # lazy: imports torch; --help stays fast
    info = {
        "recipe": json.loads(recipe_json(recipe)), "target": target.spec, "kind": kind,
        "data": {"answers": len(answers), "answer_tokens": sum(len(a["ids"]) - a["n_prompt"] for a in answers),
                 "prompts": len({a["prompt_index"] for a in answers})},
        "timings_s": {**timings, "total_s": time.time() - started},
        "stages_ran_on": where,
        "machine": machine_facts(), "versions": versions(),
        "summary": None if state is None else {
            "steps": state.step, "epochs": state.epoch, "final_loss": state.losses[-1] if state.losses else None,
            "final_top1_by_step": state.accuracy[-1] if state.accuracy else None,
            "train_seconds": state.seconds},
        "losses": [] if state is None else state.losses,
    }
    if kind == "eagle3":
        eagle_io.save_head(drafter, out, dtype=torch_bf16(), speculative_tokens=recipe.ttt_steps + 1)
    elif kind == "dspark":
        from . import dspark_train  # lazy: imports torch; --help stays fast
        dspark_train.save(drafter, out, dtype=torch_bf16(), verifier=hub_id(target))
    else:
        from ...models.builtin import builtin_hub_id  # lazy: --help stays fast
        verifier = builtin_hub_id(target.spec) or target.spec  # not builtin: or a path
        dflash_train.save(drafter, out, target, dtype=torch_bf16(), verifier=verifier)
    (out / "train.json").write_text(json.dumps(info, indent=1))
    return info


def hub_id(target) -> str:
    """The target's name recorded as a saved drafter's verifier: its hub id, never builtin: or a
    path on this machine."""
    from ...models.learned import verifier_name  # lazy: imports torch; --help stays fast
    return verifier_name(target)


def torch_bf16():
    import torch
    return torch.bfloat16

