"""Command line: ``python -m specdemo {run,compare,bench,check,presets,costs,serve}``.

Each subcommand lives in the module that owns it; a module takes part by defining
``register(subparsers)`` which adds its parser and sets ``func`` (args -> exit status).
Imports are lazy: ``--help`` loads no model and imports no torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that define ``register(subparsers)``; one line each.
COMMAND_MODULES = (
    "specdemo.decode_cli",
    "specdemo.presets",
    "specdemo.compat",
    "specdemo.bench.cli",
    "specdemo.training.cli",
    "specdemo.costs",
    "specdemo.serve",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specdemo",
                                     description="Plain vs speculative decoding, measured honestly.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def quiet_library_logs() -> None:
    """Silence torch's notice, printed when transformers imports torchao, that two torchao enums
    are registered twice (``torch.utils._pytree``): a warning about library internals that new
    users read as an error."""
    import logging
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    quiet_library_logs()
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
