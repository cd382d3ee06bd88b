"""The package's structure, checked: no import circle among its modules, and the layers of
docs/design.md ("Layers") enforced by import-linter's contract in ``.importlinter``."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Components of more than one module in a directed graph {module: modules it imports}
    (Tarjan 1972, iterative), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found, key=lambda c: (-len(c), c))


def test_components_of_a_known_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert strongly_connected_components(graph) == [["a", "b", "c"], ["d", "e"]]
    assert strongly_connected_components({"a": {"b"}, "b": set()}) == []


def import_graph() -> dict[str, set[str]]:
    """specdemo's modules -> the specdemo modules each imports (module level, inside functions
    and under TYPE_CHECKING alike), from the source, by grimp."""
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter "
                                                "(requirements-dev.txt)")
    sys.path.insert(0, str(ROOT))
    try:
        graph = grimp.build_graph("specdemo", cache_dir=None)
    finally:
        sys.path.remove(str(ROOT))
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def test_no_import_circle_among_the_packages_modules():
    graph = import_graph()
    assert "specdemo.core.engine" in graph or "specdemo.core.engine" in graph  # the graph is ours
    circles = strongly_connected_components(graph)
    assert circles == [], "modules that import each other (directly or around a circle): " + \
        "; ".join(", ".join(c) for c in circles)


def test_layers_contract_holds():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(lint).exists():
        pytest.fail("lint-imports is not installed: pip install -r requirements-dev.txt")
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"Contracts: 1 kept, 0 broken", done.stdout), done.stdout
