"""The reference implementations used as test oracles (requirements-oracles.txt): vLLM's
``speculators`` (EAGLE-3, DSpark) and z-lab's ``dflash``, imported so that a test skips with a clear
reason when the package is not installed.

``speculators.models.eagle3`` imports one type alias (``BatchType = dict[str, Any]``) from its
training-data loader, whose own imports (openai, datasets, hs-connectors) serve dataset
generation only and are not installed with ``--no-deps``; when they are absent a module holding
that alias stands in for it (nothing else of the loader is used; the DSpark model imports it
through speculators' package too).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

import pytest

INSTALL = "pip install --no-deps -r requirements-oracles.txt"


def speculators_eagle3():
    """``speculators.models.eagle3`` (Eagle3DraftModel, Eagle3SpeculatorConfig), or skip."""
    return _speculators("speculators.models.eagle3")


def speculators_dspark():
    """``speculators.models.dspark.core`` (DSparkDraftModel, and the ``compute_metrics`` its
    forward ends in), or skip."""
    return _speculators("speculators.models.dspark.core")


def _speculators(module: str):
    if importlib.util.find_spec("speculators") is None:
        pytest.skip(f"the speculators oracle is not installed ({INSTALL})")
    loader_needs = ("openai", "datasets", "hs_connectors")  # training-data generation only
    if "speculators" not in sys.modules and not all(importlib.util.find_spec(m) for m in loader_needs):
        stand_in = types.ModuleType("speculators.train.data")
        stand_in.BatchType = dict[str, Any]
        sys.modules["speculators.train.data"] = stand_in  # before speculators imports it
    return importlib.import_module(module)


def zlab_dflash():
    """``dflash.model`` (DFlashDraftModel, _raw_input_embeddings), or skip."""
    pytest.importorskip("dflash", reason=f"the z-lab dflash oracle is not installed ({INSTALL})")
    return importlib.import_module("dflash.model")
