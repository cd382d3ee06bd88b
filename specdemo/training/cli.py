"""``python -m specdemo train-draft``: train an EAGLE-3 drafter for a target on this machine.

Stages (each resumable, each with a progress bar): the target answers the training prompts ->
the target's features are captured -> the head is trained -> the head is saved in the
speculators layout with ``train.json`` -> a held-out report against ngram.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("train-draft", help="train an EAGLE-3 drafter for a target on this machine")
    p.add_argument("--target", default="builtin:smollm2-135m")
    p.add_argument("--out", required=True, type=Path, help="output folder (resumable)")
    p.add_argument("--kind", default="eagle3", choices=["eagle3", "dflash"])
    p.add_argument("--prompts", type=Path, default=None,
                   help="JSONL of {task, prompt[, split]} (default: the shipped prompt set)")
    p.add_argument("--max-prompts", type=int, default=None, help="use only the first N training prompts")
    p.add_argument("--answers-per-prompt", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=128, help="longest generated answer")
    p.add_argument("--generate-minutes", type=float, default=None,
                   help="stop generating answers after this long and train on what exists")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=None, help="stop training after N steps")
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--ttt-steps", type=int, default=3)
    p.add_argument("--batch-tokens", type=int, default=1024)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--report-prompts", type=int, default=20,
                   help="held-out prompts in the report (0 = no report)")
    p.add_argument("--device", default="auto")
    p.add_argument("--resume", action="store_true", help="continue from what --out holds")
    p.set_defaults(func=cmd_train)


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "specdemo"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "n/a"
    return out


def _machine() -> dict:
    import os

    import psutil
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "memory_bytes": psutil.virtual_memory().total, "system": platform.platform()}


def _check_memory(n_tokens: int, width: int) -> None:
    """Refuse when the captured features would not fit comfortably in memory."""
    import psutil
    need = n_tokens * width * 2 * 2  # float16 on disk, about twice that while batching
    free = psutil.virtual_memory().available
    if need > 0.5 * free:
        raise SystemExit(f"error: the features need ~{need / 1e9:.1f} GB but only "
                         f"{free / 1e9:.1f} GB are free; use --max-prompts or --max-tokens")


def cmd_train(args: argparse.Namespace) -> int:
    try:
        return _train(args)
    except KeyboardInterrupt:  # outside the training loop, which saves its own checkpoint
        print(f"\ninterrupted: what was written to {args.out} so far (answers, feature shards) "
              "is kept; run the same command with --resume to continue", file=sys.stderr)
        return 130


def _train(args: argparse.Namespace) -> int:
    if args.kind != "eagle3":
        print("error: train-draft trains EAGLE-3 heads; DFlash training is not implemented "
              "(load published DFlash drafters with --draft DIR instead)", file=sys.stderr)
        return 2
    from ..decode_cli import fail
    from ..drafters.features import eagle3_default_layers, num_layers
    from ..models import ModelLoadError, load_model
    from . import data, prompt_set, train
    out = args.out
    if out.exists() and any(out.iterdir()) and not args.resume and not (out / "recipe.json").exists():
        fail(f"{out} is not empty; give --resume to continue a run there, or another folder")
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        target = load_model(args.target, args.device, "float32")
    except ModelLoadError as exc:
        fail(str(exc))
    rows = prompt_set.load(args.prompts or prompt_set.PROMPTS_FILE)
    train_rows = data.split_rows(rows, heldout=False)[:args.max_prompts]
    recipe = train.Recipe(draft_vocab_size=args.draft_vocab, ttt_steps=args.ttt_steps,
                          epochs=args.epochs, learning_rate=args.learning_rate,
                          batch_tokens=args.batch_tokens, answers_per_prompt=args.answers_per_prompt,
                          max_new_tokens=args.max_tokens,
                          feature_layers=eagle3_default_layers(num_layers(target.model)))
    recipe_file = out / "recipe.json"
    if args.resume and recipe_file.exists():
        recipe = train.Recipe(**{**json.loads(recipe_file.read_text()),
                                 "feature_layers": tuple(json.loads(recipe_file.read_text())["feature_layers"])})
    recipe_file.write_text(json.dumps(asdict(recipe), indent=1))
    try:  # seconds now rather than a failure after an hour of generation and capture
        train.preflight(target, recipe)
    except RuntimeError as exc:
        fail(f"training would fail on {target.device}: {exc}")
    timings = {}
    t0 = time.time()
    data.generate_answers(target, train_rows, out, recipe.answers_per_prompt, recipe.temperature,
                          recipe.max_new_tokens,
                          budget_s=None if args.generate_minutes is None else 60 * args.generate_minutes)
    timings["generate_s"] = time.time() - t0
    answers = data.load_answers(out)
    hidden = target.model.config.get_text_config().hidden_size
    _check_memory(sum(len(a["ids"]) for a in answers), hidden * (len(recipe.feature_layers) + 1))
    t0 = time.time()
    shards = data.capture_features(target, answers, recipe.feature_layers, out)
    timings["capture_s"] = time.time() - t0
    import torch
    items = [x for s in shards for x in torch.load(s, weights_only=False)]
    head = train.new_head(target, recipe, train.token_counts(items, target.vocab_size))
    t0 = time.time()
    try:
        state = train.train(head, target, items, recipe, out, resume=args.resume,
                            max_steps=args.max_steps)
    except KeyboardInterrupt:
        save(head, out, recipe, target, answers, timings, None, started)
        print(f"\ninterrupted: checkpoint and a usable head saved in {out}; --resume continues",
              file=sys.stderr)
        return 130
    timings["train_s"] = time.time() - t0
    info = save(head, out, recipe, target, answers, timings, state, started)
    print(f"saved the EAGLE-3 head in {out} (speculators layout)")
    if args.report_prompts:
        path = report(out, target, head, rows, args.report_prompts, info)
        print(path.read_text())
    return 0


def save(head, out: Path, recipe, target, answers, timings, state, started) -> dict:
    """Write the head folder and train.json; returns the train.json content."""
    from ..drafters import eagle_io
    info = {
        "recipe": asdict(recipe), "target": target.spec, "kind": "eagle3",
        "data": {"answers": len(answers), "answer_tokens": sum(len(a["ids"]) - a["n_prompt"] for a in answers),
                 "prompts": len({a["prompt_index"] for a in answers})},
        "timings_s": {**timings, "total_s": time.time() - started},
        "machine": _machine(), "versions": _versions(),
        "summary": None if state is None else {
            "steps": state.step, "epochs": state.epoch, "final_loss": state.losses[-1] if state.losses else None,
            "final_top1_by_step": state.accuracy[-1] if state.accuracy else None,
            "train_seconds": state.seconds},
        "losses": [] if state is None else state.losses,
    }
    eagle_io.save_head(head, out, dtype=torch_bf16(), speculative_tokens=recipe.ttt_steps + 1)
    (out / "train.json").write_text(json.dumps(info, indent=1))
    return info


def torch_bf16():
    import torch
    return torch.bfloat16


def report(out: Path, target, head, rows: list[dict], n: int, info: dict) -> Path:
    """Held-out evaluation against ngram (report.md / report.json in ``out``)."""
    from ..drafters.learned import LoadedEagle3
    from ..pipeline import Pipeline
    from . import data
    from .report import evaluate, write
    held = data.split_rows(rows, heldout=True)
    by_task: dict[str, list[dict]] = {}
    for row in held:
        by_task.setdefault(row.get("task", "chat"), []).append(row)
    picked = []
    while len(picked) < min(n, len(held)):  # round-robin over tasks
        for task_rows in by_task.values():
            if task_rows and len(picked) < n:
                picked.append(task_rows.pop(0))
    learned = LoadedEagle3(str(out), head, {"layout": "speculators", "missing": []})
    pipes = {"eagle3": Pipeline(target, str(out), learned), "ngram": Pipeline(target, "ngram")}
    return write(out, evaluate(pipes, picked), info)
