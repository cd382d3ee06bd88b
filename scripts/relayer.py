"""Move specdemo's modules into their layer folders and rewrite every import of them.

Layers, bottom to top (docs/design.md, "Layers"; enforced by ``.importlinter`` and
``tests/test_layers.py``): ``specdemo/core/`` (decode loop, KV cache, sampling and verification,
statistics, draft-length policies, the drafter protocol and families), ``specdemo/models/``
(loading by spec, built-ins, quantisation, the CPU fast path, hardware facts, learned-drafter
loading), ``specdemo/checks/`` (compatibility verdicts, input validation), ``specdemo/services/``
(pipeline, races, presets, start-up steps, costs, benchmark runs, training) and
``specdemo/interfaces/`` (command line, gradio app and tabs). ``specdemo/__init__.py`` and
``specdemo/__main__.py`` stay where they are, so ``python -m specdemo``, ``app.py``, the command
line, ``/race`` and every JSON key are unchanged.

What it does, in this order, touching nothing until every check has passed:

1. refuses when the tree is already laid out (``specdemo/core/`` exists);
2. lists every module under ``specdemo/`` and refuses, naming them, when one is in neither
   :data:`MAPPING` nor :data:`KEEP` (a module a merged branch brought: add it to the table,
   in the layer its imports allow, and run again), when a module to move uses ``__file__`` (its
   data paths would break: use ``specdemo.PROJECT_DIR`` / ``PACKAGE_DIR``), or when a package
   folder it empties holds files other than Python modules;
3. rewrites, in ``specdemo/``, ``tests/``, ``scripts/``, ``app.py``, ``README.md`` and ``docs/``:
   ``from``-imports, absolute and relative (``from .x``, ``from ..x``, ``from . import x``),
   at module level and inside functions (re-expressed relative to the module's new folder; a
   module imported by a name it no longer has keeps that name with ``as``), and every other
   mention of a moved module's dotted name or file path (``mock.patch("specdemo.x.y")``,
   ``monkeypatch`` and ``importlib`` strings, ``python -m specdemo.x``, ``logging`` names,
   ``import specdemo.x``, ``specdemo/x.py`` and package folders like ``specdemo/drafters/`` in
   docs);
4. ``git mv``s each file to its new place and writes a docstring ``__init__.py`` per layer.

Run it from the repository root, on a clean work tree, after merging the branches:

    python scripts/relayer.py --check   # lists modules missing from the table; changes nothing
    # add each listed module to MAPPING (in the lowest layer its imports allow), then:
    python scripts/relayer.py           # moves (git mv) and rewrites; stages everything
    lint-imports                        # an upward import names both modules: move the function
                                        # it needs down a layer (or the module up), then rerun
    python -m pytest -q -m "not slow"   # then commit the move as one commit

It reads only the tree it runs on, so a branch that is merged after the move can be relayered
the same way first (on that branch, with its own new modules added to the table) and then
merged: both sides then hold the same renames. ``git log --follow`` and ``git blame -C`` follow
the moved files.

Options: ``--dry-run`` prints the moves and the files it would rewrite; ``--no-git`` moves with
the file system instead of ``git mv`` (for a copy of the tree that is not a checkout).

Exit status: 0 done (or ``--check`` found nothing missing), 2 refused (the reason is printed).
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "specdemo"

#: old module -> new module. A package's entry (``specdemo.drafters``) is its ``__init__.py``.
#: Bottom to top; keep each layer sorted. A new module goes in the lowest layer whose imports
#: allow it (``lint-imports`` names the two modules of an upward import).
MAPPING: dict[str, str] = {
    # core: decode loop, KV cache and rollback, sampling and verification, statistics,
    # draft-length policies, the drafter protocol and the drafter families
    "specdemo.clock": "specdemo.core.clock",
    "specdemo.engine": "specdemo.core.engine",
    "specdemo.errors": "specdemo.core.errors",
    "specdemo.kv": "specdemo.core.kv",
    "specdemo.machine": "specdemo.core.machine",
    "specdemo.policy": "specdemo.core.policy",
    "specdemo.sampling": "specdemo.core.sampling",
    "specdemo.stats": "specdemo.core.stats",
    "specdemo.drafters": "specdemo.core.drafters",
    "specdemo.drafters.base": "specdemo.core.drafters.base",
    "specdemo.drafters.combined": "specdemo.core.drafters.combined",
    "specdemo.drafters.dflash": "specdemo.core.drafters.dflash",
    "specdemo.drafters.draft_model": "specdemo.core.drafters.draft_model",
    "specdemo.drafters.eagle": "specdemo.core.drafters.eagle",
    "specdemo.drafters.eagle_io": "specdemo.core.drafters.eagle_io",
    "specdemo.drafters.features": "specdemo.core.drafters.features",
    "specdemo.drafters.mtp": "specdemo.core.drafters.mtp",
    "specdemo.drafters.ngram": "specdemo.core.drafters.ngram",
    "specdemo.drafters.vocab": "specdemo.core.drafters.vocab",
    # models: loading targets and drafters by spec, built-ins, GGUF, quantisation, the CPU fast
    # path, the machine's hardware facts
    "specdemo.models": "specdemo.models.loading",
    "specdemo.builtin": "specdemo.models.builtin",
    "specdemo.fastpath": "specdemo.models.fastpath",
    "specdemo.ggufread": "specdemo.models.ggufread",
    "specdemo.hardware": "specdemo.models.hardware",
    "specdemo.quantize": "specdemo.models.quantize",
    "specdemo.drafters.learned": "specdemo.models.learned",
    # checks: compatibility verdicts and input validation
    "specdemo.compat": "specdemo.checks.compat",
    "specdemo.inputs": "specdemo.checks.inputs",
    # services: pipeline, race scheduling, presets, start-up steps, costs, benchmark runs,
    # training
    "specdemo.costs": "specdemo.services.costs",
    "specdemo.pipeline": "specdemo.services.pipeline",
    "specdemo.presets": "specdemo.services.presets",
    "specdemo.prompts": "specdemo.services.prompts",
    "specdemo.race": "specdemo.services.race",
    "specdemo.startup": "specdemo.services.startup",
    "specdemo.bench": "specdemo.services.bench",
    "specdemo.bench.aggregate": "specdemo.services.bench.aggregate",
    "specdemo.bench.config": "specdemo.services.bench.config",
    "specdemo.bench.reference": "specdemo.services.bench.reference",
    "specdemo.bench.report": "specdemo.services.bench.report",
    "specdemo.bench.run": "specdemo.services.bench.run",
    "specdemo.training": "specdemo.services.training",
    "specdemo.training.data": "specdemo.services.training.data",
    "specdemo.training.prompt_set": "specdemo.services.training.prompt_set",
    "specdemo.training.report": "specdemo.services.training.report",
    "specdemo.training.train": "specdemo.services.training.train",
    # interfaces: the command line, the gradio app and its tabs
    "specdemo.cli": "specdemo.interfaces.cli",
    "specdemo.decode_cli": "specdemo.interfaces.decode_cli",
    "specdemo.bench.cli": "specdemo.interfaces.bench_cli",
    "specdemo.training.cli": "specdemo.interfaces.train_cli",
    "specdemo.bench_ui": "specdemo.interfaces.bench_ui",
    "specdemo.ui": "specdemo.interfaces.ui",
    "specdemo.ui_format": "specdemo.interfaces.ui_format",
    "specdemo.ui_race": "specdemo.interfaces.ui_race",
    "specdemo.ui_state": "specdemo.interfaces.ui_state",
    # Modules that branches developed beside the move add (as committed at 15:10 on 2026-12-01),
    # placed by their imports; an entry for a module that does not exist is ignored.
    "specdemo.drafters.folders": "specdemo.core.drafters.folders",  # faults
    "specdemo.ggml_backend": "specdemo.models.ggml_backend",  # speed
    "specdemo.llama_ctypes": "specdemo.models.llama_ctypes",  # speed
    "specdemo.endpoints": "specdemo.services.endpoints",  # engines: server lanes
    "specdemo.endpoint_bench": "specdemo.services.endpoint_bench",  # engines
    "specdemo.serve": "specdemo.services.serve",  # engines: runs llama-server
    "specdemo.ui_engines": "specdemo.interfaces.ui_engines",  # engines
    "specdemo.training.dflash_train": "specdemo.services.training.dflash_train",  # dflash
    "specdemo.training.prompt_more": "specdemo.services.training.prompt_more",  # data
}

#: modules that stay where they are
KEEP = {"specdemo", "specdemo.__main__"}

#: the layer packages the move creates, with their docstrings
LAYERS = {
    "specdemo.core": "Core: the decode loop, KV cache and rollback, sampling and verification, "
                     "statistics,\ndraft-length policies, the drafter protocol and the drafter "
                     "families. Imports no other layer.",
    "specdemo.models": "Models: loading targets and drafters by spec (hub id, folder, GGUF, "
                       "built-in), quantisation,\nthe CPU fast path and the machine's hardware "
                       "facts. Imports only from core.",
    "specdemo.checks": "Checks: compatibility verdicts and input validation, one place for what "
                       "`check`, `run`, the page\nand the API refuse. Imports from models and "
                       "core.",
    "specdemo.services": "Services: pipeline, race scheduling, presets, start-up steps, costs, "
                         "benchmark runs, training.\nImports from checks, models and core.",
    "specdemo.interfaces": "Interfaces: the command line and the gradio app and its tabs. "
                           "Imports from every layer below.",
}

#: this script and its tests, whose old names are meant (never rewritten)
OWN_FILES = {"scripts/relayer.py", "tests/test_relayer.py"}

#: what is rewritten (relative to the repository root)
PY_TARGETS = ("specdemo", "tests", "scripts", "app.py")
TEXT_TARGETS = ("README.md", "docs")

DOTTED = re.compile(r"(?<![\w.])specdemo(?:\.\w+)+")
#: a ``from specdemo... import ...`` written in a string or a doc (code run by ``python -c``)
FROM_TEXT = re.compile(r"(?<![\w.])from[ \t]+specdemo(?:\.\w+)*[ \t]+import[ \t]+\w+(?:[ \t]+as[ \t]+\w+)?"
                       r"(?:[ \t]*,[ \t]*\w+(?:[ \t]+as[ \t]+\w+)?)*")
PATH = re.compile(r"(?<![\w.-])specdemo(?:/\w+)+(?:\.py\b|/)")  # a module's file or a package's folder


class Refused(Exception):
    """The tree cannot be relayered as it is; the message says why and what to do."""


def module_path(name: str, root: Path, package: bool) -> Path:
    parts = name.split(".")
    return root.joinpath(*parts, "__init__.py") if package else root.joinpath(*parts[:-1],
                                                                              parts[-1] + ".py")


def discover(root: Path) -> dict[str, Path]:
    """Every module under specdemo/ -> its file (``__init__.py`` for a package)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def new_name(old: str) -> str:
    """The new dotted name of ``old`` or of anything inside it (longest mapped prefix)."""
    parts = old.split(".")
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in MAPPING:
            return ".".join([MAPPING[head], *parts[n:]])
    return old


def is_mapped(name: str) -> bool:
    return name in MAPPING or name in KEEP


@dataclass
class Source:
    """A Python file: where it is, which module it is and will be (None outside the package)."""

    path: Path
    old: str | None
    new: str | None
    package: bool


def package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def relative(from_package: str, target: str) -> str:
    """``target`` as a relative import from a module in ``from_package``, e.g.
    ('specdemo.checks', 'specdemo.models.loading') -> '..models.loading'."""
    here, there = from_package.split("."), target.split(".")
    common = 0
    while common < min(len(here), len(there)) and here[common] == there[common]:
        common += 1
    return "." * (len(here) - common + 1) + ".".join(there[common:])


def _statement(src: Source, absolute: bool, base: str, names: list[str]) -> str:
    where = base if absolute else relative(package_of(src.new, src.package), base)
    return f"from {where} import {', '.join(names)}"


def rewrite_import(node: ast.ImportFrom, src: Source, text: str, modules: set[str],
                   one_line: bool = False) -> str | None:
    """The new text of one ``from ... import ...`` statement, or None when it stays as it is
    (``one_line``: statements it splits into are joined with ``; ``, as inside a string)."""
    if node.level:
        if src.old is None:
            return None
        base_parts = package_of(src.old, src.package).split(".")
        base_parts = base_parts[:len(base_parts) - node.level + 1]
        base = ".".join(base_parts + ([node.module] if node.module else []))
    elif node.module and (node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
        base = node.module
    else:
        return None
    absolute = node.level == 0
    if not absolute and src.new is None:
        return None
    plain, groups = [], {}
    for alias in node.names:
        full = f"{base}.{alias.name}"
        if full in modules and full != new_name(full):
            parent, _, leaf = new_name(full).rpartition(".")
            bound = alias.asname or alias.name
            groups.setdefault(parent, []).append(leaf if leaf == bound else f"{leaf} as {bound}")
        else:
            plain.append(alias.name if alias.asname is None else f"{alias.name} as {alias.asname}")
    if not groups:  # names from a module: only the module part of the statement changes
        target = new_name(base)
        if absolute and target == base:
            return None
        head = re.match(r"from\s+[.\w]+\s+import", text)
        where = target if absolute else relative(package_of(src.new, src.package), target)
        new = f"from {where} import" + text[head.end():]
        return None if new == text else new
    statements = []
    if plain:
        statements.append(_statement(src, absolute, new_name(base), plain))
    for parent, names in groups.items():
        statements.append(_statement(src, absolute, parent, names))
    if one_line:
        return "; ".join(statements)
    indent = " " * node.col_offset
    return ("\n" + indent).join(statements)


def line_offsets(text: str) -> list[int]:
    offsets, total = [0], 0
    for line in text.splitlines(keepends=True):
        total += len(line)
        offsets.append(total)
    return offsets


def rewrite_names(text: str, spans: list[tuple[int, int]], modules: set[str]) -> list[tuple]:
    """(start, end, new) for dotted names and file paths of moved modules outside ``spans``."""
    edits, spans = [], list(spans)

    def outside(pos: int) -> bool:
        return not any(a <= pos < b for a, b in spans)

    outsider = Source(Path(), None, None, False)
    for match in FROM_TEXT.finditer(text):
        if not outside(match.start()):
            continue
        node = ast.parse(match.group()).body[0]
        new = rewrite_import(node, outsider, match.group(), modules, one_line=True)
        spans.append(match.span())
        if new is not None:
            edits.append((match.start(), match.end(), new))

    for match in DOTTED.finditer(text):
        parts = match.group().split(".")
        for n in range(len(parts), 1, -1):
            head = ".".join(parts[:n])
            if head in modules:
                if new_name(head) != head and outside(match.start()):
                    edits.append((match.start(), match.start() + len(head), new_name(head)))
                break
    for match in PATH.finditer(text):
        path, suffix = (match.group()[:-3], ".py") if match.group().endswith(".py") else (
            match.group()[:-1], "/")
        name = path.replace("/", ".")
        if name in modules and new_name(name) != name and outside(match.start()):
            edits.append((match.start(), match.end(), new_name(name).replace(".", "/") + suffix))
    return edits


def rewrite_python(src: Source, text: str, modules: set[str]) -> str:
    tree = ast.parse(text)
    offsets = line_offsets(text)
    edits, spans = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            start = offsets[node.lineno - 1] + node.col_offset
            end = offsets[node.end_lineno - 1] + node.end_col_offset
            spans.append((start, end))
            new = rewrite_import(node, src, text[start:end], modules)
            if new is not None:
                edits.append((start, end, new))
    edits += rewrite_names(text, spans, modules)
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def plan(root: Path) -> tuple[dict[str, Path], dict[Path, Path], list[Path], list[Path]]:
    """(modules, moves old file -> new file, Python files to rewrite, text files to rewrite).

    Raises:
        Refused: already laid out, modules missing from the table, or data files in a package
            folder that would be left behind.
    """
    if (root / PACKAGE / "core").is_dir():
        raise Refused("specdemo/core/ exists: the tree is already laid out in layers")
    modules = discover(root)
    missing = sorted(m for m in modules if not is_mapped(m))
    if missing:
        raise Refused("modules not in scripts/relayer.py's MAPPING (add each to the layer its "
                      "imports allow, then run again):\n" + "\n".join(f"    {m!r}: ?," for m in
                                                                       missing))
    located = [f"{path.relative_to(root)}:{n}" for old, path in modules.items() if old not in KEEP
               for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if "__file__" in line and not line.lstrip().startswith("#")]
    if located:
        raise Refused("modules that find files from their own location, which the move changes "
                      "(use specdemo.PROJECT_DIR or PACKAGE_DIR instead): " + ", ".join(located))
    moves = {}
    for old, path in modules.items():
        if old in KEEP:
            continue
        package = path.name == "__init__.py"
        moves[path] = module_path(MAPPING[old], root, package)
    left = []
    for old, path in modules.items():
        if path.name == "__init__.py" and old not in KEEP:
            left += [p for p in path.parent.iterdir() if p.suffix != ".py" and p.name != "__pycache__"]
    if left:
        raise Refused("files that are not modules in package folders the move empties (move "
                      "them by hand first): " + ", ".join(str(p.relative_to(root)) for p in left))
    py_files, text_files = [], []
    for target in PY_TARGETS:
        base = root / target
        py_files += [base] if base.is_file() else sorted(
            p for p in base.rglob("*.py") if "__pycache__" not in p.parts
            and p.relative_to(root).as_posix() not in OWN_FILES)
    for target in TEXT_TARGETS:
        base = root / target
        if base.is_file():
            text_files.append(base)
        elif base.is_dir():
            text_files += sorted(base.rglob("*.md"))
    return modules, moves, py_files, text_files


def git_mv(root: Path, old: Path, new: Path, use_git: bool) -> None:
    new.parent.mkdir(parents=True, exist_ok=True)
    if use_git:
        subprocess.run(["git", "mv", str(old), str(new)], cwd=root, check=True)
    else:
        shutil.move(old, new)


def relayer(root: Path, *, dry_run: bool = False, use_git: bool = True) -> list[str]:
    """Lay ``root``'s package out in layers; returns what was done, one line each.

    Raises:
        Refused: see :func:`plan`; nothing has been changed then.
    """
    modules, moves, py_files, text_files = plan(root)
    names = set(modules)
    by_path = {path: name for name, path in modules.items()}
    new_texts = {}
    for path in py_files:
        old = by_path.get(path)
        package = path.name == "__init__.py"
        src = Source(path, old, new_name(old) if old else None, package)
        text = path.read_text(encoding="utf-8")
        new = rewrite_python(src, text, names)
        if new != text:
            new_texts[moves.get(path, path)] = new
    for path in text_files:
        text = path.read_text(encoding="utf-8")
        edits = rewrite_names(text, [], names)
        for start, end, new in sorted(edits, reverse=True):
            text = text[:start] + new + text[end:]
        if edits:
            new_texts[path] = text
    for path, text in new_texts.items():  # every rewrite must still parse
        if path.suffix == ".py":
            try:
                ast.parse(text)
            except SyntaxError as exc:
                raise Refused(f"rewriting {path.relative_to(root)} would break it: {exc}") from None
    done = [f"move {old.relative_to(root)} -> {new.relative_to(root)}" for old, new in moves.items()]
    done += [f"rewrite {p.relative_to(root)}" for p in sorted(new_texts)]
    if dry_run:
        return done
    for layer, doc in LAYERS.items():
        init = module_path(layer, root, package=True)
        init.parent.mkdir(parents=True, exist_ok=True)
    for old, new in sorted(moves.items()):
        git_mv(root, old, new, use_git)
    for layer, doc in LAYERS.items():
        init = module_path(layer, root, package=True)
        if not init.exists():
            init.write_text(f'"""{doc}"""\n', encoding="utf-8")
            done.append(f"create {init.relative_to(root)}")
            if use_git:
                subprocess.run(["git", "add", str(init)], cwd=root, check=True)
    for path, text in new_texts.items():
        path.write_text(text, encoding="utf-8")
    for old in moves:  # package folders the move emptied
        folder = old.parent
        if folder.exists() and not any(p for p in folder.iterdir() if p.name != "__pycache__"):
            shutil.rmtree(folder)
    if use_git:
        subprocess.run(["git", "add", "-u", "."], cwd=root, check=True)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only list modules missing from the table; change nothing")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the moves and rewrites; change nothing")
    parser.add_argument("--no-git", action="store_true", help="move files without git mv")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: here)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            plan(args.root)
            print("every module is in the table")
            return 0
        for line in relayer(args.root, dry_run=args.dry_run, use_git=not args.no_git):
            print(line)
    except Refused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
