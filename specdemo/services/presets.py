"""Presets: one TOML file per target/draft pairing under ``presets/`` (data, not code).

A person edits these files by hand, so loading is strict: an unknown key, a missing key, a value
of the wrong type or an impossible number is an error that names the file and the key. Files are
read afresh on every call (they are small), so an edit shows up without a restart.

File format (every key is required unless marked optional)::

    name = "qwen2.5-7b-0.5b"          # must equal the file name without .toml
    default = false                    # optional; exactly one preset may say true
    target = "Qwen/Qwen2.5-7B-Instruct"   # anything --target accepts
    draft = "Qwen/Qwen2.5-0.5B-Instruct"  # a model, a learned drafter, ngram / self / early-exit:<layers> / mtp
    draft_kind = "model"               # optional: model (default for model specs), eagle3, dflash,
                                       # dspark, gemma4-assistant or mtp (learned drafters read the target's
                                       # hidden states and are checked against its weights)
    draft_length = 5                   # 1..64, or "auto"
    dtype = "bfloat16"                 # auto, float32, bfloat16, float16
    quantization = "none"              # none, 4bit/8bit (bitsandbytes, CUDA), int8/int4 (torchao)
    memory_bytes = 17_578_253_056      # weights + KV cache + working margin, in bytes
    target_params = 7_615_616_512      # optional, >= 0; used to estimate 4-bit needs
    draft_params = 494_032_768         # optional, >= 0
    tasks = ["chat", "code"]           # subset of chat, code, maths, grounded
    licence = "apache-2.0"
    gated = false                      # true when the hub asks you to accept a licence first
    devices = ["cuda", "mps"]          # subset of cuda, mps, cpu
    note = "one line shown in the UI"
    note_zh_tw = "該行的繁體中文"         # optional: the note on a zh-TW page (else the English one)
    note_zh_cn = "该行的简体中文"         # optional: the note on a zh-CN page
    sources = ["https://..."]          # where ids, vocab sizes and tokenizer family were checked
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import PROJECT_DIR
from ..core.draft_spec import DraftSpec, DraftSpecError, as_draft_spec
from ..core.model_spec import ModelSpec, as_model_spec, builtin_spec
from ..models import loading as models
from ..models.hardware import format_bytes  # noqa: F401  (re-exported: callers look here)
from .endpoints import EndpointError, base_url
from ..models import quantize

PRESETS_DIR = PROJECT_DIR / "presets"

TASKS = ("chat", "code", "maths", "grounded")
DEVICES = ("cuda", "mps", "cpu")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "4bit", "8bit", "int8", "int4")
MAX_DRAFT_LENGTH = 64
#: what a model-like draft spec is: an independent draft model or a learned drafter family
DRAFT_KINDS = ("model", "eagle3", "dflash", "dspark", "gemma4-assistant", "mtp")

# Bytes per parameter of the weights as loaded; 4-bit is nf4 plus one fp32 scale per 64 weights,
# 8-bit is LLM.int8 (one byte; its per-row scales are negligible); int4/int8: specdemo/models/quantize.py.
BYTES_PER_PARAM = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "auto": 2.0}
QUANT_BYTES_PER_PARAM = {"4bit": 4.5 / 8, "8bit": 1.0, "int4": 5.0 / 8, "int8": 1.0}

REQUIRED_KEYS = ("name", "target", "draft", "draft_length", "dtype", "quantization",
                 "memory_bytes", "tasks", "licence", "gated", "devices", "note", "sources")
OPTIONAL_KEYS = ("default", "target_params", "draft_params", "draft_kind", "plain_endpoint",
                 "spec_endpoint", "note_zh_tw", "note_zh_cn")


class PresetError(ValueError):
    """A preset file that cannot be used; the message names the file and, where known, the key."""


@dataclass(frozen=True)
class Preset:
    """One target/draft pairing, as read from ``presets/<name>.toml``.

    Attributes:
        target: the target model spec (a ``core.model_spec.ModelSpec``: its text, with ``kind``
            and ``builtin``); text given here is wrapped on construction.
        draft: the draft spec, parsed (a ``core.draft_spec.DraftSpec``: its text, with ``kind``,
            ``layers``, ``is_model`` ...); text given here is parsed once, on construction.
        memory_bytes: bytes the pairing needs on its device (weights + KV cache + margin).
        target_params, draft_params: parameter counts (0 when unknown or when the draft is not a
            model); they let a refusal estimate what a 4-bit target would need.
        draft_kind: for model-like drafts, "model" or the learned-drafter family (DRAFT_KINDS);
            "" for ngram / self / early-exit.
        path: the file it came from.
        note_zh_tw, note_zh_cn: the note in Traditional / Simplified Chinese ("" when the file
            has none: the page then shows the English ``note``).
    """

    name: str
    target: ModelSpec
    draft: DraftSpec
    draft_length: int | str
    dtype: str
    quantization: str
    memory_bytes: int
    tasks: tuple[str, ...]
    licence: str
    gated: bool
    devices: tuple[str, ...]
    note: str
    sources: tuple[str, ...]
    default: bool = False
    target_params: int = 0
    draft_params: int = 0
    draft_kind: str = ""
    path: Path | None = None
    plain_endpoint: str = ""
    spec_endpoint: str = ""
    note_zh_tw: str = ""
    note_zh_cn: str = ""

    def __post_init__(self) -> None:
        """Parse ``target`` and ``draft`` when they came as text.

        Raises:
            DraftSpecError: a draft spec no form accepts (the message names it).
            TypeError: a target that is not text.
        """
        object.__setattr__(self, "target", as_model_spec(self.target))
        object.__setattr__(self, "draft", as_draft_spec(self.draft))

    def note_in(self, locale: str | None) -> str:
        """The note in the page's ``locale`` ("zh-TW", "zh-CN"), else the English ``note``."""
        return {"zh-TW": self.note_zh_tw, "zh-CN": self.note_zh_cn}.get(locale or "") or self.note

    @property
    def draft_is_model(self) -> bool:
        """True when the draft has weights of its own to fetch and load (a draft model or a learned
        drafter; not none, ngram, self, early-exit:N or the target's own MTP layers)."""
        return self.draft.is_model and self.draft_kind != "mtp"

    @property
    def draft_is_learned(self) -> bool:
        """True for drafters that read the target's hidden states (EAGLE-3, DFlash, DSpark,
        MTP)."""
        return self.draft_kind not in ("", "model")

    def weight_bytes(self, quantization: str | None = None, device: str | None = None) -> int:
        """Bytes of target + draft weights, with the target loaded as ``quantization``
        (default: the preset's own); 0 when parameter counts are unknown. A draft (model or
        learned drafter) loads in the target's dtype. With ``device`` ("cuda", "mps", "cpu"),
        dtype ``auto`` counts what it resolves to there (float32 on the CPU and MPS)."""
        quantization = quantization or self.quantization
        dtype = self.dtype
        if dtype == "auto" and device in ("cpu", "mps"):
            dtype = "float32"
        per_param = QUANT_BYTES_PER_PARAM.get(quantization, BYTES_PER_PARAM[dtype])
        draft_bytes = BYTES_PER_PARAM[dtype] * self.draft_params
        return int(per_param * self.target_params + draft_bytes)

    def memory_on(self, device: str) -> int:
        """``memory_bytes`` on a device kind: more where dtype ``auto`` means float32 there."""
        return self.memory_bytes + self.weight_bytes(device=device) - self.weight_bytes()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (the path as a string)."""
        data = asdict(self)
        data["path"] = str(self.path) if self.path else None
        return data


def _fail(path: Path, key: str | None, message: str) -> PresetError:
    where = f"{path}: key {key!r}" if key else str(path)
    return PresetError(f"{where}: {message}")


def _string(path: Path, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, key, f"must be a non-empty string, got {value!r}")
    return value


def _choice(path: Path, key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise _fail(path, key, f"must be one of {', '.join(allowed)}; got {value!r}")
    return value


def _subset(path: Path, key: str, value: Any, allowed: tuple[str, ...] | None) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise _fail(path, key, f"must be a non-empty list, got {value!r}")
    for item in value:
        if not isinstance(item, str) or (allowed is not None and item not in allowed):
            wanted = f"one of {', '.join(allowed)}" if allowed else "a string"
            raise _fail(path, key, f"each entry must be {wanted}; got {item!r}")
    return tuple(value)


def _integer(path: Path, key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(path, key, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _boolean(path: Path, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, key, f"must be true or false, got {value!r}")
    return value


def _draft_length(path: Path, value: Any) -> int | str:
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DRAFT_LENGTH:
        raise _fail(path, "draft_length", f"must be 1..{MAX_DRAFT_LENGTH} or \"auto\"; got {value!r}")
    return value


def _draft(path: Path, value: Any) -> DraftSpec:
    try:
        return as_draft_spec(_string(path, "draft", value))
    except DraftSpecError as exc:
        raise _fail(path, "draft", str(exc)) from None


def _draft_kind(path: Path, data: dict[str, Any], draft: DraftSpec) -> str:
    """The declared kind of a model-like ``draft`` ("model" by default); "" for the others."""
    model_like = draft.is_model
    kind = data.get("draft_kind", ("mtp" if draft == "mtp" else "model") if model_like else "")
    if not model_like and kind:
        raise _fail(path, "draft_kind", f"only model-like drafts have a kind; {draft!r} has none")
    if model_like:
        _choice(path, "draft_kind", kind, DRAFT_KINDS)
        if (kind == "mtp") != (draft == "mtp"):
            raise _fail(path, "draft_kind", 'kind "mtp" goes with draft = "mtp" (the target\'s own '
                                            f"MTP layers) and only with it; got {kind!r} for {draft!r}")
    return kind


def _endpoint(path: Path, key: str, value: Any) -> str:
    """An OpenAI-compatible server's base URL for a lane ("" = our engine). A remote host is
    accepted here; using it still needs the explicit allow-remote choice."""
    if value == "":
        return ""
    try:
        return base_url(_string(path, key, value), allow_remote=True)
    except EndpointError as exc:
        raise _fail(path, key, str(exc)) from None


def _check_keys(path: Path, data: dict[str, Any]) -> None:
    known = set(REQUIRED_KEYS) | set(OPTIONAL_KEYS)
    for key in data:
        if key not in known:
            raise _fail(path, key, f"unknown key (known keys: {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)})")
    for key in REQUIRED_KEYS:
        if key not in data:
            raise _fail(path, key, "missing")


def _check_consistency(preset: Preset) -> None:
    """Cross-field rules: name matches the file, quantisation only on the devices its method
    runs on (specdemo/models/quantize.py DEVICES), memory covers weights."""
    path = preset.path or Path(preset.name)
    if preset.path is not None and preset.name != preset.path.stem:
        raise _fail(path, "name", f"{preset.name!r} differs from the file name {preset.path.stem!r}")
    allowed = quantize.DEVICES.get(preset.quantization)
    if allowed and not set(preset.devices) <= set(allowed):
        raise _fail(path, "devices", f"quantization {preset.quantization} ({quantize.describe(preset.quantization)}) "
                                     f"runs on {list(allowed)} only; got {list(preset.devices)}")
    weights = preset.weight_bytes()
    if preset.memory_bytes < weights:
        raise _fail(path, "memory_bytes", f"{preset.memory_bytes:,} is less than the weights alone "
                                          f"({weights:,} bytes from target_params/draft_params)")
    if preset.draft_params and not preset.draft_is_model:
        raise _fail(path, "draft_params", f"must be 0 when the draft is {preset.draft!r} (not a model)")


def parse_preset(data: dict[str, Any], path: Path) -> Preset:
    """Validate one preset's parsed TOML table.

    Raises:
        PresetError: naming ``path`` and the offending key.
    """
    _check_keys(path, data)
    draft = _draft(path, data["draft"])
    preset = Preset(
        name=_string(path, "name", data["name"]),
        target=_string(path, "target", data["target"]),
        draft=draft,
        draft_length=_draft_length(path, data["draft_length"]),
        dtype=_choice(path, "dtype", data["dtype"], DTYPES),
        quantization=_choice(path, "quantization", data["quantization"], QUANTIZATIONS),
        memory_bytes=_integer(path, "memory_bytes", data["memory_bytes"], 1),
        tasks=_subset(path, "tasks", data["tasks"], TASKS),
        licence=_string(path, "licence", data["licence"]),
        gated=_boolean(path, "gated", data["gated"]),
        devices=_subset(path, "devices", data["devices"], DEVICES),
        note=_string(path, "note", data["note"]),
        sources=_subset(path, "sources", data["sources"], None),
        default=_boolean(path, "default", data.get("default", False)),
        target_params=_integer(path, "target_params", data.get("target_params", 0), 0),
        draft_params=_integer(path, "draft_params", data.get("draft_params", 0), 0),
        draft_kind=_draft_kind(path, data, draft),
        path=path,
        plain_endpoint=_endpoint(path, "plain_endpoint", data.get("plain_endpoint", "")),
        spec_endpoint=_endpoint(path, "spec_endpoint", data.get("spec_endpoint", "")),
        note_zh_tw=_string(path, "note_zh_tw", data["note_zh_tw"]) if "note_zh_tw" in data else "",
        note_zh_cn=_string(path, "note_zh_cn", data["note_zh_cn"]) if "note_zh_cn" in data else "",
    )
    _check_consistency(preset)
    return preset


def load_preset(path: Path) -> Preset:
    """Read and validate one preset file.

    Raises:
        PresetError: the file is unreadable, not TOML, or fails validation.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _fail(path, None, f"cannot read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise _fail(path, None, f"not valid TOML: {exc}") from exc
    return parse_preset(data, path)


def list_presets(directory: Path | None = None) -> tuple[Preset, ...]:
    """Every preset under ``directory`` (default: the repository's ``presets/``), by name.

    Raises:
        PresetError: any file fails validation, two presets share a name, or more than one
            says ``default = true``.
    """
    directory = Path(directory) if directory else PRESETS_DIR
    presets = tuple(load_preset(path) for path in sorted(directory.glob("*.toml")))
    defaults = [p.name for p in presets if p.default]
    if len(defaults) > 1:
        raise PresetError(f"{directory}: more than one preset says default = true: {', '.join(defaults)}")
    return presets


def get_preset(name: str, directory: Path | None = None) -> Preset:
    """The preset called ``name``.

    Raises:
        PresetError: no such preset (the message lists the known names).
    """
    presets = list_presets(directory)
    for preset in presets:
        if preset.name == name:
            return preset
    known = ", ".join(p.name for p in presets) or "none (presets/ is empty)"
    raise PresetError(f"preset {name!r} does not exist; valid presets: {known}")  # as the app says


def default_preset(directory: Path | None = None) -> Preset:
    """The preset marked ``default = true`` (else the first by name).

    Raises:
        PresetError: there are no presets at all.
    """
    presets = list_presets(directory)
    if not presets:
        raise PresetError(f"{Path(directory) if directory else PRESETS_DIR}: no preset files")
    return next((p for p in presets if p.default), presets[0])


def default_target(directory: Path | None = None) -> ModelSpec:
    """The target of :func:`default_preset` (model names live in ``presets/``): what the commands
    and the page use when none is given; the built-in table's fallback target
    (``models.builtin.FALLBACK_BUILTIN``) when no preset can be read."""
    try:
        return default_preset(directory).target
    except PresetError:
        return ModelSpec(builtin_spec(models.builtin.FALLBACK_BUILTIN))


def _is_hub_id(spec: str) -> bool:
    """True for ``owner/name`` hub ids (not builtin:, a bare drafter or model name, a .gguf or
    a local path: ``ModelSpec.kind``)."""
    return as_model_spec(spec).kind == "hub" and spec.count("/") == 1


def hub_models_to_fetch(preset: Preset) -> list[str]:
    """The preset's hub model ids that are not in the local Hugging Face cache yet.

    Checks the cache only (no network): a model counts as present when its config.json is cached.
    """
    from huggingface_hub import try_to_load_from_cache  # a transformers dependency

    specs = [preset.target] + ([preset.draft] if preset.draft_is_model else [])
    return [spec for spec in specs
            if _is_hub_id(spec) and not isinstance(try_to_load_from_cache(spec, "config.json"), str)]


def hub_unavailable() -> str | None:
    """Why models cannot be downloaded now (HF_HUB_OFFLINE set, or the hub did not answer a
    quick request), or None when the hub is reachable."""
    if models._hub_offline():
        return "HF_HUB_OFFLINE is set, so nothing is downloaded"
    if not models._hub_reachable(timeout_s=3.0):
        return "the model hub (huggingface.co) is not reachable from this machine"
    return None
