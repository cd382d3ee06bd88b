"""Every concern in its room (issue 51), held by the counts of ``scripts/repo_counts.py``: the
command modules parse and print, ``builtin:`` is read in one place, a draft spec's text is
parsed in two (it travels inwards as a ``DraftSpec``), a model spec is tested for ``.gguf`` in
core/model_spec.py alone (it travels as a ``ModelSpec``), the built-in model is named in the table
of built-ins alone, long functions stay few, and the app's settings travel as one object, not
through module globals (neither from app.py nor from the scripts that start the app)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import repo_counts  # noqa: E402

LIMITS = {
    "interfaces/train_cli.py lines": 300,
    "modules importing argparse below interfaces/": 0,
    "places cutting builtin: by hand": 2,
    "places calling DraftSpec.parse": 2,
    "places testing a spec for .gguf by hand": 0,
    "files of specdemo/ naming the built-in model in code": 2,
    "functions over 80 lines": 2,
    "settings set from app.py and scripts/ through module globals": 0,
    "module-level one-item list cells in specdemo/": 0,
}


@pytest.fixture(scope="module")
def counts() -> dict:
    return {name: (value, how) for name, value, how in repo_counts.counts()}


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_each_count_stays_within_its_limit(counts, name):
    value, how = counts[name]
    assert value is not None and value <= LIMITS[name], f"{name}: {value} > {LIMITS[name]} ({how})"


def test_the_counts_see_what_they_count(tmp_path, monkeypatch):
    """A module that cuts ``builtin:`` by hand, tests a spec for ``.gguf`` by hand, names the
    built-in model and imports argparse below interfaces/ is counted (the counts can fail)."""
    import ast
    source = ('import argparse\n\ndef f(spec):\n    if spec.startswith("builtin:"):\n'
              '        return spec.split(":", 1)[1] or "smollm2-135m"\n'
              '    return DraftSpec.parse(spec).kind\n\n'
              'def g(spec):\n    return spec.lower().endswith(".GGUF")\n\n'
              'def h(path):\n    return path.suffix != ".gguf"\n\n'
              'def named(folder):\n    return folder / "model.gguf"\n')
    trees = {"specdemo/services/bad.py": ast.parse(source),
             "specdemo/core/model_spec.py": ast.parse('def is_gguf(s):\n'
                                                      '    return s.endswith(".gguf")\n')}
    got = {name: value for name, value, _ in repo_counts.issue51_counts(trees)}
    assert got["modules importing argparse below interfaces/"] == 1
    assert got["places cutting builtin: by hand"] == 1
    assert got["files of specdemo/ naming the built-in model in code"] == 1
    assert got["places calling DraftSpec.parse"] == 1
    assert got["places testing a spec for .gguf by hand"] == 2  # g and h; not model_spec.py


def test_the_settings_counts_see_a_module_cell_set_from_the_app():
    """``ui_state.APP_PRESET[0] = ...`` and ``ui_state.CACHE.backend = ...`` in app.py, and a
    module-level ``[None]`` set through ``[0]``, are counted (the counts can fail)."""
    import ast
    app = ast.parse("def main(args):\n    ui_state.APP_PRESET[0] = args.preset\n"
                    "    ui_state.CACHE.backend = args.backend\n    local = args.port\n")
    assert repo_counts.module_cells_set(app) == ["ui_state.APP_PRESET[0]", "ui_state.CACHE.backend"]
    cell = ast.parse("PRESET: list = [None]\nOTHER = [1]\n\ndef use(name):\n"
                     "    PRESET[0] = name\n    return OTHER[0]\n")
    assert repo_counts.one_item_cells(cell) == ["PRESET"]


def test_the_settings_count_sees_a_script_setting_the_page_modules():
    """A script assigning into ``ui_state``/``ui`` (also under an import alias) is counted; its
    own objects and ``os.environ`` are not (the count can fail)."""
    import ast
    script = ast.parse("import os\nfrom specdemo.interfaces import ui, ui_state as state\n"
                       "import specdemo.interfaces.ui_state as us\n\ndef main(args):\n"
                       "    state.CACHE.backend = args.backend\n    ui._X[0] = 1\n"
                       "    us.APP.preset = None\n    ui_state.CACHE.backend += ''\n"
                       "    os.environ['A'] = '1'\n    args.backend = 'auto'\n")
    assert repo_counts.page_modules_set(script) == [
        "state.CACHE.backend", "ui._X[0]", "us.APP.preset", "ui_state.CACHE.backend"]
    got = {name: value for name, value, _ in
           repo_counts.issue51_counts({"app.py": ast.parse("x = 1\n")}, {"scripts/s.py": script})}
    assert got["settings set from app.py and scripts/ through module globals"] == 4
