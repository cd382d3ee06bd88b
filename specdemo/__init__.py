"""specdemo: race plain autoregressive decoding against speculative decoding, with honest numbers."""

import os as _os
from pathlib import Path as _Path

# OpenMP threads that spin while they wait turn a forward 10-30x slower as soon as another
# process wants the same cores (SmolLM2-135M, 2 threads on a 2-core VM shared with one more
# busy process: 0.17-1.9 s per forward spinning, 0.06-0.08 s waiting passively). Set before
# torch loads its OpenMP runtime; a value the user set wins. See the README's "Performance on a
# CPU" for what it costs on a quiet machine.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

#: the package folder (data shipped inside it: builtin_drafters/) and the project folder above it
#: (assets/, presets/); named here so that a module's data paths do not depend on where it sits
PACKAGE_DIR = _Path(__file__).resolve().parent
PROJECT_DIR = PACKAGE_DIR.parent
