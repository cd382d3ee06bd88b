"""``python -m specdemo train-draft``: train an EAGLE-3 head or a DFlash block drafter for a
target on this machine.

Stages (each resumable, each with a progress bar): the target answers the training prompts (or
``--answers FILE`` brings answers generated elsewhere) -> the target's features are captured ->
the drafter is trained -> saved (EAGLE-3: speculators layout; DFlash: transformers' layout and
z-lab's in ``zlab/``) with ``train.json`` -> a held-out report against ngram and plain decoding
(mean acceptance length and held-out speed). ``--data-sizes`` trains and reports at several
fractions of the data and writes the curve (``data_size_curve.{json,md,png}``).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from ..core import TARGET_BACKENDS
from ..checks import inputs
from .decode_cli import checked, fail
from ..core import machine
from ..models import loading


def _count(flag: str):
    """An argparse type: a whole number >= 1 (specdemo.checks.inputs' words, exit status 2)."""
    return checked(inputs.number, flag, minimum=1, integer=True)


def _generate_backend(args, target) -> str:
    """The backend that generates the answers: ``--generate-backend``, with ``auto`` resolved
    (native-w8a8 where the native forward runs the target, else transformers); written back
    to ``args`` so that train.json names it."""
    if args.generate_backend == "auto":
        # lazy: imports torch; --help stays fast
        from ..models.native_backend import unavailable_reason
        runs = target.device.type == "cpu" and unavailable_reason(target) is None
        args.generate_backend = "native-w8a8" if runs else "transformers"
    return args.generate_backend


def register(sub) -> None:
    p = sub.add_parser("train-draft",
                       help="train an EAGLE-3, DFlash or DSpark drafter for a target on this machine")
    p.add_argument("--target", default="builtin:smollm2-135m",
                   help="the target the drafter is trained for: builtin:NAME, a local folder or a "
                        "hub id (default: builtin:smollm2-135m)")
    p.add_argument("--out", required=True, type=Path, help="output folder (resumable)")
    p.add_argument("--kind", default="eagle3", choices=["eagle3", "dflash", "dspark"],
                   help="eagle3 (default), dflash, or dspark (DFlash's block drafter with a Markov "
                        "head and a confidence head, reading the target layers EAGLE-3 reads)")
    p.add_argument("--prompts", type=Path, default=None,
                   help="JSONL of {task, prompt[, split]} (default: the shipped prompt set)")
    p.add_argument("--scale-prompts", action="store_true",
                   help="also train on assets/train/prompts-scale.jsonl.gz (~84k prompts at scale, after the shipped set)")
    p.add_argument("--max-prompts", type=_count("--max-prompts"), default=None, help="use only the first N training prompts")
    p.add_argument("--answers-per-prompt", type=_count("--answers-per-prompt"), default=2)
    p.add_argument("--max-tokens", type=_count("--max-tokens"), default=128, help="longest generated answer")
    p.add_argument("--temperatures", default="0.7",
                   help="comma-separated sampling temperatures of answers 1.. (answer 0 is greedy), "
                        "used in turn; e.g. 0.7,1.0")
    p.add_argument("--generate-batch", type=_count("--generate-batch"), default=16, help="answers generated together")
    p.add_argument("--generate-endpoint", default=None, metavar="URL",
                   help="generate the answers with a llama.cpp llama-server serving the target's GGUF "
                        "(e.g. http://127.0.0.1:8080, started with --parallel >= --generate-batch); "
                        "default: the target itself, batched")
    p.add_argument("--generate-backend", default="auto",
                   choices=["auto", "transformers", "native", "native-int8", "native-w8a8"],
                   help="the forward that generates the answers when no --generate-endpoint is "
                        "given: transformers (float32 generate, padded batches of --generate-batch) "
                        "or one of our native CPU forwards, --generate-batch answers decoded "
                        "together with continuous batching (native-w8a8: int8 weights and "
                        "activations, the fastest on a CPU); auto (default): native-w8a8 for a "
                        "target on the CPU that the native forward runs, else transformers")
    p.add_argument("--stop-after", choices=["answers", "features"], default=None,
                   help="stop after this stage (e.g. generate data in the background, train later)")
    p.add_argument("--generate-minutes", type=float, default=None,
                   help="stop generating answers after this long and train on what exists")
    p.add_argument("--epochs", type=_count("--epochs"), default=3)
    p.add_argument("--max-steps", type=_count("--max-steps"), default=None, help="stop training after N steps")
    p.add_argument("--answers", type=Path, default=None,
                   help="train on this answers.jsonl (data.py's format) instead of generating")
    p.add_argument("--answers-dir", type=Path, default=None, metavar="DIR",
                   help="answer shards kept in git (e.g. assets/train/answers): the target's answers "
                        "there are used and only the missing ones generated; what is generated is "
                        "packed into a new shard there (services/training/shards.py)")
    p.add_argument("--draft-vocab", type=_count("--draft-vocab"), default=8192, help="EAGLE-3: draft vocabulary size")
    p.add_argument("--ttt-steps", type=_count("--ttt-steps"), default=3,
                   help="EAGLE-3: training-time-test depth (unrolled draft steps)")
    p.add_argument("--feature-noise", type=float, default=0.0,
                   help="EAGLE-3: Gaussian noise added to the input features during training, as a "
                        "fraction of each feature vector's RMS (0 = none)")
    p.add_argument("--block-size", type=int, default=8,
                   help="DFlash/DSpark: block size B (one forward drafts B - 1 tokens; DSpark B)")
    p.add_argument("--draft-layers", type=int, default=2, help="DFlash/DSpark: the drafter's layers")
    p.add_argument("--target-layers", type=int, default=4,
                   help="DFlash: how many evenly spaced target layers it reads")
    p.add_argument("--anchors", type=int, default=16,
                   help="DFlash/DSpark: blocks per sequence per step")
    p.add_argument("--markov-rank", type=_count("--markov-rank"), default=256,
                   help="DSpark: rank of the Markov head (speculators' default 256)")
    p.add_argument("--data-sizes", default=None,
                   help="comma-separated fractions of the answers (e.g. 0.25,0.5,1.0): train and "
                        "report at each, write data_size_curve.{json,md,png}")
    p.add_argument("--report-k", default="4",
                   help="comma-separated draft lengths of the held-out report (first = headline)")
    p.add_argument("--online-features", action="store_true",
                   help="EAGLE-3: compute the target's features batch by batch during training instead "
                        "of storing them first (no disk: what millions of answer tokens need; the target "
                        "runs again each epoch)")
    p.add_argument("--train-minutes", type=float, default=None,
                   help="fit the learning-rate schedule to this many minutes of training (timed on its "
                        "first steps; never more than --epochs)")
    p.add_argument("--capture-backend", default="transformers", choices=["transformers", "native", "native-w8a8"],
                   help="the forward that captures the target's features: transformers (float32, "
                        "the reference), native (our C forward, BF16 weights: about 2x faster "
                        "on a CPU with AVX512-BF16) or native-w8a8 (int8 weights and activations: "
                        "the features of the forward auto picks on most CPUs)")
    p.add_argument("--batch-tokens", type=_count("--batch-tokens"), default=1024)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--answer-loss-only", action="store_true",
                   help="the loss at answer positions only (the assistant-only mask SpecForge "
                        "trains with); by default prompt positions count too, labelled with the "
                        "target's own prediction there")
    p.add_argument("--train-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="bfloat16: train under autocast (about 1.5x faster on CPUs with AVX512-BF16 "
                        "or AMX, several times slower on CPUs without them; float32 master "
                        "weights)")
    p.add_argument("--report-prompts", type=int, default=20,
                   help="held-out prompts in the report (0 = no report)")
    p.add_argument("--device", default="auto")
    p.add_argument("--resume", action="store_true", help="continue from what --out holds")
    p.add_argument("--init", type=Path, default=None, metavar="DIR",
                   help="start from the drafter an earlier train-draft run left in DIR (its "
                        "checkpoint.pt, else its model.safetensors; or builtin:NAME, a shipped "
                        "head; same kind and layer shapes), e.g. to train on more data; "
                        "a fresh learning-rate schedule. An EAGLE-3 head's draft vocabulary is "
                        "built from this run's answers: ids both vocabularies hold keep the "
                        "earlier head's output rows, new ids start from the target's head")
    p.add_argument("--keep-draft-vocab", action="store_true",
                   help="with --init: keep the earlier head's draft vocabulary (its size must be "
                        "--draft-vocab) instead of building one from this run's answers, e.g. "
                        "to train more on answers of one task without losing the ids of others")
    p.set_defaults(func=cmd_train)


def _temperatures(text: str) -> float | tuple[float, ...]:
    """``--temperatures``: one float, or a tuple of floats used in turn (refused when not > 0)."""
    try:
        temps = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise SystemExit(f"error: --temperatures {text!r}: expected numbers separated by commas") from None
    if not temps or any(not t > 0 for t in temps):
        raise SystemExit(f"error: --temperatures {text!r}: every temperature must be above 0")
    return temps[0] if len(temps) == 1 else temps


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "specdemo"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = _checkout_commit() if name == "specdemo" else "n/a"
    return out


def _checkout_commit() -> str:
    """``commit <short hash>`` of the git checkout specdemo runs from (it is not installed as a
    package), or "n/a"."""
    import subprocess
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return "n/a"
    return f"commit {done.stdout.strip()}" if done.returncode == 0 and done.stdout.strip() else "n/a"


def _machine() -> dict:
    import os

    import psutil
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "memory_bytes": psutil.virtual_memory().total, "system": platform.platform()}


def _check_space(n_tokens: int, width: int, out: Path) -> None:
    """Refuse when the captured features would not fit on the disk of ``out``; say so when they
    will not fit in memory (training memory-maps them and reads each batch from the page cache,
    slower when the disk has to serve it)."""
    import psutil
    need = n_tokens * width * 2  # float16 shards
    shards = out / "features"
    have = sum(f.stat().st_size for f in shards.glob("*.pt")) if shards.is_dir() else 0
    free_disk = shutil.disk_usage(out).free
    if need - have > 0.9 * free_disk:
        raise SystemExit(f"error: the features need ~{need / 1e9:.1f} GB on disk but only "
                         f"{free_disk / 1e9:.1f} GB are free under {out}; use --max-prompts or "
                         "--max-tokens, or another --out")
    free_memory = psutil.virtual_memory().available
    if need > 0.8 * free_memory:
        print(f"note: the features (~{need / 1e9:.1f} GB) exceed the free memory "
              f"({free_memory / 1e9:.1f} GB); training reads them from disk, more slowly",
              file=sys.stderr)


def cmd_train(args: argparse.Namespace) -> int:
    try:
        return _train(args)
    except KeyboardInterrupt:  # outside the training loop, which saves its own checkpoint
        print(f"\ninterrupted: what was written to {args.out} so far (answers, feature shards) "
              "is kept; run the same command with --resume to continue", file=sys.stderr)
        return 130


def _recipe(args, target, recipe_file: Path, counts=None, temperature=0.7):
    """The recipe of this run (the saved one on --resume)."""
    # lazy: imports torch; --help stays fast
    from ..core.drafters.features import eagle3_default_layers, num_layers
    # lazy: imports torch; --help stays fast
    from ..services.training import dflash_train, dspark_train, train
    saved = json.loads(recipe_file.read_text()) if args.resume and recipe_file.exists() else None
    if saved:
        saved.pop("temperature_note", None)
    common = dict(epochs=args.epochs, learning_rate=args.learning_rate, train_dtype=args.train_dtype,
                  batch_tokens=args.batch_tokens, answers_per_prompt=args.answers_per_prompt,
                  max_new_tokens=args.max_tokens, temperature=temperature,
                  loss_on_prompt=not args.answer_loss_only)
    if saved:
        given = {**common, **({"draft_vocab_size": args.draft_vocab, "ttt_steps": args.ttt_steps}
                              if args.kind == "eagle3" else {})}
        kept = [f"{k} {saved[k]} (this command: {v})" for k, v in given.items()
                if k in saved and saved[k] != (list(v) if isinstance(v, tuple) else v)]
        if kept:
            print(f"--resume keeps the recipe saved in {recipe_file.parent}: " + ", ".join(kept)
                  + "; start another folder to change it", file=sys.stderr)
    if args.kind == "eagle3":
        if saved:
            return train.Recipe(**{**saved, "feature_layers": tuple(saved["feature_layers"])})
        return train.Recipe(draft_vocab_size=args.draft_vocab, ttt_steps=args.ttt_steps,
                            feature_noise=args.feature_noise, feature_layers=eagle3_default_layers(num_layers(target.model)),
                            train_budget_s=None if args.train_minutes is None else 60 * args.train_minutes, **common)
    if saved:
        saved.pop("feature_layers", None)
        kind = dspark_train.DSparkRecipe if args.kind == "dspark" else dflash_train.DFlashRecipe
        return kind(**{**saved, "target_layer_ids": tuple(saved["target_layer_ids"])})
    if args.kind == "dspark":
        return dspark_train.DSparkRecipe(
            block_size=args.block_size, draft_layers=args.draft_layers,
            anchors_per_sequence=args.anchors, markov_rank=args.markov_rank,
            target_layer_ids=dspark_train.default_target_layers_dspark(num_layers(target.model)),
            **common)
    return dflash_train.DFlashRecipe(
        block_size=args.block_size, draft_layers=args.draft_layers, anchors_per_sequence=args.anchors,
        target_layer_ids=dflash_train.default_target_layers(num_layers(target.model), args.target_layers),
        **common)


TEMPERATURE_NOTE = ("answer 0 of each prompt is greedy; answers 1.. are sampled at temperature "
                    "(a list: used in turn)")


def _stopped_after(stage: str, where: Path, out: Path) -> str:
    """What ``--stop-after STAGE`` prints: where the stage's output is and how to go on."""
    return (f"{stage} are in {where}; to go on, run the same command without --stop-after "
            f"and with --resume (it keeps the recipe saved in {out / 'recipe.json'})")


def _recipe_json(recipe) -> str:
    out = asdict(recipe)
    if hasattr(recipe, "block_size"):
        out["feature_layers"] = list(recipe.feature_layers)
    out["temperature_note"] = TEMPERATURE_NOTE  # for people; dropped when the recipe is read back
    return json.dumps(out, indent=1)


def _k_list(text: str) -> list[int]:
    try:
        ks = [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        fail(f"--report-k takes comma-separated draft lengths of at least 1, not {text!r}")
    return ks


def _fractions(text: str | None) -> list[float]:
    if not text:
        return [1.0]
    try:
        sizes = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] <= 0 or sizes[-1] > 1:
        fail(f"--data-sizes takes comma-separated fractions in (0, 1], not {text!r}")
    return sizes


def _train(args: argparse.Namespace) -> int:
    from ..services.training import data, dflash_train, dspark_train, train  # lazy: imports torch
    temperature = _temperatures(args.temperatures)  # refused before any work
    rows = check_inputs(args)  # before any work: nothing loaded, nothing written
    out = args.out
    ks, sizes = _k_list(args.report_k), _fractions(args.data_sizes)
    if args.answers is not None and not args.answers.is_file():
        fail(f"--answers {args.answers} is not a file")
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        target = loading.load_model(args.target, args.device, "float32")
    except loading.ModelLoadError as exc:
        fail(str(exc))
    train_rows = data.split_rows(rows, heldout=False)[:args.max_prompts]
    recipe_file = out / "recipe.json"
    recipe = _recipe(args, target, recipe_file, temperature=temperature)
    recipe_file.write_text(_recipe_json(recipe))
    if args.kind == "eagle3":
        try:  # seconds now rather than a failure after an hour of generation and capture
            train.preflight(target, recipe)
        except RuntimeError as exc:
            fail(f"training would fail on {target.device}: {exc}")
    timings = {}
    t0 = time.time()
    budget_s = None if args.generate_minutes is None else 60 * args.generate_minutes
    if args.answers_dir is not None and args.answers is None:
        _answers_from_shards(args, target, train_rows, out, recipe)
    if args.answers is not None:
        import filecmp
        import shutil
        kept_answers = out / data.ANSWERS
        if not kept_answers.exists() or not filecmp.cmp(args.answers, kept_answers, shallow=False):
            if kept_answers.exists():  # e.g. more answers generated since: shards that still fit are kept
                print(f"--answers differs from the copy in {out}: using the new file")
            shutil.copyfile(args.answers, kept_answers)
    elif args.generate_endpoint:
        try:
            data.generate_answers_endpoint(args.generate_endpoint, target.tokenizer, train_rows,
                                           out, recipe.answers_per_prompt, recipe.temperature,
                                           recipe.max_new_tokens, set(target.eos_token_ids),
                                           concurrency=args.generate_batch, budget_s=budget_s)
        except RuntimeError as exc:  # the answers written so far are kept for --resume
            fail(f"--generate-endpoint: {exc}")
    elif _generate_backend(args, target) != "transformers":
        from ..models.native_backend import NativeError  # lazy: imports torch; --help stays fast
        try:
            data.generate_answers_native(target, train_rows, out, recipe.answers_per_prompt,
                                         recipe.temperature, recipe.max_new_tokens,
                                         slots=args.generate_batch, weights=TARGET_BACKENDS[args.generate_backend].weights,
                                         budget_s=budget_s)
        except NativeError as exc:
            fail(f"--generate-backend {args.generate_backend}: {exc}")
    else:
        data.generate_answers(target, train_rows, out, recipe.answers_per_prompt, recipe.temperature,
                              recipe.max_new_tokens, batch_size=args.generate_batch, budget_s=budget_s)
    timings["generate_s"] = time.time() - t0
    if args.answers_dir is not None and args.answers is None:
        _answers_to_shards(args, target, train_rows, out, recipe)
    device = str(target.device)
    where = {"generate": ("an answers file given with --answers" if args.answers is not None
                          else "llama-server at --generate-endpoint" if args.generate_endpoint
                          else f"the target on {device}, {args.generate_backend} backend")}
    if args.stop_after == "answers":
        print(_stopped_after("answers", out / data.ANSWERS, out))
        return 0
    answers = data.load_answers(out)
    if not answers:
        fail(f"no answers to train on in {out / data.ANSWERS}")
    online = getattr(args, "online_features", False)
    if online and args.kind != "eagle3":
        fail(f"--online-features trains EAGLE-3 heads only, not --kind {args.kind}")
    beyond = max((max(a["ids"], default=0) for a in answers), default=0)
    if beyond >= target.vocab_size:  # --answers of another tokenizer: refused before capture
        fail(f"{args.answers or out / data.ANSWERS}: an answer's ids hold {beyond}, beyond the "
             f"{target.vocab_size:,}-id vocabulary of {args.target}: the answers were made with "
             "another tokenizer")
    hidden = target.model.config.get_text_config().hidden_size
    if not online:
        _check_space(sum(len(a["ids"]) for a in answers), hidden * (len(recipe.feature_layers) + 1), out)
    t0 = time.time()
    kept = len(list((out / data.FEATURES).glob("*.pt"))) if (out / data.FEATURES).is_dir() else 0
    try:
        shards = [] if online else data.capture_features(target, answers, recipe.feature_layers, out,
                                                         backend=args.capture_backend)
    except loading.ModelLoadError as exc:  # native unavailable here (no compiler, another architecture)
        fail(f"--capture-backend {args.capture_backend}: {exc}")
    timings["capture_s"] = time.time() - t0
    on = (f"the target on {device}" if args.capture_backend == "transformers"
          else "the target on the native backend (int8 weights and activations)"
          if args.capture_backend == "native-w8a8" else "the target on the native backend (BF16 weights)")
    where["capture"] = (f"the target on {device}, batch by batch during training (online)" if online
                        else on if kept < len(shards)
                        else "kept from an earlier run (feature shards in the folder)")
    where["train"] = f"{device}, {recipe.train_dtype}"
    note = slow_bf16_note(str(device), recipe.train_dtype)
    if note:
        print(note, file=sys.stderr)
    if args.init is not None:  # the folder's name only: no machine paths in what may ship
        where["train"] += (f", started from the drafter of an earlier run ({args.init.name})"
                           + (", keeping its draft vocabulary" if args.keep_draft_vocab else ""))
    if args.stop_after == "features":
        print(_stopped_after("features", out / data.FEATURES, out))
        return 0
    import torch
    # memory-mapped: 1.2M answer tokens of EAGLE-3 features are ~8 GB; batches read what they use
    all_items = ([{"ids": torch.tensor(a["ids"], dtype=torch.int32), "n_prompt": a["n_prompt"]} for a in answers]
                 if online else [x for s in shards for x in torch.load(s, weights_only=False, mmap=True)])
    if args.kind in ("dflash", "dspark") and recipe.mask_token_id < 0:
        recipe.mask_token_id = dflash_train.pick_mask_token(
            train.token_counts(all_items, target.vocab_size), target.eos_token_ids)
    recipe_file.write_text(_recipe_json(recipe))
    curve = []
    for size in sizes:
        folder = out if size == sizes[-1] else out / f"size-{size:g}"
        n = max(1, round(size * len(all_items)))
        picked = sorted(data.shuffled(range(len(all_items)), recipe.seed)[:n])
        items = [all_items[i] for i in picked]
        subset = [answers[i] for i in picked]
        if args.kind == "eagle3":
            drafter = train.new_head(target, recipe, train.token_counts(items, target.vocab_size))
        elif args.kind == "dspark":
            drafter = dspark_train.new_drafter(target, recipe, verifier=_hub_id(target))
        else:
            drafter = dflash_train.new_drafter(target, recipe)
        if args.init is not None:
            problem = warm_start(drafter, args.init, keep_vocab=args.keep_draft_vocab)
            if problem:
                fail(problem)
        trainer = {"eagle3": train.train, "dflash": dflash_train.train,
                   "dspark": dspark_train.train}[args.kind]
        t0 = time.time()
        try:
            state = trainer(drafter, target, items, recipe, folder, resume=args.resume,
                            max_steps=args.max_steps)
        except KeyboardInterrupt:
            save(args.kind, drafter, folder, recipe, target, subset, timings, None, started, where)
            print(f"\ninterrupted: checkpoint and a usable drafter saved in {folder}; --resume "
                  "continues", file=sys.stderr)
            return 130
        timings["train_s"] = time.time() - t0
        info = save(args.kind, drafter, folder, recipe, target, subset, timings, state, started,
                    where)
        print(f"saved the {KIND_NAMES[args.kind]} in {folder} ({SAVED_LAYOUTS[args.kind]})")
        if args.report_prompts:
            t0 = time.time()
            path, results = report(args.kind, folder, target, drafter, rows, args.report_prompts,
                                   info, ks)
            info["timings_s"]["report_s"] = time.time() - t0
            info["timings_s"]["total_s"] = time.time() - started
            info["stages_ran_on"]["report"] = f"the target on {device} (transformers, float32: the reference)"
            (folder / "train.json").write_text(json.dumps(info, indent=1))
            print(path.read_text())
            curve.append({"fraction": size, "answers": len(items),
                          "answer_tokens": info["data"]["answer_tokens"],
                          **{key: results[args.kind][key] for key in
                             ("mean_acceptance_length", "acceptance_rate", "tokens_per_s",
                              "speedup", "draft_s_per_round")},
                          "folder": str(folder)})
    if len(sizes) > 1 and curve:
        print(write_curve(out, curve, args.kind).read_text())
    return 0


def _fit_shard_answers(answers: list[dict], recipe, directory) -> tuple[list[dict], int, int]:
    """The shard answers (``shards.read_all``) this run's generation settings allow: answer
    indices below ``--answers-per-prompt`` (the others dropped, counted), each cut to
    ``--max-tokens`` (counted). Cutting is sound: decoding draws each token from the target
    given the tokens before it, and the token limit does not enter, so an answer's first N
    tokens are what generating N tokens gives (for a greedy answer the same tokens, for a
    sampled one a sample at the same temperature).

    Returns:
        (answers, how many were cut, how many were dropped).
    Raises:
        SystemExit: one sentence (``decode_cli.fail``) when a shard's answer was generated at
            another temperature than this run's for its index (answer 0 greedy, answer a > 0 at
            ``--temperatures``), or with a smaller token limit than ``--max-tokens`` (or none
            recorded): its answers may stop short of what this run would generate.
    """
    temps = recipe.temperature if isinstance(recipe.temperature, (list, tuple)) \
        else (recipe.temperature,)
    limit = recipe.max_new_tokens
    kept, cut, dropped = [], 0, 0
    for a in answers:
        index = a["answer_index"]
        if index >= recipe.answers_per_prompt:
            dropped += 1
            continue
        want = 0.0 if index == 0 else float(temps[(index - 1) % len(temps)])
        if abs(a["temperature"] - want) > 1e-3:
            fail(f"--answers-dir {directory}: {a['shard']} holds answer {index} of a prompt "
                 f"generated at temperature {a['temperature']:g}, but this run generates answer "
                 f"{index} at {want:g} (answer 0 greedy, the others at --temperatures): run "
                 f"with the shards' temperatures or give another --answers-dir")
        if a["max_new_tokens"] is None or a["max_new_tokens"] < limit:
            had = ("does not record its --max-tokens" if a["max_new_tokens"] is None
                   else f"holds answers of at most {a['max_new_tokens']} tokens")
            fail(f"--answers-dir {directory}: {a['shard']} {had}, fewer than this run's "
                 f"--max-tokens {limit} (its answers may stop short): run with --max-tokens "
                 f"{a['max_new_tokens'] or 'N'} or less, or give another --answers-dir")
        if len(a["answer"]) > limit:
            a = {**a, "answer": a["answer"][:limit]}
            cut += 1
        kept.append(a)
    return kept, cut, dropped


def _answers_from_shards(args, target, train_rows: list[dict], out: Path, recipe) -> None:
    """Add the answers of ``--answers-dir``'s shards (this target's, for these prompts) to
    ``out/answers.jsonl`` unless they are there, so that generation makes only what is missing.
    The shards must match the run's generation settings (:func:`_fit_shard_answers`: same
    temperatures, a token limit at least ``--max-tokens``; longer answers are cut to it)."""
    from ..services.training import data, shards  # lazy: imports torch; --help stays fast
    try:
        kept, notes = shards.read_all(args.answers_dir, target=args.target,
                                      vocab_size=target.vocab_size)
    except shards.ShardError as exc:
        fail(str(exc))
    for note in notes:
        print(f"--answers-dir: skipped {note}", file=sys.stderr)
    kept, cut, dropped = _fit_shard_answers(kept, recipe, args.answers_dir)
    if cut:
        print(f"--answers-dir: {cut} answers cut to --max-tokens {recipe.max_new_tokens} "
              "(a greedy answer's first tokens are the shorter greedy answer; a sampled one's a "
              "sample at the same temperature)", file=sys.stderr)
    if dropped:
        print(f"--answers-dir: {dropped} answers left out: their answer index is not below "
              f"--answers-per-prompt {recipe.answers_per_prompt}", file=sys.stderr)
    rows, mismatched = shards.as_answer_rows(kept, train_rows,
                                             lambda r: data.chat_ids(target.tokenizer, r["prompt"], r.get("messages")))
    if mismatched:
        print(f"--answers-dir: {mismatched} answers skipped: their prompts tokenize to another "
              "length now (a changed chat template)", file=sys.stderr)
    path = out / data.ANSWERS
    done = {(r["prompt_index"], r["answer_index"]) for r in data.load_answers(out)} if path.exists() else set()
    new = [r for r in rows if (r["prompt_index"], r["answer_index"]) not in done]
    with data._append(path) as f:
        for r in new:
            f.write(json.dumps(r) + "\n")
    print(f"--answers-dir: {len(rows)} answers of {args.target} in {args.answers_dir} "
          f"({len(new)} added to {path.name})", file=sys.stderr)


def _answers_to_shards(args, target, train_rows: list[dict], out: Path, recipe) -> None:
    """Pack the answers generated in ``out`` that ``--answers-dir`` lacks into new shards."""
    from ..services.training import data, shards  # lazy: imports torch; --help stays fast
    if not (out / data.ANSWERS).exists():
        return
    try:
        have, _ = shards.read_all(args.answers_dir, target=args.target)
    except shards.ShardError as exc:
        fail(f"{exc} (the answers generated are kept in {out / data.ANSWERS})")
    known = {(a["key"], a["answer_index"]) for a in have}
    fresh = [r for r in data.load_answers(out)
             if r["prompt_index"] < len(train_rows)
             and (shards.prompt_key(train_rows[r["prompt_index"]]), r["answer_index"]) not in known]
    if not fresh:
        return
    meta = {"target": args.target, "max_new_tokens": recipe.max_new_tokens,
            "generated_on": str(target.device)}
    try:
        paths = shards.write_shards(args.answers_dir, fresh, train_rows, meta)
    except OSError as exc:
        fail(f"--answers-dir {args.answers_dir} cannot be written ({exc.strerror or exc}); the "
             f"answers generated are kept in {out / data.ANSWERS}")
    print(f"--answers-dir: {len(fresh)} new answers packed into "
          + ", ".join(p.name for p in paths) + f" in {args.answers_dir}", file=sys.stderr)


def _init_folder(folder: Path) -> Path:
    """``builtin:NAME`` -> the shipped drafter's folder; any other value as given."""
    text = str(folder)
    if text.startswith("builtin:"):
        from ..models.learned import BUILTIN_DIR  # lazy: imports torch; --help stays fast
        return BUILTIN_DIR / text.split(":", 1)[1]
    return folder


def _read_init(folder: Path) -> tuple[dict | None, str | None]:
    """(the drafter state in ``folder``, None), or (None, one sentence why it cannot be read).

    Reads ``checkpoint.pt`` (memory-mapped, float32: what a run leaves to resume), else the
    saved weights ``model.safetensors`` (e.g. a shipped head, ``builtin:NAME``; BF16, widened
    when loaded into the float32 drafter)."""
    import torch
    where = _init_folder(folder)
    ckpt = where / "checkpoint.pt"
    if ckpt.is_file():
        try:
            return torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)["head"], None
        except Exception:  # a damaged or foreign file: one sentence
            return None, f"--init {folder}: checkpoint.pt could not be read (damaged, or not one train-draft wrote)"
    weights = where / "model.safetensors"
    if weights.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(weights), None
        except (SafetensorError, OSError, ValueError):
            return None, f"--init {folder}: model.safetensors could not be read (damaged)"
    return None, (f"--init {folder}: no checkpoint.pt or model.safetensors there (a folder an earlier "
                  "train-draft run wrote, or builtin:NAME)")


def warm_start(drafter, folder: Path, keep_vocab: bool = False) -> str | None:
    """Load the weights of the drafter in ``folder`` (what :func:`_read_init` reads: an earlier
    run's ``checkpoint.pt``, else ``model.safetensors``; ``builtin:NAME``) into ``drafter``.

    An EAGLE-3 head keeps its own draft vocabulary (``d2t``/``t2d``, built from this run's
    answers, of any size): each draft id that the earlier head's vocabulary also holds takes that
    head's ``lm_head`` row, and an id new to the vocabulary keeps its fresh row (the target's
    head row). A head trained before the data grew to new languages thus gains their ids without
    starting over. Prints how many ids carried over when the vocabularies differ.

    With ``keep_vocab`` (``--keep-draft-vocab``) the head takes the earlier head's draft
    vocabulary as it is, which must have as many ids as this run's.

    Returns:
        None, or one sentence why not (nothing to read there, a damaged file, another kind,
        other layer shapes, or with ``keep_vocab`` a vocabulary of another size); ``drafter``
        is unchanged then.
    """
    import torch
    saved, problem = _read_init(folder)
    if problem:
        return problem
    mine = drafter.state_dict()
    if set(saved) != set(mine):
        return (f"--init {folder}: its drafter is another kind or layout "
                f"({len(set(saved) ^ set(mine))} weights differ by name)")
    if keep_vocab and "d2t" in mine and saved["d2t"].shape != mine["d2t"].shape:
        return (f"--init {folder} --keep-draft-vocab: its draft vocabulary has "
                f"{saved['d2t'].numel():,} ids, this run's --draft-vocab {mine['d2t'].numel():,}")
    remap = ("d2t" in mine and not keep_vocab
             and not torch.equal(saved["d2t"].to(mine["d2t"].device), mine["d2t"]))
    vocab_keys = {"d2t", "t2d", "lm_head.weight"} if remap else set()
    for name, value in saved.items():
        if name not in vocab_keys and value.shape != mine[name].shape:
            return (f"--init {folder}: its weight {name} is {tuple(value.shape)}, this run's "
                    f"{tuple(mine[name].shape)} (another target or recipe)")
    if remap and saved["lm_head.weight"].shape[1:] != mine["lm_head.weight"].shape[1:]:
        return (f"--init {folder}: its lm_head rows are {saved['lm_head.weight'].shape[1]} wide, "
                f"this run's {mine['lm_head.weight'].shape[1]} (another target)")
    if not remap:
        drafter.load_state_dict(saved)
        return None
    from ..core.drafters.vocab import target_ids  # lazy: imports torch; --help stays fast
    theirs_ids = target_ids(saved["d2t"]).cpu()
    ours_ids = target_ids(mine["d2t"]).cpu()
    row_of = torch.full((int(max(theirs_ids.max(), ours_ids.max())) + 1,), -1, dtype=torch.long)
    row_of[theirs_ids] = torch.arange(theirs_ids.numel())
    rows = row_of[ours_ids]  # (Vd,) the earlier head's row of each of our draft ids, -1 if new
    shared = rows >= 0
    head = mine["lm_head.weight"].clone()
    head[shared.to(head.device)] = saved["lm_head.weight"][rows[shared]].to(head)
    drafter.load_state_dict({**saved, "d2t": mine["d2t"], "t2d": mine["t2d"], "lm_head.weight": head})
    print(f"--init: {int(shared.sum()):,} of this run's {ours_ids.numel():,} draft ids carried over "
          f"from the earlier head's {theirs_ids.numel():,}; {int((~shared).sum()):,} new ids start "
          "from the target's head rows")
    return None


def check_init(args: argparse.Namespace) -> None:
    """Refuse ``--init`` before any work (nothing loaded, generated or written): no checkpoint
    there, a damaged one, or another kind of drafter.

    Raises:
        SystemExit(2) with one sentence.
    """
    keep = getattr(args, "keep_draft_vocab", False)
    if keep and (args.init is None or args.kind != "eagle3"):
        fail("--keep-draft-vocab keeps the draft vocabulary of the EAGLE-3 head given with "
             "--init DIR; without --init (or for a DFlash drafter, which has none) it means nothing")
    if args.init is None:
        return
    folder = args.init
    saved, problem = _read_init(folder)
    if problem:
        fail(problem)
    theirs = ("dspark" if any(k.startswith(("markov_head.", "confidence_head.")) for k in saved)
              else "eagle3" if "d2t" in saved else "dflash")
    if theirs != args.kind:
        fail(f"--init {folder}: it holds {_a(KIND_NAMES[theirs])}, this run trains "
             f"{_a(KIND_NAMES[args.kind])}: give --kind {theirs}")
    if keep and saved["d2t"].numel() != args.draft_vocab:
        fail(f"--init {folder} --keep-draft-vocab: its draft vocabulary has "
             f"{saved['d2t'].numel():,} ids; give --draft-vocab {saved['d2t'].numel()}")


def out_kind(out: Path) -> str | None:
    """Which drafter kind the run saved in ``out`` trains (``eagle3``/``dflash``/``dspark``),
    from its ``recipe.json`` (a DFlash recipe has ``block_size``, a DSpark one ``block_size`` and
    ``markov_rank``, an EAGLE-3 one ``ttt_steps``), else from ``train.json``'s ``kind``; None for
    a folder without either.

    Raises:
        SystemExit(2): a recipe.json that cannot be read as one (one sentence).
    """
    recipe = out / "recipe.json"
    if recipe.is_file():
        try:
            saved = json.loads(recipe.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            saved = None
        if isinstance(saved, dict) and ("block_size" in saved) != ("ttt_steps" in saved):
            if "block_size" in saved:
                return "dspark" if "markov_rank" in saved else "dflash"
            return "eagle3"
        fail(f"--out {out}: its recipe.json is not one train-draft wrote (damaged or another "
             "program's); give another --out")
    info = out / "train.json"
    if info.is_file():
        try:
            kind = json.loads(info.read_text()).get("kind")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            kind = None
        if kind in KIND_NAMES:
            return kind
    return None


def check_inputs(args: argparse.Namespace) -> list[dict]:
    """The rows of the prompts file, once ``--out``, ``--prompts`` and ``--init`` are known to be
    usable.

    Raises:
        SystemExit(2), with one sentence naming the file (and line): ``--out`` is a file, a
            non-empty folder of something else, or the run of another drafter kind (its
            ``recipe.json``: nothing of it is overwritten); the prompts file is missing, a folder, not
            UTF-8 text, has a line that is not a JSON object with a non-empty "prompt", or
            holds no training prompt; ``--answers-dir`` (when answers are generated) is a file
            or a folder that cannot be written or created.
    """
    from ..services.training import data, prompt_set  # lazy: imports torch; --help stays fast
    out = args.out
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file, not a folder: give a folder for the drafter (it is created "
             "if missing)")
    if out.exists() and any(out.iterdir()) and not args.resume and not (out / "recipe.json").exists():
        fail(f"{out} is not empty; give --resume to continue a run there, or another folder")
    theirs = out_kind(out)
    if theirs is not None and theirs != args.kind:
        fail(f"--out {out} holds the run of {_a(KIND_NAMES[theirs])} (its recipe.json), this "
             f"run trains {_a(KIND_NAMES[args.kind])}: give another --out, or --kind {theirs} to "
             f"continue that one")
    path = Path(args.prompts or prompt_set.PROMPTS_FILE)
    if not path.exists():
        fail(f"--prompts {path}: no such file")
    if path.is_dir():
        fail(f"--prompts {path} is a folder, not a JSONL file of {{\"prompt\": ...}} lines")
    try:
        rows = prompt_set.load(path)
    except UnicodeDecodeError as exc:
        fail(f"--prompts {path} is not UTF-8 text (byte {exc.start}): give a JSONL file")
    except ValueError as exc:  # "<path>:<line>: expected a JSON object with a non-empty "prompt""
        fail(f"--prompts {exc}")
    except OSError as exc:
        fail(f"--prompts {path} cannot be read ({exc.strerror or exc})")
    if getattr(args, "scale_prompts", False):
        from ..services.training import prompt_scale
        try:
            rows = rows + [{**r, "split": "train"} for r in prompt_scale.load_scale()]
        except prompt_scale.PromptSetError as exc:
            fail(str(exc))
    if not data.split_rows(rows, heldout=False):
        fail(f"--prompts {path} holds no training prompts ({len(rows)} rows, none outside the "
             "held-out split): training on nothing would save an untrained drafter")
    answers_dir = getattr(args, "answers_dir", None)
    if answers_dir is not None and getattr(args, "answers", None) is None:
        from ..services.training import shards  # lazy: imports torch; --help stays fast
        problem = shards.folder_problem(answers_dir)
        if problem:
            fail(f"--answers-dir {answers_dir} {problem}: the answers generated would have "
                 "nowhere to go; give a folder that can be written")
    check_init(args)
    return rows


def save(kind: str, drafter, out: Path, recipe, target, answers, timings, state, started,
         where: dict) -> dict:
    """Write the drafter folder and train.json (``where``: where generation, capture and
    training ran); returns the train.json content."""
    from ..core.drafters import eagle_io  # lazy: imports torch; --help stays fast
    from ..services.training import dflash_train  # lazy: imports torch; --help stays fast
    info = {
        "recipe": json.loads(_recipe_json(recipe)), "target": target.spec, "kind": kind,
        "data": {"answers": len(answers), "answer_tokens": sum(len(a["ids"]) - a["n_prompt"] for a in answers),
                 "prompts": len({a["prompt_index"] for a in answers})},
        "timings_s": {**timings, "total_s": time.time() - started},
        "stages_ran_on": where,
        "machine": _machine(), "versions": _versions(),
        "summary": None if state is None else {
            "steps": state.step, "epochs": state.epoch, "final_loss": state.losses[-1] if state.losses else None,
            "final_top1_by_step": state.accuracy[-1] if state.accuracy else None,
            "train_seconds": state.seconds},
        "losses": [] if state is None else state.losses,
    }
    if kind == "eagle3":
        eagle_io.save_head(drafter, out, dtype=torch_bf16(), speculative_tokens=recipe.ttt_steps + 1)
    elif kind == "dspark":
        from ..services.training import dspark_train  # lazy: imports torch; --help stays fast
        dspark_train.save(drafter, out, dtype=torch_bf16(), verifier=_hub_id(target))
    else:
        from ..models.learned import BUILTIN_ALIASES  # lazy: imports torch; --help stays fast
        hub_id = BUILTIN_ALIASES.get(target.spec, (target.spec,))[0]  # not builtin: or a path
        dflash_train.save(drafter, out, target, dtype=torch_bf16(), verifier=hub_id)
    (out / "train.json").write_text(json.dumps(info, indent=1))
    return info


KIND_NAMES = {"eagle3": "EAGLE-3 head", "dflash": "DFlash drafter", "dspark": "DSpark drafter"}
SAVED_LAYOUTS = {"eagle3": "speculators layout", "dflash": "transformers layout; z-lab layout in zlab/",
                 "dspark": "speculators layout"}


def _a(name: str) -> str:
    return ("an " if name[0] in "AEIOU" else "a ") + name


def _hub_id(target) -> str:
    """The target's name recorded as a saved drafter's verifier: its hub id, never builtin: or a
    path on this machine."""
    from ..models.learned import verifier_name  # lazy: imports torch; --help stays fast
    return verifier_name(target)


BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def slow_bf16_note(device: str, train_dtype: str) -> str | None:
    """A warning when ``--train-dtype bfloat16`` trains on an x86 CPU without bfloat16
    instructions (none of :data:`BF16_FLAGS`): torch then emulates the products, and on a
    2-core AMD EPYC with AVX2 only a (1024, 576) x (576, 1536) bfloat16 matmul took 84 ms
    against 17 ms in float32. None elsewhere (GPUs, Arm, CPUs with AVX512-BF16 or AMX)."""
    if train_dtype != "bfloat16" or not device.startswith("cpu"):
        return None
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    flags = machine.cpu_flags().split()
    # a real x86 flags list (Linux) names sse2; elsewhere cpu_flags() is platform.machine() only,
    # which says nothing about bfloat16
    if "sse2" not in flags or any(f in flags for f in BF16_FLAGS):
        return None
    return ("note: --train-dtype bfloat16 on a CPU without AVX512-BF16 or AMX: torch emulates "
            "bfloat16 here, which can be several times slower than float32 (the default)")


def torch_bf16():
    import torch
    return torch.bfloat16


def heldout_prompts(rows: list[dict], n: int) -> list[dict]:
    """``n`` held-out rows, round-robin over tasks."""
    from ..services.training import data  # lazy: imports torch; --help stays fast
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
    from ..core.drafters.dflash import LoadedDFlash  # lazy: imports torch; --help stays fast
    from ..models.learned import LoadedEagle3  # lazy: imports torch; --help stays fast
    from ..services.pipeline import Pipeline  # lazy: imports torch; --help stays fast
    from ..services.training.report import evaluate, write  # lazy: imports tqdm (--help)
    picked = heldout_prompts(rows, n)
    if kind == "eagle3":
        learned = LoadedEagle3(str(out), drafter, {"layout": "speculators", "missing": []})
    elif kind == "dspark":
        # lazy: imports torch; --help stays fast
        from ..core.drafters.dspark import LoadedDSpark, min_survival_setting
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
