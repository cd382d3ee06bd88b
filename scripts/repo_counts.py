"""Counts of how readable the repository is (issues 41 and 51): print each count and how it is
counted.

Run from a checkout: ``python scripts/repo_counts.py`` (``--json`` for one JSON object).
Every count reads the files ``git ls-files`` lists, so a checkout of any commit can be compared
with another (e.g. a ``git worktree`` at main beside a branch).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the patterns tests/test_repo_hygiene.py forbids (it reads them from here), written with
# character classes so that this file does not name what it counts
WORDS = re.compile(r"(?<![\w])(s[e]ssions?|w[a]ves?|s[i]ttings?)\d*(?![\w])", re.IGNORECASE)
PATHS = re.compile(r"(?<![\w.~-])/(?:w[o]rk|r[o]ot|t[m]p)/|(?<![\w.~-])/(?:h[o]me|U[s]ers)/\w"
                   r"|\b[A-Za-z]:\\U[s]ers\\")
BACKEND_NAMES = {"transformers", "ggml", "ggml-bf16", "int8", "native", "native-int8", "native-w8a8"}
#: data, not prose: user requests that may use any word or path (the hygiene test skips them too)
DATA_FILES = ("assets/train/prompts.jsonl", "assets/train/handwritten.jsonl")
PARSE_CALLS = {"startswith", "removeprefix", "split", "partition", "rpartition", "match",
               "fullmatch"}
#: the built-in model's name (and its hub id), as the code would spell it
BUILTIN_NAME = re.compile(r"smollm2-135m", re.IGNORECASE)
LONG_FUNCTION_LINES = 80


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p and (ROOT / p).is_file()]


def text(path: str) -> str | None:
    """The file's text, or None when it is not UTF-8 text (or no longer on disk)."""
    try:
        data = (ROOT / path).read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def python_files(files: list[str]) -> dict[str, ast.Module]:
    return {p: ast.parse((ROOT / p).read_text(), p) for p in files
            if p.startswith("specdemo/") and p.endswith(".py")}


def functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def own_import(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "specdemo"
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "specdemo" for a in node.names)
    return False


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.add(id(body[0].value))
    return out


def gguf_test(node: ast.AST) -> bool:
    """True for ``x.endswith(".gguf")`` (or removesuffix, a tuple holding it, any case) and a
    comparison with ``".gguf"`` (``path.suffix.lower() != ".gguf"``)."""
    def says(n: ast.AST) -> bool:
        return any(isinstance(c, ast.Constant) and isinstance(c.value, str)
                   and c.value.lower().endswith(".gguf") and c.value.startswith(".")
                   for c in ast.walk(n))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("endswith", "removesuffix"):
        return any(says(a) for a in node.args)
    if isinstance(node, ast.Compare):
        return any(isinstance(c, ast.Constant) and isinstance(c.value, str)
                   and c.value.lower() == ".gguf" for c in [node.left, *node.comparators])
    return False


def module_cells_set(tree: ast.Module) -> list[str]:
    """Targets of assignments in ``tree`` that set an attribute or an item (``a.b = x``,
    ``a.b[0] = x``, ``a[k] += x``): in app.py, a setting put into another module's object
    (the process environment, ``os.environ``, aside: it is set before gradio is imported)."""
    return [ast.unparse(t) for t in module_targets(tree)
            if isinstance(t, (ast.Attribute, ast.Subscript))
            and not ast.unparse(t).startswith("os.environ[")]


#: the page's modules, whose objects a script could set a setting into
PAGE_MODULES = ("ui_state", "ui")


def page_modules_set(tree: ast.Module) -> list[str]:
    """Targets of assignments in ``tree`` (a script) that set an attribute or an item of the
    page's module objects (``ui_state.CACHE.backend = x``, ``ui._X[0] = x``, also under an import
    alias): a setting the app's one settings object should carry instead."""
    names = set(PAGE_MODULES)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("interfaces"):
            names |= {a.asname or a.name for a in node.names if a.name in PAGE_MODULES}
        elif isinstance(node, ast.Import):
            names |= {a.asname for a in node.names
                      if a.asname and a.name.rsplit(".", 1)[-1] in PAGE_MODULES}
    out = []
    for t in module_targets(tree):
        if not isinstance(t, (ast.Attribute, ast.Subscript)):
            continue
        base = t
        while isinstance(base, (ast.Attribute, ast.Subscript)):
            base = base.value
        if isinstance(base, ast.Name) and base.id in names:
            out.append(ast.unparse(t))
    return out


def one_item_cells(tree: ast.Module) -> list[str]:
    """Module-level names bound to a one-item list (``X = [None]``) that an assignment sets
    through ``X[0] = ...``: a mutable cell used as a setting."""
    lists = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             and isinstance(node.value, ast.List) and len(node.value.elts) == 1
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(t, ast.Name)}
    return sorted({t.value.id for t in module_targets(tree) if isinstance(t, ast.Subscript)
                   and isinstance(t.value, ast.Name) and t.value.id in lists})


def module_targets(tree: ast.AST) -> list[ast.AST]:
    """Every assignment target in ``tree``."""
    return [t for node in ast.walk(tree) for t in (
        node.targets if isinstance(node, ast.Assign)
        else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])]


def script_trees() -> dict[str, ast.Module]:
    """The tracked scripts/*.py, parsed (one that does not parse is left out)."""
    out = {}
    for p in tracked():
        if p.startswith("scripts/") and p.count("/") == 1 and p.endswith(".py"):
            try:
                out[p] = ast.parse((ROOT / p).read_text(), p)
            except (SyntaxError, UnicodeDecodeError):
                continue
    return out


def issue51_counts(trees: dict[str, ast.Module],
                   scripts: dict[str, ast.Module] | None = None) -> list[tuple[str, object, str]]:
    """What issue 51 fixed: every concern in its room. ``scripts``: scripts/*.py parsed
    (default: the tracked ones, read from disk)."""
    out = []
    cli = ROOT / "specdemo" / "interfaces" / "train_cli.py"
    out.append(("interfaces/train_cli.py lines",
                len(cli.read_text().splitlines()) if cli.is_file() else None,
                "wc -l specdemo/interfaces/train_cli.py (the flags and printing of train-draft)"))
    argparse_below = sorted(p for p, tree in trees.items()
                            if not p.startswith(("specdemo/interfaces/", "specdemo/checks/"))
                            and any(isinstance(n, (ast.Import, ast.ImportFrom)) and "argparse" in (
                                [a.name for a in n.names] if isinstance(n, ast.Import)
                                else [n.module or ""]) for n in ast.walk(tree)))
    out.append(("modules importing argparse below interfaces/", len(argparse_below),
                "modules of specdemo/ outside interfaces/ and checks/ (whose argparse types are "
                "the refusals' words) with an import of argparse: " + ", ".join(argparse_below)))
    cuts = []
    for path, tree in trees.items():
        for f in functions(tree):
            own = [n for n in ast.walk(f) if n is f or not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            says = any(isinstance(n, ast.Constant) and n.value == "builtin:" for n in own)
            cuts += [f"{path}:{f.name}"] if says and any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr in PARSE_CALLS for n in own) else []
    out.append(("places cutting builtin: by hand", len(cuts),
                "functions of specdemo/ whose own body holds the string \"builtin:\" and calls "
                "startswith/removeprefix/split/partition/match: " + ", ".join(sorted(cuts))))
    parses = sorted(f"{path}:{f.name}" for path, tree in trees.items() for f in functions(tree)
                    for n in ast.walk(f) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute) and n.func.attr == "parse"
                    and isinstance(n.func.value, ast.Name) and n.func.value.id == "DraftSpec")
    out.append(("places calling DraftSpec.parse", len(parses),
                "calls of DraftSpec.parse(...) in specdemo/, by function (the draft spec travels "
                "parsed; as_draft_spec parses what still comes as text): " + ", ".join(parses)))
    ggufs = sorted({f"{path}:{f.name}" for path, tree in trees.items()
                    if path != "specdemo/core/model_spec.py" for f in functions(tree)
                    if any(gguf_test(n) for n in ast.walk(f))})
    out.append(("places testing a spec for .gguf by hand", len(ggufs),
                "functions of specdemo/ outside core/model_spec.py that call endswith/removesuffix "
                "with \".gguf\" (any case) or compare a value with it (a ModelSpec says "
                "`.gguf`/`.kind`): " + ", ".join(ggufs)))
    named = []
    for path, tree in trees.items():
        skip = docstrings(tree)
        if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
               and BUILTIN_NAME.search(n.value) for n in ast.walk(tree)):
            named.append(path)
    out.append(("files of specdemo/ naming the built-in model in code", len(named),
                "modules of specdemo/ with a string (docstrings aside) holding smollm2-135m, any "
                "case (the built-in's name and its hub id): " + ", ".join(sorted(named))))
    app = trees.get("app.py")
    if app is None and (ROOT / "app.py").is_file():
        app = ast.parse((ROOT / "app.py").read_text())
    scripts = script_trees() if scripts is None else scripts
    from_scripts = sorted(f"{p}:{cell}" for p, tree in scripts.items()
                          for cell in page_modules_set(tree))
    out.append(("settings set from app.py and scripts/ through module globals",
                len(module_cells_set(app)) + len(from_scripts) if app is not None else None,
                "assignments in app.py into an attribute or an item, os.environ aside "
                "(ui_state.CACHE.backend = ..., ui_state.APP_PRESET[0] = ...), and in scripts/*.py "
                "into an attribute or an item of the ui_state or ui module: the app's settings "
                "are one object passed down: " + ", ".join(from_scripts)))
    cells = sorted(f"{p}:{name}" for p, tree in trees.items() for name in one_item_cells(tree))
    out.append(("module-level one-item list cells in specdemo/", len(cells),
                "module-level names of specdemo/ bound to a one-item list and set through [0]: "
                + ", ".join(cells)))
    long = sorted(f"{p}:{f.name} ({f.end_lineno - f.lineno + 1})" for p, tree in trees.items()
                  for f in functions(tree) if f.end_lineno - f.lineno + 1 > LONG_FUNCTION_LINES)
    out.append((f"functions over {LONG_FUNCTION_LINES} lines", len(long),
                "defs in specdemo/, signature to last line: " + ", ".join(long)))
    return out


def counts() -> list[tuple[str, object, str]]:
    files = tracked()
    docs = [p for p in files if p.startswith("docs/")]
    texts = {p: text(p) for p in files}
    trees = python_files(files)
    out = [("docs files", len(docs), "git ls-files docs/ | wc -l"),
           ("docs bytes", sum((ROOT / p).stat().st_size for p in docs),
            "sum of the sizes of the files git ls-files lists under docs/")]
    for name, pattern in (("files naming a stint (hygiene test's words)", WORDS),
                          ("files with an absolute machine path", PATHS)):
        hits = [p for p, t in texts.items() if p not in DATA_FILES
                and (pattern.search(p) or (t and pattern.search(t)))]
        out.append((name, len(hits), "tracked text files (or their paths) matching the pattern "
                    "of tests/test_repo_hygiene.py, its two data files aside"))
    readme = texts.get("README.md") or ""
    out.append(("README lines", len(readme.splitlines()), "wc -l README.md"))
    engine = trees.get("specdemo/core/engine.py")
    decode = next((f for f in functions(engine) if f.name == "decode"), None) if engine else None
    out.append(("core/engine.py decode lines",
                decode.end_lineno - decode.lineno + 1 if decode else None,
                "lines of the def of decode in specdemo/core/engine.py, signature to last line"))
    lists = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                parts = [k for k in value.keys if k is not None] if isinstance(value, ast.Dict) \
                    else [value]
                named = BACKEND_NAMES & {s for part in parts for s in strings(part)}
                if len(named) >= 2:
                    lists.append(f"{path}:{node.lineno}")
    out.append(("backend name lists", len(lists), "assignments in specdemo/ of a tuple, list, set "
                "or dict literal holding 2 or more backend names as strings (elements or keys): "
                + ", ".join(lists)))
    parsers = []
    for path, tree in trees.items():
        for f in functions(tree):
            # a function's own body, not the functions nested in it (those are counted apart)
            own = [n for n in ast.walk(f) if n is f or not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            says = any(isinstance(n, ast.Constant) and isinstance(n.value, str)
                       and n.value.startswith("early-exit") for n in own)
            parses = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                         and n.func.attr in PARSE_CALLS for n in own)
            if says and parses:
                parsers.append(f"{path}:{f.name}")
    out.append(("places parsing a draft spec's early-exit:N", len(parsers),
                "functions in specdemo/ whose body holds a string starting with early-exit and "
                "calls startswith/removeprefix/split/partition/match: " + ", ".join(sorted(parsers))))
    defs = [f"{p}:{n.lineno}" for p, tree in trees.items() for n in tree.body
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and t.id == "NON_MODEL_DRAFTS"
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    out.append(("NON_MODEL_DRAFTS definitions", len(defs), "module-level assignments: " + ", ".join(defs)))
    inner, bare = 0, 0
    for path, tree in trees.items():
        lines = (ROOT / path).read_text().splitlines()
        seen = set()
        for f in functions(tree):
            for n in ast.walk(f):
                if own_import(n) and id(n) not in seen:
                    seen.add(id(n))
                    inner += 1
                    # a comment on the import's line or the line above it says why
                    here = lines[n.lineno - 1]
                    above = lines[n.lineno - 2].strip() if n.lineno > 1 else ""
                    bare += "#" not in here and not above.startswith("#")
    out.append(("in-function imports of own modules", inner, "import statements of specdemo "
                "modules (relative or absolute) inside a def, in specdemo/"))
    out.append(("... of them without a comment saying why", bare, "the same, without a # "
                "comment on the import's line or a comment line just above it"))
    out += issue51_counts(trees)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object: name -> count")
    args = parser.parse_args(argv)
    rows = counts()
    if args.json:
        json.dump({name: value for name, value, _ in rows}, sys.stdout, indent=1)
        print()
        return
    for name, value, how in rows:
        print(f"{name}: {value}\n    how: {how}")


if __name__ == "__main__":
    main()
