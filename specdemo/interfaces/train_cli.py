"""``python -m specdemo train-draft``: train an EAGLE-3 head, a DFlash or a DSpark block drafter
for a target on this machine; and ``python -m specdemo shards [DIR]``: summarise a folder of
answer shards.

This module holds the flags and the printing; the pipeline is
:mod:`specdemo.services.training.run` (its stages in that module's docstring), whose one error,
``TrainingError``, is printed here as ``error: <sentence>`` with its exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..checks import inputs
from ..services.presets import default_target
from .decode_cli import checked, fail


def _count(flag: str):
    """An argparse type: a whole number >= 1 (specdemo.checks.inputs' words, exit status 2)."""
    return checked(inputs.number, flag, minimum=1, integer=True)


def register(sub) -> None:
    p = sub.add_parser("train-draft",
                       help="train an EAGLE-3, DFlash or DSpark drafter for a target on this machine")
    p.add_argument("--target", default=default_target(),
                   help="the target the drafter is trained for: builtin:NAME, a local folder or a "
                        "hub id (default: %(default)s, the default preset's)")
    p.add_argument("--out", required=True, type=Path, help="output folder (resumable)")
    p.add_argument("--kind", default="eagle3", choices=["eagle3", "dflash", "dspark"],
                   help="eagle3 (default), dflash, or dspark (DFlash's block drafter with a Markov "
                        "head and a confidence head, reading the target layers EAGLE-3 reads)")
    _data_flags(p)
    _drafter_flags(p)
    _run_flags(p)
    p.set_defaults(func=cmd_train)
    s = sub.add_parser("shards", help="summarise a folder of answer shards (train-draft "
                                      "--answers-dir) as JSON")
    s.add_argument("directory", nargs="?", type=Path, default=None,
                   help="the shard folder (default: assets/train/answers in the checkout)")
    s.set_defaults(func=cmd_shards)


def _data_flags(p) -> None:
    """The training data: prompts, answers (generated here, by a server, or given), shards."""
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


def _drafter_flags(p) -> None:
    """The drafter's shape and the held-out report."""
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


def _run_flags(p) -> None:
    """How the run trains: feature capture, batches, learning rate, device, resuming."""
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


def _temperatures(text: str) -> float | tuple[float, ...]:
    """``--temperatures``: one float, or a tuple of floats used in turn (refused when not > 0)."""
    try:
        temps = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise SystemExit(f"error: --temperatures {text!r}: expected numbers separated by commas") from None
    if not temps or any(not t > 0 for t in temps):
        raise SystemExit(f"error: --temperatures {text!r}: every temperature must be above 0")
    return temps[0] if len(temps) == 1 else temps


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


def cmd_train(args: argparse.Namespace) -> int:
    """``train-draft``: the pipeline (``services.training.run.run``) with the flags parsed;
    exit status 0, 2 with ``error: <why>`` for a refusal, 130 when interrupted."""
    from ..services.training.errors import TrainingError  # lazy: --help stays fast
    from ..services.training.run import run  # lazy: imports torch; --help stays fast
    temperature = _temperatures(args.temperatures)  # refused before any work
    ks, sizes = _k_list(args.report_k), _fractions(args.data_sizes)
    try:
        run(args, temperature, ks, sizes)
    except TrainingError as exc:
        if exc.status != 130:
            fail(str(exc))
        print(f"\n{exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:  # outside the training loop, which saves its own checkpoint
        print(f"\ninterrupted: what was written to {args.out} so far (answers, feature shards) "
              "is kept; run the same command with --resume to continue", file=sys.stderr)
        return 130
    return 0


def cmd_shards(args: argparse.Namespace) -> int:
    """``shards [DIR]``: ``services.training.shards.summary`` of DIR as JSON; exit status 0, or
    2 after one line naming a damaged shard or a folder that is not there."""
    from ..services.training import shards  # lazy: imports torch; --help stays fast
    directory = args.directory or shards.SHARDS_DIR
    if not directory.is_dir():
        fail(f"{directory} is not a folder")
    try:
        print(json.dumps(shards.summary(directory), indent=1))
    except shards.ShardError as exc:
        fail(str(exc))
    return 0
