"""A ``train-draft`` run's recipe: built from its flags, or read back from ``recipe.json`` on
``--resume`` (the saved recipe wins, and the command is told which of its settings it overrode)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

def make_recipe(args, target, recipe_file: Path, counts=None, temperature=0.7):
    """The recipe of this run (the saved one on --resume)."""
    # lazy: imports torch; --help stays fast
    from ...core.drafters.features import eagle3_default_layers, num_layers
    # lazy: imports torch; --help stays fast
    from . import dflash_train, dspark_train, train
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



def recipe_json(recipe) -> str:
    out = asdict(recipe)
    if hasattr(recipe, "block_size"):
        out["feature_layers"] = list(recipe.feature_layers)
    out["temperature_note"] = TEMPERATURE_NOTE  # for people; dropped when the recipe is read back
    return json.dumps(out, indent=1)

