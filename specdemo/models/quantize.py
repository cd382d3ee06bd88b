"""Quantised targets: which method runs where, and applying torchao's on the CPU.

Two families, one ``--quantization`` flag:

* ``4bit`` / ``8bit``: bitsandbytes (nf4 / LLM.int8), loaded by transformers' ``BitsAndBytesConfig``
  on a CUDA GPU only. Its CPU backend runs, but on a 2-core Xeon it was slower than float32
  (SmolLM2-135M's 211 linears: int8 144 ms, nf4 104-164 ms against float32 44 ms per pass), so
  it stays CUDA-only here.
* ``int8`` / ``int4``: torchao (``torchao.quantization.quantize_``) applied after loading.
  ``int4`` is torchao's CPU int4 weight-only layout (``Int4OpaqueTensor``: groupwise asymmetric
  int4, the ``_weight_int4pack_mm_for_cpu`` kernel); CPU only. That kernel is fast only with
  bfloat16 activations (float32 ones measured 6x slower), so each int4 layer casts its input to
  bfloat16 and its output back, and the rest of the model (attention, norms, residuals) keeps the
  loaded dtype. A verification forward is not bit-identical to one-token steps: in the bench
  (ngram, 10 prompts, k = 2, 4, auto) greedy speculative output differed from plain on 2 of 10
  prompts (6 of 30 runs), against 0 in float32 and 4 of 10 with the whole model in bfloat16.
  ``int8`` is ``Int8WeightOnlyConfig`` (per-row scales), CPU and CUDA.

The output head is quantised too (it is a fifth of a small model's weights); when it shares its
weight with the input embedding, the head gets its own copy first so the embedding stays exact.
Where batched verification is not bit-identical to one-token steps, greedy speculative output can
differ from plain greedy: the race and ``compare`` show it (identical / first_divergence).
"""

from __future__ import annotations

import importlib.util
import logging

log = logging.getLogger(__name__)

BITSANDBYTES = ("4bit", "8bit")
TORCHAO = ("int8", "int4")
QUANTIZATION_CHOICES = BITSANDBYTES + TORCHAO
INT4_GROUP_SIZES = (128, 64, 32)  # largest that divides a layer's input width is used
# Bytes per weight as stored: int4 + a bf16 scale and zero per group of 32; int8 + row scales.
BYTES_PER_PARAM = {"4bit": 4.5 / 8, "8bit": 1.0, "int4": 5.0 / 8, "int8": 1.0}
DEVICES = {"4bit": ("cuda",), "8bit": ("cuda",), "int4": ("cpu",), "int8": ("cpu", "cuda")}
INT4_ACTIVATIONS = "bfloat16"  # what torchao's CPU int4 kernel is fast with


def describe(quantization: str) -> str:
    """One line naming the method and its library."""
    return {"4bit": "bitsandbytes nf4 4-bit (CUDA)", "8bit": "bitsandbytes LLM.int8 8-bit (CUDA)",
            "int4": "torchao int4 weight-only (CPU)",
            "int8": "torchao int8 weight-only (CPU, CUDA)"}[quantization]


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def unavailable_reason(quantization: str, device_kind: str) -> str | None:
    """Why ``quantization`` cannot be used on a ``device_kind`` ("cuda", "mps", "cpu") device,
    or None when it can. Checks installed packages without importing them."""
    if quantization in BITSANDBYTES:
        if device_kind != "cuda":
            return (f"{quantization} quantization uses bitsandbytes, which needs a CUDA GPU; this "
                    f"run uses {device_kind}: use int4 or int8 (torchao) on a CPU, or load "
                    "without quantization")
        if not _has("bitsandbytes"):
            return (f"{quantization} quantization needs the bitsandbytes package "
                    "(pip install bitsandbytes)")
        return None
    if quantization not in TORCHAO:
        return f"unknown quantization '{quantization}'; use none, " + ", ".join(QUANTIZATION_CHOICES)
    if not _has("torchao"):
        return f"{quantization} quantization needs the torchao package (pip install torchao)"
    if quantization == "int4" and device_kind != "cpu":
        return (f"int4 uses torchao's CPU int4 kernel; on {device_kind} use 4bit (bitsandbytes, "
                "CUDA) or load without quantization")
    if quantization == "int8" and device_kind == "mps":
        return "int8 (torchao) has no Apple MPS kernels; load without quantization on mps"
    return None


def _group_size(in_features: int) -> int | None:
    return next((g for g in INT4_GROUP_SIZES if in_features % g == 0), None)


def _untie_head(model) -> None:
    """Give the output head its own weight when it shares the input embedding's."""
    import torch
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and embedding is not None and head.weight is embedding.weight:
        head.weight = torch.nn.Parameter(embedding.weight.detach().clone(), requires_grad=False)
        if hasattr(model.config, "tie_word_embeddings"):
            model.config.tie_word_embeddings = False


def _int4_forward(self, x):
    """An int4 layer: the kernel's bfloat16 in, the model's dtype out. x: (..., in) -> (..., out)."""
    import torch
    import torch.nn.functional as F
    return F.linear(x.to(getattr(torch, INT4_ACTIVATIONS)), self.weight, self.bias).to(x.dtype)


def _quantize_int4(model, linears) -> int:
    """int4 with bfloat16 scales for every linear whose input width a group size divides; each
    gets :func:`_int4_forward`."""
    import types
    import torch
    from torchao.quantization import quantize_
    from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
    bf16 = getattr(torch, INT4_ACTIVATIONS)
    done = 0
    for group in INT4_GROUP_SIZES:
        chosen = {m for m in linears if _group_size(m.in_features) == group}
        for m in chosen:
            m.to(bf16)  # weight and bias: the kernel's dtype
        if chosen:
            quantize_(model, PrototypeInt4WeightOnlyConfig(group_size=group),
                      filter_fn=lambda m, fqn, chosen=chosen: m in chosen)
            for m in chosen:
                m.forward = types.MethodType(_int4_forward, m)
            done += len(chosen)
    return done


def quantize_model(model, quantization: str) -> int:
    """Quantise the model's ``nn.Linear`` weights in place with torchao (output head included).

    Args:
        model: a transformers causal LM on its device, in eval mode; the other layers keep its
            dtype (float32 recommended on the CPU: see the module docstring).
        quantization: "int8" or "int4".
    Returns:
        Number of linears quantised (int4 skips layers whose width no group size divides).
    Raises:
        ValueError: for a method that is not torchao's.
    """
    import torch
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    if quantization not in TORCHAO:
        raise ValueError(f"{quantization} is not a torchao quantization ({', '.join(TORCHAO)})")
    _untie_head(model)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    if quantization == "int4":
        return _quantize_int4(model, linears)
    chosen = set(linears)
    quantize_(model, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: m in chosen)
    return len(linears)
