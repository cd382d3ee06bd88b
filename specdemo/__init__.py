"""specdemo: race plain autoregressive decoding against speculative decoding, with honest numbers."""

import os as _os
from pathlib import Path as _Path

# How OpenMP threads wait (torch's and llama.cpp's), chosen before either runtime loads: spinning
# unless other processes want the cores our threads need (specdemo/_omp.py has the measurements).
# A value the user set wins. What was chosen and why: OMP_WAIT.
from . import _omp

OMP_WAIT = _omp.apply()

# torchao (which transformers imports when it is installed) registers enums that torch 2.10+
# reports as deprecated, two lines at the top of every command's output; a user cannot act on
# them. Other messages of that logger (errors) still show.
import logging as _logging  # noqa: E402

_logging.getLogger("torch.utils._pytree").setLevel(_logging.ERROR)

__version__ = "0.1.0"

#: the package folder (data shipped inside it: builtin_drafters/) and the project folder above it
#: (assets/, presets/); named here so that a module's data paths do not depend on where it sits
PACKAGE_DIR = _Path(__file__).resolve().parent
PROJECT_DIR = PACKAGE_DIR.parent
