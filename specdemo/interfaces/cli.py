"""Command line: ``python -m specdemo {run,compare,bench,check,presets,costs,serve,train-draft,shards}``.

Each subcommand lives in a module of ``interfaces/`` (``<concern>_cli.py``, the logic below
it in ``services/`` or ``checks/``); a module takes part by defining
``register(subparsers)`` which adds its parser and sets ``func`` (args -> exit status).
Imports are lazy: ``--help`` loads no model and imports no torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..checks.inputs import closest_name

# Modules that define ``register(subparsers)``; one line each.
COMMAND_MODULES = (
    "specdemo.interfaces.decode_cli",
    "specdemo.interfaces.presets_cli",
    "specdemo.interfaces.compat_cli",
    "specdemo.interfaces.bench_cli",
    "specdemo.interfaces.train_cli",
    "specdemo.interfaces.costs_cli",
    "specdemo.interfaces.serve_cli",
)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line, ``error: <why>``, then where the help is
    (``(python -m specdemo compare --help)``), exit status 2: no usage block. Subcommand parsers
    are of this class too (``add_subparsers`` uses the parent's class)."""

    def error(self, message: str):
        refuse(message, self.prog)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, after refusing a mistyped long flag with the one it looks like
        (``bench --draft-lenght`` ... did you mean --draft-lengths?; ``--hlep``: --help?):
        argparse names no flag it does not know, and only after its other refusals (a missing
        ``--out``). A subcommand's parser checks all its arguments, the top one those before
        the subcommand."""
        given = sys.argv[1:] if args is None else list(args)
        if self._subparsers is not None:  # the top parser: its own flags come before the command
            given = given[:next((i for i, a in enumerate(given) if not a.startswith("-")),
                                len(given))]
        self._refuse_unknown_flags(given)
        return super().parse_known_args(args, namespace)

    def _refuse_unknown_flags(self, args: list[str]) -> None:
        known = [flag for flag in self._option_string_actions if flag.startswith("--")]
        for arg in args:
            if arg == "--":  # the rest are values
                return
            flag = arg.split("=", 1)[0]
            if not flag.startswith("--") or len(flag) < 3 or any(k.startswith(flag) for k in known):
                continue  # a value, a known flag or argparse's abbreviation of one
            close = closest_name(flag, known)
            self.error(f"unrecognized argument: {flag}"
                       + (f" (did you mean {close}?)" if close else ""))

    def _check_value(self, action, value):
        """argparse's refusal of a value outside a flag's choices (or of an unknown subcommand),
        plus the one it looks like a typo of: ``--backend nativ`` ... (did you mean native?)."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            close = closest_name(str(value), [str(c) for c in action.choices or ()])
            if not close:
                raise
            raise argparse.ArgumentError(action, f"{exc.message} (did you mean {close}?)") from None


def refuse(message: str, prog: str = "python -m specdemo"):
    """Print ``error: message`` and the help pointer for ``prog`` on stderr; exit status 2."""
    print(f"error: {message}\n({prog} --help)", file=sys.stderr)
    raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m specdemo",
                                     description="Plain vs speculative decoding, measured honestly.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _not_torchao_optional_kernel(record) -> bool:
    """False for torchao's "Failed to load .../_C_*.so" warnings (logging filter)."""
    message = record.getMessage()
    return not (message.startswith("Failed to load ") and "/_C_" in message.replace("\\", "/"))


def quiet_library_logs() -> None:
    """Silence library notices that new users read as errors but that change nothing here:

    - torch's notice, printed when transformers imports torchao, that two torchao enums are
      registered twice (``torch.utils._pytree``);
    - torchao's "Failed to load .../_C_mxfp8...so" / "_C_cutlass_90a" warnings: optional GPU
      kernels (MX formats, Hopper CUTLASS) that this app never calls; other torchao warnings
      still show.
    """
    import logging
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    torchao = logging.getLogger("torchao")
    if _not_torchao_optional_kernel not in torchao.filters:
        torchao.addFilter(_not_torchao_optional_kernel)


def main(argv: list[str] | None = None) -> int:
    quiet_library_logs()
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
