"""Learned drafters (EAGLE-3 heads, and the families registered in :data:`LOADERS`): finding
them from a spec, checking them against a target, loading them.

A spec names a learned drafter when it is ``builtin:<name>`` of a drafter shipped with the project
(:data:`BUILTIN_DRAFTERS`), a local folder whose ``config.json`` declares a drafter family, a
hub id whose cached (or, when the hub is reachable, downloaded) ``config.json`` does, or ``mtp``
(the target's own multi-token prediction layers, read from the target's checkpoint).

The most reported failure in the field is a drafter that loads, stays lossless and accepts ~1%
(wrong feature layers, a missing vocabulary map, a head for another target), so every load is
checked first and refused with one sentence per problem.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import PACKAGE_DIR
from . import loading as models
from ..core.errors import DrafterRefused, ModelLoadError  # noqa: F401  (DrafterRefused: callers look here)
from ..core.model_spec import builtin_name
from .builtin import builtin_hub_id
from ..core.drafters import dflash, dspark, eagle_io, folders, mtp
from ..core.drafters.eagle import Eagle3Drafter, Eagle3Head
from ..core.drafters.features import index_problems, num_layers
from ..core.drafters.vocab import map_problems

BUILTIN_DIR = PACKAGE_DIR / "builtin_drafters"
from .builtin import BUILTIN_DRAFTERS  # noqa: E402,F401  (kept in builtin: no torch to name them)
from ..core.drafters.base import param_bytes
from ..core.drafters.combined import CombinedDrafter


def _family(config: dict) -> str | None:
    if eagle_io.layout(config):
        return "eagle3"
    for kind, detect in DETECTORS.items():
        if detect(config):
            return kind
    return None


def _hub_folder(spec: str) -> Path | None:
    """The local snapshot of a hub drafter (downloaded when not cached and the hub answers)."""
    from huggingface_hub import hf_hub_download, snapshot_download
    try:
        config = Path(hf_hub_download(spec, "config.json", local_files_only=True))
    except Exception:
        if models._hub_offline() or not models._hub_reachable():
            return None
        try:
            config = Path(hf_hub_download(spec, "config.json"))
        except Exception:
            return None
    if _family(eagle_io.read_config(config.parent)) is None:
        return None
    try:
        return Path(snapshot_download(spec, local_files_only=True))
    except Exception:
        return Path(snapshot_download(spec))


COMBINE = "+ngram"  # suffix that stacks prompt lookup over a learned drafter


def resolve(spec: str) -> tuple[Path, str] | None:
    """(folder, family) when ``spec`` names a learned drafter, else None (a model, ngram, ...).

    ``<learned>+ngram`` resolves to the learned drafter's folder and family.

    Raises:
        ModelLoadError: ``builtin:`` names a shipped drafter whose files are missing.
        folders.DrafterFolderError: a local folder whose ``config.json`` cannot be read (missing
            file aside: such a folder is not a learned drafter).
    """
    if spec.endswith(COMBINE):
        return resolve(spec[:-len(COMBINE)])
    name = builtin_name(spec)
    if name is not None:
        if name not in BUILTIN_DRAFTERS:
            return None
        folder = BUILTIN_DIR / name
        if not (folder / "config.json").is_file():
            raise ModelLoadError(f"the built-in drafter {spec} is missing from {folder}; "
                                 "reinstall specdemo or train it with "
                                 f"`python -m specdemo train-draft --target {BUILTIN_DRAFTERS[name]}`")
        return folder, _family(eagle_io.read_config(folder)) or "eagle3"
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            return None
        family = _family(eagle_io.read_config(path))  # an unreadable config.json is named
        return (path, family) if family else None
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        folder = _hub_folder(spec)
        return (folder, _family(eagle_io.read_config(folder))) if folder else None
    return None


def is_learned(spec: str) -> bool:
    """Whether ``spec`` names a learned drafter (never raises)."""
    if spec.removesuffix(COMBINE) == mtp.NATIVE:
        return True
    try:
        return resolve(spec) is not None
    except folders.DrafterFolderError:  # a damaged config.json: load_learned says what is wrong
        return True
    except Exception:
        return builtin_name(spec) in BUILTIN_DRAFTERS


@dataclass
class LoadedEagle3:
    """A loaded EAGLE-3 head, ready to make a fresh drafter per decode.

    Attributes:
        spec: as given.  head: the module.  info: layout and absent optional tensors.
        warnings: checks that did not refuse it (e.g. a different verifier name).
    """

    spec: str
    head: Eagle3Head
    info: dict
    warnings: list[str] = field(default_factory=list)
    load_s: float = 0.0

    def new_drafter(self, target: torch.nn.Module, vocab_size: int, name: str) -> Eagle3Drafter:
        if self.head.embed_tokens is None:
            self.head.attach(target.get_input_embeddings())
        return Eagle3Drafter(self.head, vocab_size, name=name)

    def feature_layers(self, target: torch.nn.Module) -> tuple[int, ...]:
        """The inputs of the target layers the head reads (its config's layer ids)."""
        return tuple(self.head.feature_layers)

    @property
    def weight_bytes(self) -> int:
        return param_bytes(self.head)


@dataclass
class Combined:
    """A loaded learned drafter with prompt lookup stacked over it (``<learned>+ngram``)."""

    learned: object
    load_s: float = 0.0

    @property
    def spec(self) -> str:
        """The spec it was loaded from, e.g. ``builtin:smollm2-135m-eagle3+ngram``."""
        return self.learned.spec + COMBINE

    @property
    def warnings(self) -> list[str]:
        return self.learned.warnings

    @property
    def summary(self) -> str:
        return "prompt lookup (ngram) over " + describe(self.learned)

    def feature_layers(self, target: torch.nn.Module) -> tuple[int, ...]:
        return self.learned.feature_layers(target)

    def new_drafter(self, target: torch.nn.Module, vocab_size: int, name: str):
        return CombinedDrafter(self.learned.new_drafter(target, vocab_size, name.removesuffix(COMBINE)),
                               name=name)


def _target_name(target) -> str:
    return str(getattr(target.model.config, "_name_or_path", "") or target.spec)


def eagle3_problems(head: Eagle3Head, info: dict, target) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for an EAGLE-3 head against a loaded target (one sentence each)."""
    config = target.model.config.get_text_config()
    hidden, depth, vocab = int(config.hidden_size), num_layers(target.model), target.vocab_size
    problems = index_problems(head.feature_layers, depth, "the EAGLE-3 head")
    if head.target_hidden_size != hidden:
        problems.append(f"the head reads features of width {head.target_hidden_size} per layer but "
                        f"the target's hidden size is {hidden}: it was built for another target")
    if head.embed_tokens is None and head.config.hidden_size != hidden:
        problems.append(f"the head has no embeddings of its own and its width "
                        f"{head.config.hidden_size} differs from the target's {hidden}")
    tokens = len(target.tokenizer) if hasattr(target.tokenizer, "__len__") else vocab
    if head.config.vocab_size not in (vocab, tokens):
        problems.append(f"the head was built for a vocabulary of {head.config.vocab_size} ids, the "
                        f"target has {vocab}")
    d2t = None if "d2t" in info.get("missing", []) else head.d2t
    t2d = None if "t2d" in info.get("missing", []) else head.t2d
    problems += map_problems(d2t, t2d, head.draft_vocab_size, vocab)
    warning = folders.verifier_warning("the head", head.verifier.get("name_or_path"), target)
    return problems, [warning] if warning else []


def verifier_name(target) -> str:
    """The name a head saved for ``target`` records as its verifier: the hub id (what ``vllm
    serve`` and speculators resolve), never ``builtin:`` nor a path on this machine (a local
    folder's own name then)."""
    hub_id = builtin_hub_id(target.spec)
    if hub_id is not None:
        return hub_id
    name = _target_name(target)
    path = Path(name).expanduser()
    if path.is_absolute() or name.startswith((".", "~")) or path.exists():
        return path.resolve().name
    return name

#: family -> config detector, for families other than EAGLE-3
DETECTORS: dict[str, Callable[[dict], bool]] = {dspark.FAMILY: dspark.detect,
                                                dflash.FAMILY: dflash.detect,
                                                mtp.ASSISTANT: mtp.detect_assistant}
#: family -> loader(spec, folder, target, dtype) -> loaded drafter, for families other than EAGLE-3
LOADERS: dict[str, Callable] = {dspark.FAMILY: dspark.load_checked,
                                dflash.FAMILY: dflash.load_checked,
                                mtp.ASSISTANT: mtp.load_assistant_checked}


def load_learned(spec: str, target, dtype: torch.dtype | None = None):
    """Load and check the learned drafter ``spec`` for a loaded ``target`` (models.LoadedModel).

    Args:
        dtype: the drafter's weight dtype; None (the default) loads it in the target's dtype
            (``target.dtype``): a bfloat16 target gets a bfloat16 drafter, as its hidden states
            and embeddings are bfloat16 too, and the drafter takes half the memory of float32.

    Returns:
        An object with ``new_drafter(target_model, vocab_size, name)``, ``warnings``, ``spec``
        and ``load_s`` (seconds the load and checks took).
    Raises:
        DrafterRefused: it cannot serve this target (the problems, one sentence each).
        ModelLoadError: it is not a learned drafter or its files cannot be read.
    """
    start = time.perf_counter()
    loaded = _load_learned(spec, target, dtype or target_dtype(target))
    loaded.load_s = time.perf_counter() - start
    return loaded


def target_dtype(target) -> torch.dtype:
    """The floating dtype a learned drafter of ``target`` loads in: ``target.dtype`` (the compute
    dtype when the target is quantised), float32 when it has none."""
    dtype = getattr(target, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def _load_learned(spec: str, target, dtype: torch.dtype):
    if spec.endswith(COMBINE):
        return Combined(load_learned(spec[:-len(COMBINE)], target, dtype))
    if spec == mtp.NATIVE:
        return mtp.load_native(target)
    try:
        found = resolve(spec)
    except folders.DrafterFolderError as exc:
        raise DrafterRefused(spec, target.spec, [str(exc)]) from None
    if found is None:
        raise ModelLoadError(f"{spec} is not a learned drafter folder (no EAGLE-3, DFlash, DSpark "
                             "or MTP config.json)")
    folder, family = found
    try:
        if family != "eagle3":
            return LOADERS[family](spec, folder, target, dtype)
        head, info = eagle_io.load_head(folder, num_layers(target.model), dtype)
    except folders.DrafterFolderError as exc:  # the loaders' own refusals are DrafterRefused
        raise DrafterRefused(spec, target.spec, [str(exc)]) from None
    problems, warnings = eagle3_problems(head, info, target)
    if problems:
        raise DrafterRefused(spec, target.spec, problems)
    return LoadedEagle3(spec, head.to(target.device), info, warnings)


def describe(loaded) -> str:
    """One line on what a loaded learned drafter reads and predicts."""
    head = getattr(loaded, "head", None)
    if head is None:
        return getattr(loaded, "summary", type(loaded).__name__)
    return (f"EAGLE-3 head ({loaded.info['layout']} layout) reading the inputs of target layers "
            f"{list(head.feature_layers)}, predicting {head.draft_vocab_size:,} of the target's "
            f"{head.config.vocab_size:,} ids")
