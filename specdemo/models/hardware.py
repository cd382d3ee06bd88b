"""What this machine has, which presets fit it, and how much memory is in use.

Detection: CUDA (device name, total and free memory from ``torch.cuda.mem_get_info``), Apple MPS
(unified memory: system RAM, capped by Metal's recommended working set), else CPU (cores and RAM
from psutil). A preset fits when its ``memory_bytes`` is within the free memory of a device kind it
lists. A refusal says what would fit instead: a smaller preset, the target in 4-bit (bitsandbytes,
CUDA only), or offloading layers to CPU RAM with accelerate's ``device_map="auto"``.

Nothing here touches torch at import time; :func:`detect` and :func:`memory_in_use_bytes` import it.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, Sequence

import psutil

from . import quantize


class Preset(Protocol):
    """What a fit reads of a preset (``specdemo.services.presets.Preset`` has it); named here so that
    the machine's facts do not import the presets that use them."""

    name: str
    devices: tuple[str, ...]
    quantization: str
    memory_bytes: int
    target_params: int
    gated: bool
    default: bool
    tasks: tuple[str, ...]

    def weight_bytes(self, quantization: str | None = None) -> int: ...


def format_bytes(n: int) -> str:
    """``17_578_253_056`` -> ``'17.6 GB'`` (decimal units, as model cards and GPU boxes use)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class HardwareInfo:
    """The device a model would run on, plus the host's CPU and RAM.

    Attributes:
        kind: "cuda", "mps" or "cpu".
        name: e.g. "NVIDIA GeForce RTX 4090", "Apple silicon (arm64) via MPS", the CPU model.
        total_bytes: device memory (CUDA), unified memory = system RAM (MPS), or RAM (CPU).
        free_bytes: what a model may use now on that device.
        cpu_cores: physical cores (logical when unknown).
        ram_total_bytes, ram_available_bytes: host RAM (the room for CPU offload).
    """

    kind: str
    name: str
    total_bytes: int
    free_bytes: int
    cpu_cores: int
    ram_total_bytes: int
    ram_available_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Recommendation:
    """The preset to start with (None when nothing fits) and why, in plain words."""

    preset: Preset | None
    reasons: list[str] = field(default_factory=list)


def _cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux) or platform, else "CPU"."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _mps_limit_bytes(ram_total: int) -> int:
    """Metal's recommended working-set size (torch >= 2.3), else two thirds of RAM."""
    import torch

    recommended = getattr(torch.mps, "recommended_max_memory", None)
    return int(recommended()) if recommended else ram_total * 2 // 3


def detect() -> HardwareInfo:
    """Describe this machine: the first CUDA device, else MPS, else the CPU."""
    import torch

    vm = psutil.virtual_memory()
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    host = dict(cpu_cores=cores, ram_total_bytes=vm.total, ram_available_bytes=vm.available)
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(0)
        return HardwareInfo("cuda", torch.cuda.get_device_name(0), total, free, **host)
    if torch.backends.mps.is_available():
        free = min(_mps_limit_bytes(vm.total), vm.available)
        return HardwareInfo("mps", f"Apple silicon ({platform.machine()}) via MPS", vm.total, free, **host)
    return HardwareInfo("cpu", _cpu_name(), vm.total, vm.available, **host)


def describe(hw: HardwareInfo) -> str:
    """One line: device, its memory, cores and RAM."""
    device = f"{hw.kind} {hw.name}: {format_bytes(hw.free_bytes)} free of {format_bytes(hw.total_bytes)}"
    return (f"{device}; {hw.cpu_cores} CPU cores, {format_bytes(hw.ram_total_bytes)} RAM "
            f"({format_bytes(hw.ram_available_bytes)} available)")


def _has_bitsandbytes() -> bool:
    """True when the bitsandbytes package is installed (not imported: it probes CUDA on import)."""
    return importlib.util.find_spec("bitsandbytes") is not None


def quantization_support(hw: HardwareInfo, quantization: str = "4bit") -> tuple[bool, str]:
    """Whether ``quantization`` can work here, and why (not): bitsandbytes 4bit/8bit (CUDA), or
    torchao int8/int4 (see :mod:`specdemo.models.quantize`)."""
    if quantization not in ("4bit", "8bit"):
        why = quantize.unavailable_reason(quantization, hw.kind)
        return (False, why) if why else (True, f"{quantize.describe(quantization)} available")
    if hw.kind != "cuda":
        return False, (f"4-bit/8-bit loading uses bitsandbytes, which needs an NVIDIA GPU (CUDA); "
                       f"this machine runs on {hw.kind}")
    if not _has_bitsandbytes():
        return False, "bitsandbytes is not installed (pip install bitsandbytes) - needed for 4-bit/8-bit"
    return True, "bitsandbytes 4-bit and 8-bit loading available on CUDA"


def _device_refusal(preset: Preset, hw: HardwareInfo) -> str | None:
    """Why ``preset`` cannot run on this kind of device at all, or None."""
    if hw.kind not in preset.devices:
        return f"made for {'/'.join(preset.devices)}; this machine runs on {hw.kind}"
    if hw.kind == "mps" and preset.dtype == "bfloat16":
        problem = mps_bfloat16_problem()
        if problem:
            return problem
    if preset.quantization != "none":
        ok, why = quantization_support(hw, preset.quantization)
        if not ok:
            return why
    return None


def _why_not(preset: Preset, hw: HardwareInfo) -> str | None:
    """Why ``preset`` does not fit ``hw`` (device kind, bitsandbytes, memory), or None if it fits."""
    why = _device_refusal(preset, hw)
    if why is None and preset.memory_on(hw.kind) > hw.free_bytes:
        why = (f"needs {format_bytes(preset.memory_on(hw.kind))} but only "
               f"{format_bytes(hw.free_bytes)} is free on {hw.name}")
    return why


def _fits_alone(preset: Preset, hw: HardwareInfo) -> bool:
    return _why_not(preset, hw) is None


def _four_bit_bytes(preset: Preset) -> int | None:
    """Memory the preset would need with its target in 4-bit, or None when not estimable."""
    if preset.quantization != "none" or not preset.target_params:
        return None
    return preset.memory_bytes - preset.weight_bytes() + preset.weight_bytes("4bit")


def _alternatives(preset: Preset, hw: HardwareInfo, others: Sequence[Preset]) -> list[str]:
    """What would fit instead of ``preset``: smaller presets, 4-bit, CPU offload."""
    options = []
    smaller = sorted((p for p in others if p.name != preset.name and _fits_alone(p, hw)),
                     key=lambda p: -p.memory_bytes)[:3]
    if smaller:
        options.append("a smaller preset: " + ", ".join(
            f"{p.name} ({format_bytes(p.memory_bytes)}{', gated' if p.gated else ''})" for p in smaller))
    four_bit = _four_bit_bytes(preset)
    if four_bit is not None and hw.kind in preset.devices and quantization_support(hw)[0]:
        verdict = "fits" if four_bit <= hw.free_bytes else "still too big"
        options.append(f"the target in 4-bit, about {format_bytes(four_bit)} "
                       f"({verdict}; --quantization 4bit)")
    spill = preset.memory_bytes - hw.free_bytes
    if hw.kind == "cuda" and hw.kind in preset.devices and 0 < spill <= hw.ram_available_bytes:
        options.append(f"CPU offload of about {format_bytes(spill)} with accelerate "
                       f"device_map=\"auto\" (slow: offloaded layers run at RAM/PCIe speed)")
    return options


def fits(preset: Preset, hw: HardwareInfo, alternatives: Sequence[Preset] = ()) -> tuple[bool, str]:
    """Whether ``preset`` fits ``hw``, with the reason; a refusal says what would fit instead.

    Args:
        alternatives: other presets to suggest when this one does not fit.
    Returns:
        (True, "needs X of Y free on <device>") or (False, "<why>; would fit: ...").
    """
    why = _why_not(preset, hw)
    if why is None:
        return True, (f"needs {format_bytes(preset.memory_bytes)} of "
                      f"{format_bytes(hw.free_bytes)} free on {hw.name}")
    options = _alternatives(preset, hw, alternatives)
    if options:
        return False, why + "; would fit: " + "; or ".join(options)
    return False, why + ("; nothing smaller fits" if alternatives else "")


def recommend(presets: Sequence[Preset], hw: HardwareInfo, *, allow_gated: bool = False) -> Recommendation:
    """The preset with the largest target that fits ``hw``.

    Size is the target's parameter count; among pairs with the same target the default preset
    wins, then the one with more task tags (the more general one), then the larger footprint.
    Gated presets (hub licence to accept first) are passed over unless ``allow_gated``.
    """
    fitting = [p for p in presets if _fits_alone(p, hw)]
    pool = [p for p in fitting if allow_gated or not p.gated]
    if not pool:
        sizes = ", ".join(f"{p.name} {format_bytes(p.memory_bytes)}" for p in presets) or "no presets"
        return Recommendation(None, [f"nothing fits {describe(hw)} ({sizes})"])
    best = max(pool, key=lambda p: (p.target_params, p.default, len(p.tasks), p.memory_bytes))
    reasons = [f"{best.name} has the largest target that fits: " + fits(best, hw)[1]]
    gated = [p.name for p in fitting if p.gated and p.target_params > best.target_params and not allow_gated]
    if gated:
        reasons.append(f"larger gated presets also fit once their hub licence is accepted: "
                       f"{', '.join(gated)} (python -m specdemo presets --all-gated)")
    bigger = [p for p in presets if p.target_params > best.target_params and p not in fitting]
    for preset in sorted(bigger, key=lambda p: p.target_params)[:3]:
        reasons.append(f"not {preset.name}: {_why_not(preset, hw)}")
    return Recommendation(best, reasons)


def memory_in_use_bytes(device: Any) -> int:
    """Bytes in use on ``device`` now: tensors allocated by torch on CUDA/MPS, process RSS on CPU.

    Args:
        device: "cpu", "cuda", "cuda:N", "mps" or a torch.device.
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    if device.type == "mps":
        return int(torch.mps.current_allocated_memory())
    return int(psutil.Process().memory_info().rss)


def mps_bfloat16_problem(release: str | None = None) -> str | None:
    """Why bfloat16 cannot run on Apple MPS on this Mac (macOS before 14 has no bfloat16 in
    Metal Performance Shaders), or None (macOS 14+, or not a Mac).

    Args:
        release: the macOS version ("13.6.1"); default ``platform.mac_ver()``'s ("" off macOS).
    """
    import platform
    release = platform.mac_ver()[0] if release is None else release
    try:
        major = int(release.split(".")[0])
    except ValueError:
        return None
    if major >= 14:
        return None
    return (f"bfloat16 on Apple MPS needs macOS 14 or later and this Mac runs macOS {release}; "
            "use --dtype float16 or float32, or update macOS")
