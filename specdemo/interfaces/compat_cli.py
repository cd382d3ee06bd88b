"""``check`` subcommand: can this draft serve this target? (the verdicts:
``checks/compat.py``)"""

from __future__ import annotations

import argparse
import json

from ..checks import compat, inputs
from ..models.loading import ModelLoadError, check_local
from ..services import startup


def register(sub) -> None:
    """Add ``check --target T --draft D [--json]``: exit status 0 / 0 / 2 for the verdicts; 2 also
    for a spec refused at once (``specdemo.checks.inputs``, the same words as run and the /race
    API: an unknown name, a missing path, a hub id not cached while the hub is unreachable,
    all before any step line or model, as ``run`` refuses them) and for a local spec that is
    not a model (``models.check_local``: run's words and status); 1 when a tokenizer or the
    target's config cannot be read (a damaged cached model, a hub repository that is not a
    model): not checked, which is neither a yes nor a no. What it reads before the verdict
    (tokenizers, a config, a learned drafter's target) is printed to stderr as a start-up step
    (``services.startup.check_step``); stdout holds the verdict only."""
    parser = sub.add_parser("check", help="can this draft serve this target? (exit 0 / 0 / 2)")
    parser.add_argument("--target", required=True, type=inputs.checked(inputs.target, "target"),
                        help="HF id, local dir, .gguf file or builtin:<name>")
    parser.add_argument("--draft", required=True, type=inputs.checked(inputs.draft, "draft"),
                        help="a model like --target, ngram / self / early-exit:N / mtp, or a "
                             "learned drafter folder or hub id (EAGLE-3, DFlash, DSpark, Gemma 4 "
                             "assistant)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow code from the model repositories to run (off by default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=cmd_check)


class _NotChecked(Exception):
    """No verdict: the message (for stdout) and the exit status (2 refused, 1 unreadable)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _refuse_at_once(args: argparse.Namespace) -> None:
    """What ``run`` refuses before its first step line (``compat.before_load``): a hub id of
    the target or of a model draft (``args.draft``, a ``DraftSpec``) that is not in the local
    Hugging Face cache while the hub cannot be reached. No torch, no model read: one sentence.

    Raises:
        _NotChecked: status 2, the sentence ``run`` says.
    """
    try:
        inputs.obtainable("target", args.target)
        if args.draft.is_model:
            inputs.obtainable("draft", args.draft)
    except inputs.InputError as exc:
        raise _NotChecked(str(exc), 2) from exc


def _verdict(args: argparse.Namespace) -> compat.Verdict:
    """The verdict, after the refusals ``run`` makes before loading (``args.draft``: the
    ``DraftSpec`` of ``--draft``).

    Raises:
        _NotChecked: status 2 for a local spec that is not a model, 1 when a tokenizer or
            config cannot be read.
    """
    local = [args.target]
    if args.draft.is_model:
        from ..models.learned import is_learned  # deferred: imports torch (after the step line)
        local += [] if is_learned(args.draft) else [args.draft]
    try:
        for spec in local:  # what run refuses before loading: the same words, status 2
            check_local(spec)
    except ModelLoadError as exc:
        raise _NotChecked(str(exc), 2) from exc
    try:
        return compat.check_specs(args.target, args.draft, trust_remote_code=args.trust_remote_code)
    except Exception as exc:  # ModelLoadError, OSError from a bad path: report, do not trace
        # an early-exit check reads the target's config, and its message says so
        message = str(exc) if args.draft.is_early_exit or str(exc).startswith("could not") \
            else f"cannot load a tokenizer: {exc}"
        raise _NotChecked(message, 1) from exc


def cmd_check(args: argparse.Namespace) -> int:
    try:  # what it reads is a start-up step on stderr, as run and compare print theirs
        _refuse_at_once(args)
        with startup.printed(), startup.STEPS.step(*startup.check_step(args.target, args.draft)):
            verdict = _verdict(args)
    except _NotChecked as exc:
        print(json.dumps({"target": args.target, "draft": args.draft, "error": str(exc)})
              if args.json else f"error: {exc}")
        return exc.status
    if args.json:
        print(json.dumps({"target": args.target, "draft": args.draft, **verdict.to_dict()}))
    else:
        print(f"target {args.target}, draft {args.draft}: {verdict.status}")
        for reason in verdict.reasons:
            print(f"  - {reason}")
    return verdict.exit_status
