"""scripts/relayer.py, on small trees built here: where modules go, how imports are rewritten,
and when it refuses."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("relayer", ROOT / "scripts" / "relayer.py")
relayer = importlib.util.module_from_spec(spec)
sys.modules["relayer"] = relayer  # dataclasses look the module up
spec.loader.exec_module(relayer)

TREE = {
    "specdemo/__init__.py": "from pathlib import Path as _Path\nPACKAGE_DIR = _Path(__file__).parent\n",
    "specdemo/__main__.py": "from .cli import main\n",
    "specdemo/cli.py": 'COMMAND_MODULES = ("specdemo.decode_cli", "specdemo.compat")\n\n\n'
                       "def main():\n    return 0\n",
    "specdemo/decode_cli.py": "from . import compat, inputs\nfrom .models import ModelLoadError\n",
    "specdemo/compat.py": "from . import inputs, models\n\n\ndef check():\n"
                          "    from .drafters.learned import is_learned  # deferred: imports torch\n"
                          "    return is_learned\n",
    "specdemo/inputs.py": "from . import models\n",
    "specdemo/errors.py": "class ModelLoadError(RuntimeError):\n    pass\n",
    "specdemo/builtin.py": "from .errors import ModelLoadError\n",
    "specdemo/models.py": "from . import builtin\nfrom .builtin import (  # noqa: F401\n"
                          "    ModelLoadError)\n\n\ndef load_model(spec):\n    return spec\n",
    "specdemo/drafters/__init__.py": "from .base import Drafter\n",
    "specdemo/drafters/base.py": "class Drafter:\n    pass\n",
    "specdemo/drafters/learned.py": "from .. import PACKAGE_DIR, models\nfrom ..errors import "
                                    "ModelLoadError\nfrom .base import Drafter\n\n\n"
                                    "def is_learned(spec):\n    return False\n",
    "tests/test_x.py": 'from specdemo import models\nfrom specdemo.drafters.learned import is_learned\n'
                       'PATCH = "specdemo.models.load_model"\nLOGGER = "specdemo.builtin"\n'
                       'CSS = "assets/specdemo.css"\nRUN = "python -m specdemo run"\n'
                       'CODE = "from specdemo import builtin as B, inputs\\nprint(B)"\n',
    "README.md": "See [the loader](specdemo/models.py), `specdemo.drafters.learned`, "
                 "`specdemo/drafters/` and `specdemo/builtin_drafters/x/config.json`.\n",
}


def build(root: Path, files: dict[str, str] = TREE) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_relative_imports_from_a_package_to_a_module():
    assert relayer.relative("specdemo.checks", "specdemo.models.loading") == "..models.loading"
    assert relayer.relative("specdemo.services", "specdemo") == ".."
    assert relayer.relative("specdemo", "specdemo.interfaces.cli") == ".interfaces.cli"
    assert relayer.relative("specdemo.core.drafters", "specdemo.core.drafters.base") == ".base"
    assert relayer.relative("specdemo.models", "specdemo.models") == "."


def test_moves_and_rewrites_a_small_tree(tmp_path):
    build(tmp_path)
    relayer.relayer(tmp_path, use_git=False)
    read = lambda name: (tmp_path / name).read_text()  # noqa: E731
    assert not (tmp_path / "specdemo" / "drafters").exists()
    assert not (tmp_path / "specdemo" / "models.py").exists()
    assert read("specdemo/__main__.py") == "from .interfaces.cli import main\n"
    assert read("specdemo/interfaces/cli.py").startswith(
        'COMMAND_MODULES = ("specdemo.interfaces.decode_cli", "specdemo.checks.compat")\n')
    assert read("specdemo/interfaces/decode_cli.py") == (
        "from ..checks import compat, inputs\nfrom ..models.loading import ModelLoadError\n")
    assert read("specdemo/checks/compat.py").splitlines()[:2] == [
        "from . import inputs", "from ..models import loading as models"]
    assert ("    from ..models.learned import is_learned  # deferred: imports torch"
            in read("specdemo/checks/compat.py"))
    assert read("specdemo/models/loading.py").startswith(
        "from . import builtin\nfrom .builtin import (  # noqa: F401\n    ModelLoadError)\n")
    assert read("specdemo/models/builtin.py") == "from ..core.errors import ModelLoadError\n"
    assert read("specdemo/models/learned.py").splitlines()[:4] == [
        "from .. import PACKAGE_DIR", "from . import loading as models",
        "from ..core.errors import ModelLoadError", "from ..core.drafters.base import Drafter"]
    assert read("specdemo/core/drafters/__init__.py") == "from .base import Drafter\n"
    assert read("tests/test_x.py") == (
        "from specdemo.models import loading as models\n"
        "from specdemo.models.learned import is_learned\n"
        'PATCH = "specdemo.models.loading.load_model"\nLOGGER = "specdemo.models.builtin"\n'
        'CSS = "assets/specdemo.css"\nRUN = "python -m specdemo run"\n'
        'CODE = "from specdemo.models import builtin as B; from specdemo.checks import inputs\\n'
        'print(B)"\n')
    assert read("README.md") == ("See [the loader](specdemo/models/loading.py), "
                                 "`specdemo.models.learned`, `specdemo/core/drafters/` and "
                                 "`specdemo/builtin_drafters/x/config.json`.\n")
    assert read("specdemo/core/__init__.py").startswith('"""Core: ')
    done = subprocess.run([sys.executable, "-c", "import specdemo.__main__, specdemo.interfaces."
                           "decode_cli, specdemo.models.learned, specdemo.checks.compat as c; "
                           "print(c.check().__module__)"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.stdout.strip() == "specdemo.models.learned", done.stderr


def test_refuses_modules_missing_from_the_table_and_changes_nothing(tmp_path, capsys):
    build(tmp_path, {**TREE, "specdemo/lanes.py": "", "specdemo/drafters/medusa.py": ""})
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert relayer.main(["--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "'specdemo.lanes': ?," in err and "'specdemo.drafters.medusa': ?," in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert relayer.main(["--check", "--root", str(tmp_path)]) == 2


def test_refuses_a_module_that_finds_files_from_its_own_folder(tmp_path):
    build(tmp_path, {**TREE, "specdemo/inputs.py": "from pathlib import Path\n"
                                                   "DOCS = Path(__file__).parent.parent / 'docs'\n"})
    with pytest.raises(relayer.Refused, match=r"PROJECT_DIR .*specdemo/inputs.py:2"):
        relayer.relayer(tmp_path, use_git=False)
    assert (tmp_path / "specdemo" / "inputs.py").exists()


def test_refuses_a_tree_already_in_layers(tmp_path):
    build(tmp_path)
    relayer.relayer(tmp_path, use_git=False)
    with pytest.raises(relayer.Refused, match="already laid out"):
        relayer.relayer(tmp_path, use_git=False)


@pytest.mark.skipif((ROOT / "specdemo" / "core").is_dir(), reason="the relayer has run")
def test_every_module_of_this_checkout_is_in_the_table():
    relayer.plan(ROOT)  # raises Refused naming the modules that are not
