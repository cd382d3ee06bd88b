"""``train-draft``'s pipeline: the target answers the training prompts (or ``--answers FILE``
brings answers generated elsewhere, or ``--answers-dir`` shards hold some) -> the target's
features are captured -> the drafter is trained -> saved (EAGLE-3: speculators layout; DFlash:
transformers' layout and z-lab's in ``zlab/``; DSpark: speculators layout) with ``train.json``
-> a held-out report against ngram and plain decoding (mean acceptance length and held-out
speed). Each stage is resumable and has a progress bar. ``--data-sizes`` trains and reports at
several fractions of the data and writes the curve (``data_size_curve.{json,md,png}``).

:func:`run` takes the command's settings (``args``: an object with the attributes of
``train-draft``'s flags, e.g. its ``argparse.Namespace``) and raises :class:`TrainingError`,
one sentence, for everything it refuses; what it prints is progress and results.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ...core import TARGET_BACKENDS
from ...models import loading
from .answer_shards import answers_from_shards, answers_to_shards
from .errors import TrainingError
from .inputs import KIND_NAMES, check_inputs, check_space, slow_bf16_note
from .recipes import make_recipe, recipe_json
from .report import report, write_curve
from .saving import SAVED_LAYOUTS, hub_id, save
from .warm_start import warm_start


def generate_backend(args, target) -> str:
    """The backend that generates the answers: ``--generate-backend``, with ``auto`` resolved
    (native-w8a8 where the native forward runs the target, else transformers); written back
    to ``args`` so that train.json names it."""
    if args.generate_backend == "auto":
        # lazy: imports torch; --help stays fast
        from ...models.native import unavailable_reason
        runs = target.device.type == "cpu" and unavailable_reason(target) is None
        args.generate_backend = "native-w8a8" if runs else "transformers"
    return args.generate_backend


def stopped_after(stage: str, where: Path, out: Path) -> str:
    """What ``--stop-after STAGE`` prints: where the stage's output is and how to go on."""
    return (f"{stage} are in {where}; to go on, run the same command without --stop-after "
            f"and with --resume (it keeps the recipe saved in {out / 'recipe.json'})")


def run(args, temperature: float | tuple[float, ...], ks: list[int], sizes: list[float]) -> None:
    """Train a drafter as ``args`` says (the stages of the module docstring).

    Args:
        args: ``train-draft``'s settings (the attributes of its flags).
        temperature: the sampling temperature of answers 1.. (a tuple: used in turn).
        ks: the held-out report's draft lengths (the first is the headline).
        sizes: fractions of the answers to train at (the last, usually 1.0, into ``--out``).
    Raises:
        TrainingError: an input refused (before any work where it can be told then), a stage
            that cannot run here, or an interrupted training (status 130; checkpoint saved).
    """
    from . import data, train  # lazy: imports torch
    rows = check_inputs(args)  # before any work: nothing loaded, nothing written
    out = args.out
    if args.answers is not None and not args.answers.is_file():
        raise TrainingError(f"--answers {args.answers} is not a file")
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        target = loading.load_model(args.target, args.device, "float32")
    except loading.ModelLoadError as exc:
        raise TrainingError(str(exc)) from None
    train_rows = data.split_rows(rows, heldout=False)[:args.max_prompts]
    recipe_file = out / "recipe.json"
    recipe = make_recipe(args, target, recipe_file, temperature=temperature)
    recipe_file.write_text(recipe_json(recipe))
    if args.kind == "eagle3":
        try:  # seconds now rather than a failure after an hour of generation and capture
            train.preflight(target, recipe)
        except RuntimeError as exc:
            raise TrainingError(f"training would fail on {target.device}: {exc}") from None
    timings = {}
    where = _answers_stage(args, target, train_rows, out, recipe, timings)
    if args.stop_after == "answers":
        print(stopped_after("answers", out / data.ANSWERS, out))
        return
    answers = data.load_answers(out)
    shards = _features_stage(args, target, answers, recipe, out, timings, where)
    if args.stop_after == "features":
        print(stopped_after("features", out / data.FEATURES, out))
        return
    import torch
    # memory-mapped: 1.2M answer tokens of EAGLE-3 features are ~8 GB; batches read what they use
    all_items = ([{"ids": torch.tensor(a["ids"], dtype=torch.int32), "n_prompt": a["n_prompt"]} for a in answers]
                 if getattr(args, "online_features", False)
                 else [x for s in shards for x in torch.load(s, weights_only=False, mmap=True)])
    if args.kind in ("dflash", "dspark") and recipe.mask_token_id < 0:
        from . import dflash_train  # lazy: imports torch
        recipe.mask_token_id = dflash_train.pick_mask_token(
            train.token_counts(all_items, target.vocab_size), target.eos_token_ids)
    recipe_file.write_text(recipe_json(recipe))
    sized = _Run(args, target, rows, recipe, timings, where, started, ks)
    curve = []
    for size in sizes:
        folder = out if size == sizes[-1] else out / f"size-{size:g}"
        n = max(1, round(size * len(all_items)))
        picked = sorted(data.shuffled(range(len(all_items)), recipe.seed)[:n])
        point = sized.train_at(folder, [all_items[i] for i in picked], [answers[i] for i in picked])
        if point is not None:
            curve.append({"fraction": size, **point})
    if len(sizes) > 1 and curve:
        print(write_curve(out, curve, args.kind).read_text())


def _answers_stage(args, target, train_rows: list[dict], out: Path, recipe, timings: dict) -> dict:
    """The answers in ``out``: copied from ``--answers``, else the shards' of ``--answers-dir``
    plus what the target (or ``--generate-endpoint``) generates; returns where they came from
    (train.json's ``stages_ran_on``)."""
    from . import data  # lazy: imports torch
    t0 = time.time()
    budget_s = None if args.generate_minutes is None else 60 * args.generate_minutes
    if args.answers_dir is not None and args.answers is None:
        answers_from_shards(args, target, train_rows, out, recipe)
    if args.answers is not None:
        import filecmp
        import shutil
        kept_answers = out / data.ANSWERS
        if not kept_answers.exists() or not filecmp.cmp(args.answers, kept_answers, shallow=False):
            if kept_answers.exists():  # e.g. more answers generated since: shards that still fit are kept
                print(f"--answers differs from the copy in {out}: using the new file")
            shutil.copyfile(args.answers, kept_answers)
    elif budget_s == 0:  # --generate-minutes 0: train on the answers at hand (no prompt is even tokenized)
        print("--generate-minutes 0: no answers generated; training on those at hand", file=sys.stderr)
    elif args.generate_endpoint:
        try:
            data.generate_answers_endpoint(args.generate_endpoint, target.tokenizer, train_rows,
                                           out, recipe.answers_per_prompt, recipe.temperature,
                                           recipe.max_new_tokens, set(target.eos_token_ids),
                                           concurrency=args.generate_batch, budget_s=budget_s)
        except RuntimeError as exc:  # the answers written so far are kept for --resume
            raise TrainingError(f"--generate-endpoint: {exc}") from None
    elif generate_backend(args, target) != "transformers":
        from ...models.native import NativeError  # lazy: imports torch
        try:
            data.generate_answers_native(target, train_rows, out, recipe.answers_per_prompt,
                                         recipe.temperature, recipe.max_new_tokens,
                                         slots=args.generate_batch, weights=TARGET_BACKENDS[args.generate_backend].weights,
                                         budget_s=budget_s)
        except NativeError as exc:
            raise TrainingError(f"--generate-backend {args.generate_backend}: {exc}") from None
    else:
        data.generate_answers(target, train_rows, out, recipe.answers_per_prompt, recipe.temperature,
                              recipe.max_new_tokens, batch_size=args.generate_batch, budget_s=budget_s)
    timings["generate_s"] = time.time() - t0
    if args.answers_dir is not None and args.answers is None:
        answers_to_shards(args, target, train_rows, out, recipe)
    return {"generate": ("an answers file given with --answers" if args.answers is not None
                         else "llama-server at --generate-endpoint" if args.generate_endpoint
                         else f"the target on {target.device}, {args.generate_backend} backend")}


def _features_stage(args, target, answers: list[dict], recipe, out: Path, timings: dict,
                    where: dict) -> list[Path]:
    """The feature shards of ``answers`` (captured, or kept from an earlier run; none with
    ``--online-features``, which computes them during training), after the answers' ids and the
    disk are checked; notes in ``where`` where capture and training run."""
    from . import data  # lazy: imports torch
    if not answers:
        raise TrainingError(f"no answers to train on in {out / data.ANSWERS}")
    beyond = max((max(a["ids"], default=0) for a in answers), default=0)
    if beyond >= target.vocab_size:  # --answers of another tokenizer: refused before capture
        raise TrainingError(
            f"{args.answers or out / data.ANSWERS}: an answer's ids hold {beyond}, beyond the "
            f"{target.vocab_size:,}-id vocabulary of {args.target}: the answers were made with "
            "another tokenizer")
    online = getattr(args, "online_features", False)
    if online and args.kind != "eagle3":
        raise TrainingError(f"--online-features trains EAGLE-3 heads only, not --kind {args.kind}")
    hidden = target.model.config.get_text_config().hidden_size
    if not online:
        check_space(sum(len(a["ids"]) for a in answers), hidden * (len(recipe.feature_layers) + 1), out)
    t0 = time.time()
    kept = len(list((out / data.FEATURES).glob("*.pt"))) if (out / data.FEATURES).is_dir() else 0
    try:
        shards = [] if online else data.capture_features(target, answers, recipe.feature_layers, out,
                                                         backend=args.capture_backend)
    except loading.ModelLoadError as exc:  # native unavailable here (no compiler, another architecture)
        raise TrainingError(f"--capture-backend {args.capture_backend}: {exc}") from None
    timings["capture_s"] = time.time() - t0
    device = str(target.device)
    on = (f"the target on {device}" if args.capture_backend == "transformers"
          else "the target on the native backend (int8 weights and activations)"
          if args.capture_backend == "native-w8a8" else "the target on the native backend (BF16 weights)")
    where["capture"] = (f"the target on {device}, batch by batch during training (online)" if online
                        else on if kept < len(shards)
                        else "kept from an earlier run (feature shards in the folder)")
    where["train"] = f"{device}, {recipe.train_dtype}"
    note = slow_bf16_note(device, recipe.train_dtype)
    if note:
        print(note, file=sys.stderr)
    if args.init is not None:  # the folder's name only: no machine paths in what may ship
        where["train"] += (f", started from the drafter of an earlier run ({args.init.name})"
                           + (", keeping its draft vocabulary" if args.keep_draft_vocab else ""))
    return shards


class _Run:
    """What training at each data size shares: the settings, the target, the recipe, the
    timings and notes for train.json."""

    def __init__(self, args, target, rows: list[dict], recipe, timings: dict, where: dict,
                 started: float, ks: list[int]) -> None:
        self.args, self.target, self.rows, self.recipe = args, target, rows, recipe
        self.timings, self.where, self.started, self.ks = timings, where, started, ks

    def new_drafter(self, items: list):
        """A fresh drafter of the run's kind (``--init``: started from that drafter)."""
        from . import dflash_train, dspark_train, train  # lazy: imports torch
        args, target, recipe = self.args, self.target, self.recipe
        if args.kind == "eagle3":
            drafter = train.new_head(target, recipe, train.token_counts(items, target.vocab_size))
        elif args.kind == "dspark":
            drafter = dspark_train.new_drafter(target, recipe, verifier=hub_id(target))
        else:
            drafter = dflash_train.new_drafter(target, recipe)
        if args.init is not None:
            problem = warm_start(drafter, args.init, keep_vocab=args.keep_draft_vocab)
            if problem:
                raise TrainingError(problem)
        return drafter

    def train_at(self, folder: Path, items: list, subset: list[dict]) -> dict | None:
        """Train on ``items`` (the features of the answers ``subset``), save into ``folder``,
        report on held-out prompts; returns the curve's point (None without a report).

        Raises:
            TrainingError: status 130 when interrupted (checkpoint and drafter saved).
        """
        from . import dflash_train, dspark_train, train  # lazy: imports torch
        args, target, recipe, timings = self.args, self.target, self.recipe, self.timings
        drafter = self.new_drafter(items)
        trainer = {"eagle3": train.train, "dflash": dflash_train.train,
                   "dspark": dspark_train.train}[args.kind]
        t0 = time.time()
        try:
            state = trainer(drafter, target, items, recipe, folder, resume=args.resume,
                            max_steps=args.max_steps)
        except KeyboardInterrupt:
            save(args.kind, drafter, folder, recipe, target, subset, timings, None, self.started,
                 self.where)
            raise TrainingError(f"interrupted: checkpoint and a usable drafter saved in {folder}; "
                                "--resume continues", status=130) from None
        timings["train_s"] = time.time() - t0
        info = save(args.kind, drafter, folder, recipe, target, subset, timings, state,
                    self.started, self.where)
        print(f"saved the {KIND_NAMES[args.kind]} in {folder} ({SAVED_LAYOUTS[args.kind]})")
        if not args.report_prompts:
            return None
        t0 = time.time()
        path, results = report(args.kind, folder, target, drafter, self.rows, args.report_prompts,
                               info, self.ks)
        info["timings_s"]["report_s"] = time.time() - t0
        info["timings_s"]["total_s"] = time.time() - self.started
        info["stages_ran_on"]["report"] = (f"the target on {target.device} (transformers, "
                                           "float32: the reference)")
        (folder / "train.json").write_text(json.dumps(info, indent=1))
        print(path.read_text())
        return {"answers": len(items), "answer_tokens": info["data"]["answer_tokens"],
                **{key: results[args.kind][key] for key in
                   ("mean_acceptance_length", "acceptance_rate", "tokens_per_s", "speedup",
                    "draft_s_per_round")},
                "folder": str(folder)}
