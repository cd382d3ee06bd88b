"""The ``int8`` target backend: our own forward of a Llama-architecture target with int8 weights
and a static KV cache, for CPUs (issue 18's second candidate, after gpt-fast's ``model.py``).

What it does differently from the transformers path:

* **int8 weights, int8 dot products.** Every linear of the decoder and the output head keeps its
  weight as int8 with one float32 scale per output channel (symmetric, ``scale = max|w| / 127``),
  a quarter of the float32 bytes. Each *row* of the activations is quantised to int8 with its own
  scale (``max|x| / 127``), multiplied in integers (int32 accumulation, exact) and scaled back: ``y[i, o] = (xq[i] . wq[o]) * sx[i] * sw[o]``, by oneDNN's prepacked int8
  kernel (:func:`onednn_linear`, the default on x86), ``torch._int_mm`` (:func:`int8_linear`)
  or fbgemm's (:func:`fbgemm_linear`, not exact across batch sizes): :func:`default_kernel`.
  The integer sums are exact and every scale belongs to one row, so a row's result does not
  depend on the other rows of the batch; attention in a forward of up to :data:`EXACT_WIDTH` tokens is
  computed per query over the keys up to its position, as a one-token step computes it. So a
  forward over [last token, d1..dk] gives each position the logits one-token forwards give it,
  bit for bit, and greedy speculative output equals plain output on this backend (an exact
  rounding model matters here: a last-bit difference can move one activation across an int8
  rounding boundary, and that moves the logits by a quantisation step). This is W8A8 with dynamic
  per-token activation scales (as in LLM.int8() without its outlier columns, or SmoothQuant
  without smoothing), not gpt-fast's weight-only int8 ``F.linear(x, w.to(x.dtype)) * scales``:
  on this CPU that (compiled) and ``aten._weight_int8pack_mm`` ran 6-60x slower per linear
  than ``_int_mm``. The fused matrices are [q; k; v] and [gate; up]: a layer runs 4 multiplies.
* **SmoothQuant smoothing** (Xiao et al. 2023) before quantising: per input channel of the
  [q; k; v], [gate; up] and down multiplies, ``s = sqrt(max|x| / max|w|)`` measured on one
  float32 forward of fixed token ids (:func:`input_amax`), folded into the RMSNorm weights (and
  the up rows for down): the same function, with the activations' outlier channels moved into
  the weights. On SmolLM2-135M it halved the mean logit difference to float32 (0.99 -> 0.46).
* **a static KV cache**: one preallocated float32 tensor per layer for keys and one for values,
  (kv_heads, capacity, head_dim), written at the fed positions; rollback sets ``length`` (gpt-fast's
  position-indexed cache). Capacity grows by doubling when a forward would pass it.
* **rotary tables precomputed** once for the cache's capacity by the model's own rotary module
  (so every rope scaling transformers implements is honoured).
* optionally (``SPECDEMO_INT8_COMPILE=1``, :func:`compile_enabled` says why not by default)
  ``torch.compile`` of the per-layer step for forwards of up to :data:`COMPILE_MAX_WIDTH`
  tokens, with inductor's FX graph cache in ``models.cache_dir()/inductor``
  (``TORCHINDUCTOR_CACHE_DIR``), so a second start reads compiled code from disk.

The embeddings stay the transformers model's float32 tensor (shared, no copy); the transformers
model's forward is never called. Logits differ from the float32 reference by the int8 rounding of
weights and activations: the transformers float32 path stays the reference for losslessness
tests, and speculative output on this backend is compared with plain output *of this backend*.
"""

from __future__ import annotations

import logging
import os
import threading

import torch
import torch.nn.functional as F

from ..core.errors import ModelLoadError
from ..core.kv import RotaryTables, StaticCacheKV
from ..core.shape import ModelShape
from .attached import attached
from ..core import machine
from .builtin import cache_dir

log = logging.getLogger(__name__)

NAME = "int8"
ARCHITECTURES = ("llama",)  # transformers model_type values whose forward this module mirrors
MIN_CAPACITY = 512  # cache positions allocated at first; doubled when a forward passes them
COMPILE_ENV = "SPECDEMO_INT8_COMPILE"  # "1": torch.compile the layer step (see compile_layer)
EXACT_WIDTH = 16  # forwards up to this many tokens compute each position as a one-token step
COMPILE_MAX_WIDTH = 16  # forwards over more tokens (prefill chunks) run eager: no compile per length


class Int8Error(ModelLoadError):
    """The int8 backend cannot serve this target (a ``ModelLoadError``: the CLI, the page and
    ``/race`` show its one sentence)."""


# ----------------------------------------------------------------------------- int8 linear

def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (N, K) float -> ((N, K) int8, (N,) float32 scales) with
    ``w ~= q * scale[:, None]``; an all-zero row gets scale 1 (its q is 0)."""
    w = w.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    scale = torch.where(w.abs().amax(dim=1) > 0, scale, torch.ones_like(scale))
    return q, scale


def int8_linear(x: torch.Tensor, wq_t: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """``x @ W^T`` with W int8 per output channel and x quantised per row.

    Args:
        x: (M, K) float32 activations.
        wq_t: (K, N) int8, the quantised weight transposed (``_int_mm``'s layout).
        w_scale: (N,) float32 scales of the weight's output channels.
    Returns:
        (M, N) float32.
    """
    x_scale = (x.abs().amax(dim=-1, keepdim=True) / 127).clamp_min(1e-12)  # (M, 1)
    xq = torch.round(x / x_scale).clamp_(-127, 127).to(torch.int8)
    return torch._int_mm(xq, wq_t).float() * (x_scale * w_scale)


def _fbgemm_pack(q: torch.Tensor, scale: torch.Tensor):
    """fbgemm's prepacked form of an (N, K) int8 weight with per-row scales (zero points 0)."""
    import warnings
    with warnings.catch_warnings():  # torch.ao's quantized-tensor constructors are deprecated
        warnings.simplefilter("ignore")
        qw = torch._make_per_channel_quantized_tensor(q, scale.double(),
                                                      torch.zeros(q.shape[0], dtype=torch.long), 0)
        return torch.ops.quantized.linear_prepack(qw, None)


def fbgemm_linear(x: torch.Tensor, packed, w_scale: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`int8_linear`'s product through fbgemm's prepacked int8 kernel
    (``quantized::linear_dynamic``, AVX2/AVX-512 VNNI).

    fbgemm quantises its whole input with one range, so each row is first divided by its own
    ``max|x| / 127`` and a row holding -127 and +127 is appended: the range is then [-127, 127]
    whatever the batch holds, and every row is quantised (uint8, zero point 127/128) and summed
    in integers exactly as it would be alone. The result is multiplied back by the row scales.

    Args:
        x: (M, K) float32; packed: from :func:`_fbgemm_pack` (the weight scales are inside).
    Returns:
        (M, N) float32.
    """
    x_scale = (x.abs().amax(dim=-1, keepdim=True) / 127).clamp_min(1e-12)  # (M, 1)
    y = torch.ops.quantized.linear_dynamic(torch.cat([x / x_scale, _pin(x.shape[1])]), packed,
                                           False)
    return y[:-1] * x_scale


_PINS: dict[int, torch.Tensor] = {}


def _pin(width: int) -> torch.Tensor:
    """(1, width) float32 row [-127, 0, ..., 0, 127] (made once per width)."""
    pin = _PINS.get(width)
    if pin is None:
        pin = torch.zeros(1, width)
        pin[0, 0], pin[0, -1] = -127.0, 127.0
        _PINS[width] = pin
    return pin


def onednn_linear(x: torch.Tensor, packed, w_scale: torch.Tensor) -> torch.Tensor:
    """:func:`int8_linear`'s product through oneDNN's prepacked int8 kernel
    (``onednn::qlinear_pointwise``, what inductor's x86 int8 lowering calls): each row
    quantised with its own scale, passed as uint8 with zero point 128 and input scale 1, so the
    kernel's integer sums are ``xq . wq`` and its float output ``(xq . wq) * w_scale``.

    Args:
        x: (M, K) float32; packed: ``onednn::qlinear_prepack`` of the (N, K) int8 weight;
        w_scale: (N,) float32.
    Returns:
        (M, N) float32.
    """
    x_scale = (x.abs().amax(dim=-1, keepdim=True) / 127).clamp_min(1e-12)  # (M, 1)
    xu = (torch.round(x / x_scale).clamp_(-127, 127) + 128).to(torch.uint8)
    y = torch.ops.onednn.qlinear_pointwise(xu, 1.0, 128, packed, w_scale, _zeros(w_scale.shape[0]),
                                           None, 1.0, 0, torch.float32, "none", [], "")
    return y * x_scale


_ZEROS: dict[int, torch.Tensor] = {}


def _zeros(n: int) -> torch.Tensor:
    z = _ZEROS.get(n)
    if z is None:
        z = _ZEROS[n] = torch.zeros(n, dtype=torch.long)
    return z


def onednn_available() -> bool:
    """Whether this torch has oneDNN's int8 linear (x86 builds with mkldnn)."""
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")
    except (AttributeError, RuntimeError):
        return False


KERNEL_ENV = "SPECDEMO_INT8_KERNEL"  # onednn | int_mm | fbgemm (see default_kernel)
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def onednn_exact() -> bool:
    """Whether oneDNN's u8 x s8 kernel sums exactly here: False on an x86 CPU without VNNI
    (none of :data:`VNNI_FLAGS`), where its u8 x s8 kernels add product pairs in saturating
    16-bit sums (``vpmaddubsw``; oneDNN's developer guide, "Nuances of int8 Computations"). On a
    2-core AMD EPYC (Zen 3, AVX2) a product was off by 0.86 of ~1.9 and a tiny test model's
    logits by 0.11 where 0.02 is allowed: a row's result is no longer its integer product."""
    import platform
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return True
    return any(flag in machine.cpu_flags().split() for flag in VNNI_FLAGS)


def default_kernel() -> str:
    """``onednn`` where this torch has it, else ``int_mm``; ``SPECDEMO_INT8_KERNEL`` chooses
    (``onednn``, ``int_mm`` or ``fbgemm``). With ``SPECDEMO_INT8_COMPILE=1``: ``int_mm`` (inductor
    refuses ``onednn::qlinear_pointwise`` with an unfrozen packed weight: "packed_weight must be
    a graph constant"), or ``fbgemm`` if asked (it compiles with graph breaks).

    ``int_mm`` is exact per row (integer sums, elementwise float scaling); oneDNN's prepacked
    kernel gave bit-identical rows for every batch size 1-17 on every matrix shape of
    SmolLM2-135M and of the tiny test models (its float epilogue is one elementwise multiply)
    and streams the weights 2.5x faster (5.0 against 12.7 ms for 30 3072x576 matrices, one
    thread). With either, and per-query attention, a verification forward's logits equal
    one-token steps' bit for bit, and greedy speculative output equals plain output on this
    backend. fbgemm was fastest here (20.7 ms a one-token forward, one thread) but its float
    epilogue differs in the last bits between batch sizes, and the next layer's int8 rounding
    amplifies that: greedy speculative output differed from plain on 11 (n-gram) and 16
    (EAGLE-3) of 20 prompts (docs/cpu-backends.md). On an x86 CPU without VNNI oneDNN's sums
    are not exact (:func:`onednn_exact`): ``int_mm`` there, whatever was asked."""
    asked = os.environ.get(KERNEL_ENV, "").strip().lower()
    if asked == "fbgemm" and "fbgemm" in torch.backends.quantized.supported_engines:
        return "fbgemm"
    if asked == "int_mm" or not onednn_available():
        return "int_mm"
    if not onednn_exact():
        if asked == "onednn":
            log.warning("%s=onednn: this CPU has no VNNI, so oneDNN's int8 sums saturate and "
                        "are not exact; int_mm is used", KERNEL_ENV)
        return "int_mm"
    if compile_enabled():  # inductor lowers onednn::qlinear_pointwise only for frozen weights
        if asked == "onednn":
            log.warning("%s=1 compiles with the int_mm kernel: inductor cannot compile oneDNN's "
                        "int8 linear without freezing the weights", COMPILE_ENV)
        return "int_mm"
    return "onednn"


class Int8Linear:
    """One quantised matrix: ``__call__(x (M, K)) -> (M, N)`` float32, by :func:`onednn_linear`
    (``onednn``), :func:`int8_linear` (``int_mm``) or :func:`fbgemm_linear` (``fbgemm``); the
    same integer products each way (fbgemm's: up to one uint8 step per element).

    Args:
        weights: float (N_i, K) matrices stacked along the output dimension (a fused [q; k; v]).
        kernel: ``onednn``, ``int_mm`` or ``fbgemm`` (default :func:`default_kernel`).
    """

    def __init__(self, *weights: torch.Tensor, kernel: str | None = None) -> None:
        q, self.scale = quantize_rows(torch.cat([w.detach() for w in weights], dim=0))
        self.kernel = kernel or default_kernel()
        self.out_features, self.in_features = q.shape
        if self.kernel == "fbgemm":
            self.packed = _fbgemm_pack(q, self.scale)
        elif self.kernel == "onednn":
            self.packed = torch.ops.onednn.qlinear_prepack(q, None)
        else:
            self.wq_t = q.t().contiguous()  # (K, N)

    @property
    def nbytes(self) -> int:
        return self.out_features * self.in_features + self.scale.numel() * 4

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "fbgemm":
            return fbgemm_linear(x, self.packed)
        if self.kernel == "onednn":
            return onednn_linear(x, self.packed, self.scale)
        return int8_linear(x, self.wq_t, self.scale)


# ----------------------------------------------------------------------------- the model

def llama_reason(model: torch.nn.Module, backend: str,
                 architectures: tuple[str, ...] = ARCHITECTURES, on_cpu: bool = True) -> str | None:
    """Why a backend that mirrors the Llama forward (this module's, the native C one, the
    cuda-graphs one) cannot compute ``model``'s forward, as far as the architecture and the
    device go (None when it can): a ``model_type`` in ``architectures`` with SiLU MLPs, no
    biases, no sliding window, on the CPU unless ``on_cpu`` is False. ``backend`` names the
    backend in the sentence ("int8", "native")."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in architectures:
        return f"the {backend} backend computes Llama-architecture targets; this one is {kind!r}"
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return f"the {backend} backend computes Llama targets without biases; this one has biases"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"the {backend} backend computes SiLU MLPs; this target uses {cfg.hidden_act}"
    if getattr(cfg, "sliding_window", None):
        return f"the {backend} backend has no sliding-window attention"
    device = next(model.parameters()).device.type
    if on_cpu and device != "cpu":
        return f"the {backend} backend runs on the CPU; this target is on {device}"
    return None


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the int8 backend cannot compute ``model``'s forward (None when it can): a Llama
    (``model_type`` in :data:`ARCHITECTURES`) with SiLU MLPs, no biases, no sliding window, on
    the CPU in float32 (:func:`llama_reason`)."""
    reason = llama_reason(model, "int8")
    if reason is not None:
        return reason
    p = next(model.parameters())
    if p.dtype != torch.float32:
        return (f"the int8 backend quantises float32 weights; this target is {p.dtype} "
                "(load it with --dtype float32)")
    return None


class Int8Model(RotaryTables, ModelShape):
    """The quantised weights of one transformers Llama, built once and shared by its caches.

    Args:
        model: a transformers ``LlamaForCausalLM`` on the CPU in float32.
        smooth: migrate activation outliers into the weights first (:func:`smoothing`) for the
            [q; k; v], [gate; up] and down multiplies (the same function, other rounding).
    Raises:
        Int8Error: :func:`unsupported_reason`.
    """

    def __init__(self, model: torch.nn.Module, smooth: bool = True) -> None:
        reason = unsupported_reason(model)
        if reason:
            raise Int8Error(reason)
        ModelShape.__init__(self, model.config)
        self.model = model
        base = model.model
        self.embed = base.embed_tokens.weight  # (V, H) float32, shared with transformers
        self.vocab = self.embed.shape[0]
        amax = input_amax(model) if smooth else None
        with torch.no_grad():
            self.layers = []
            for i, layer in enumerate(base.layers):
                a, m = layer.self_attn, layer.mlp
                qkv = [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]
                gate_up = [m.gate_proj.weight, m.up_proj.weight]
                down = m.down_proj.weight
                norm1 = layer.input_layernorm.weight.detach()
                norm2 = layer.post_attention_layernorm.weight.detach()
                if amax is not None:  # SmoothQuant: x / s and W * s, s folded into what feeds x
                    s1 = smoothing(amax[i]["qkv"], torch.cat(qkv))
                    qkv, norm1 = [w * s1 for w in qkv], norm1 / s1
                    s2 = smoothing(amax[i]["gate_up"], torch.cat(gate_up))
                    gate_up, norm2 = [w * s2 for w in gate_up], norm2 / s2
                    s3 = smoothing(amax[i]["down"], down)
                    gate_up[1], down = gate_up[1] / s3[:, None], down * s3
                self.layers.append({
                    "qkv": Int8Linear(*qkv),
                    "o": Int8Linear(a.o_proj.weight),
                    "gate_up": Int8Linear(*gate_up),
                    "down": Int8Linear(down),
                    "norm1": norm1,
                    "norm2": norm2,
                })
            self.norm = base.norm.weight.detach()
            self.head = Int8Linear(model.get_output_embeddings().weight)
        self.rotary = base.rotary_emb
        self.scaling = getattr(model.model.layers[0].self_attn, "scaling", self.head_dim ** -0.5)
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one forward reads: the int8 matrices and their scales, the norms
        (the embedding rows read are not counted, as in ``costs.weight_bytes_per_forward``)."""
        total = self.head.nbytes + self.norm.numel() * 4
        for lay in self.layers:
            total += sum(lay[k].nbytes for k in ("qkv", "o", "gate_up", "down"))
            total += (lay["norm1"].numel() + lay["norm2"].numel()) * 4
        return total



SMOOTH_ALPHA = 0.5  # SmoothQuant's migration strength (Xiao et al. 2023, sec. 4)
CALIBRATION_IDS = 256  # token ids 100..355 fed once to measure the activations' channel maxima


@torch.no_grad()
def input_amax(model: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    """Per layer, the (K,) maximum |activation| of each input channel of the [q; k; v], [gate;
    up] and down multiplies, over one float32 forward of :data:`CALIBRATION_IDS` fixed token
    ids (outlier channels of LLM activations are the same channels whatever the text; Dettmers
    et al. 2022, Xiao et al. 2023)."""
    out: list[dict[str, torch.Tensor]] = []
    hooks = []

    def keep(store, key):
        def hook(module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(0)
            store[key] = torch.maximum(store[key], x) if key in store else x
        return hook

    for layer in model.model.layers:
        store: dict[str, torch.Tensor] = {}
        out.append(store)
        hooks += [layer.self_attn.q_proj.register_forward_pre_hook(keep(store, "qkv")),
                  layer.mlp.gate_proj.register_forward_pre_hook(keep(store, "gate_up")),
                  layer.mlp.down_proj.register_forward_pre_hook(keep(store, "down"))]
    try:
        vocab = model.get_input_embeddings().num_embeddings
        ids = torch.tensor([[(100 + i) % vocab for i in range(CALIBRATION_IDS)]])
        model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out


def smoothing(x_amax: torch.Tensor, w: torch.Tensor, alpha: float = SMOOTH_ALPHA) -> torch.Tensor:
    """SmoothQuant's per-input-channel factors ``s_j = max|x_j|^a / max|W_:,j|^(1-a)`` (Xiao et
    al. 2023, eq. 4): ``(x / s) @ (W * s)^T == x @ W^T`` with both factors equally hard to
    quantise. x_amax: (K,); w: (N, K). Returns (K,) float32, 1 where a channel is all zero."""
    w_amax = w.detach().float().abs().amax(0)
    s = x_amax.float().clamp_min(1e-5).pow(alpha) / w_amax.clamp_min(1e-5).pow(1 - alpha)
    return torch.where((x_amax > 0) & (w_amax > 0), s, torch.ones_like(s))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: ``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (transformers' ``apply_rotary_pos_emb``, halves layout).
    x: (heads, S, D); cos, sin: (S, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """Grouped-query attention of a few queries over the cache, as two batched products (for
    1-16 queries this is cheaper on a CPU than ``F.scaled_dot_product_attention``'s flash kernel:
    ~200 us a call for one query over 128 keys here).

    Args:
        q: (n_head, S, D); keys, values: (n_kv, T, D) with n_head a multiple of n_kv (query
            head h reads key/value head h // (n_head / n_kv), as transformers' ``repeat_kv``).
        mask: (S, T) bool, True where a query may attend; None: every key.
    Returns:
        (n_head, S, D).
    """
    n_head, s, d = q.shape
    n_kv = keys.shape[0]
    g = n_head // n_kv
    scores = q.reshape(n_kv, g * s, d) @ keys.transpose(1, 2) * scaling  # (n_kv, g*S, T)
    if mask is not None:
        scores = scores.view(n_kv, g, s, -1).masked_fill(~mask, float("-inf")).view(n_kv, g * s, -1)
    return (torch.softmax(scores, dim=-1) @ values).view(n_head, s, d)


def layer_step(x, lay, k_cache, v_cache, cos, sin, start: int, mask, n_head: int, n_kv: int,
               head_dim: int, eps: float, scaling: float):
    """One decoder layer over S new positions; writes their keys/values into the cache.

    Args:
        x: (S, H) float32 input of the layer.
        lay: the layer's weights (:class:`Int8Model` ``layers[i]``).
        k_cache, v_cache: (n_kv, capacity, head_dim), positions < start already filled.
        cos, sin: (S, head_dim) rotary tables of positions start..start+S-1.
        mask: None: every query is computed on its own, exactly as a one-token step at its
            position computes it (a verification forward); else (S, start+S) bool, True where a
            query may attend (a prefill chunk, one batched product).
    Returns:
        (S, H) float32 output of the layer.
    """
    s = x.shape[0]
    h = rms_norm(x, lay["norm1"], eps)
    qkv = lay["qkv"](h)  # (S, (n_head + 2 n_kv) D)
    q, k, v = qkv.split([n_head * head_dim, n_kv * head_dim, n_kv * head_dim], dim=-1)
    q = rotate(q.view(s, n_head, head_dim).transpose(0, 1), cos, sin)  # (n_head, S, D)
    k = rotate(k.view(s, n_kv, head_dim).transpose(0, 1), cos, sin)  # (n_kv, S, D)
    k_cache[:, start:start + s] = k
    v_cache[:, start:start + s] = v.view(s, n_kv, head_dim).transpose(0, 1)
    if mask is None:  # each query position i attends to keys 0..start+i, computed as alone
        att = torch.cat([attention(q[:, i:i + 1], k_cache[:, :start + i + 1],
                                   v_cache[:, :start + i + 1], None, scaling)
                         for i in range(s)], dim=1)  # (n_head, S, D)
    else:
        att = attention(q, k_cache[:, :start + s], v_cache[:, :start + s], mask, scaling)
    x = x + lay["o"](att.transpose(0, 1).reshape(s, n_head * head_dim))
    h = rms_norm(x, lay["norm2"], eps)
    gate, up = lay["gate_up"](h).chunk(2, dim=-1)
    return x + lay["down"](F.silu(gate) * up)


class Int8KV(StaticCacheKV):
    """:class:`specdemo.core.kv.KVModel`'s interface over an :class:`Int8Model`: a static KV
    cache of one sequence, rollback by length.

    Args:
        qmodel: the quantised weights.
        capacity: cache positions allocated at first (grows by doubling).
    """

    backend = NAME

    def __init__(self, qmodel: Int8Model, capacity: int = MIN_CAPACITY) -> None:
        self.qmodel = qmodel
        self.n_layer = qmodel.n_layer
        self.model = qmodel.model  # what callers read: config, input embeddings
        self.device = torch.device("cpu")
        self.capacity = 0
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self._grow(capacity)
        self.reset()

    def _grow(self, needed: int) -> None:
        capacity = max(self.capacity, MIN_CAPACITY)
        while capacity < needed:
            capacity *= 2
        if capacity == self.capacity:
            return
        m = self.qmodel
        new_k = [torch.zeros(m.n_kv, capacity, m.head_dim) for _ in range(m.n_layer)]
        new_v = [torch.zeros(m.n_kv, capacity, m.head_dim) for _ in range(m.n_layer)]
        for old, new in zip(self.k_cache + self.v_cache, new_k + new_v):
            new[:, :self.capacity] = old
        self.k_cache, self.v_cache, self.capacity = new_k, new_v, capacity
        m.rope(capacity)

    @property
    def cache_bytes(self) -> int:
        """Bytes of the float32 keys and values of the cached tokens (``capacity`` of them are
        allocated)."""
        return self.qmodel.kv_bytes(self.length, 4)

    # ------------------------------------------------------------------ internals

    @torch.inference_mode()
    def _run(self, ids: list[int], keep: int, layers: tuple[int, ...]):
        m = self.qmodel
        s, start = len(ids), self.length
        self._grow(start + s)
        cos_all, sin_all = m.rope(self.capacity)
        cos, sin = cos_all[start:start + s], sin_all[start:start + s]
        mask = None  # up to EXACT_WIDTH tokens: attention per query, as one-token steps do
        if s > EXACT_WIDTH:  # query i (position start+i) sees keys 0..start+i
            mask = (torch.arange(start + s)[None, :] <= torch.arange(start, start + s)[:, None])
        x = m.embed[torch.tensor(ids)]  # (S, H)
        wanted = set(layers)
        saved = {}
        step = _layer_fn() if s <= COMPILE_MAX_WIDTH else layer_step
        for i, lay in enumerate(m.layers):
            if i in wanted:
                saved[i] = x
            x = step(x, lay, self.k_cache[i], self.v_cache[i], cos, sin, start, mask,
                     m.n_head, m.n_kv, m.head_dim, m.eps, m.scaling)
        x = rms_norm(x, m.norm, m.eps)
        if m.n_layer in wanted:
            saved[m.n_layer] = x
        logits = m.head(x[s - keep:])
        self.length += s
        self.ids += ids
        if not layers:
            return logits, None
        return logits, torch.cat([saved[i] for i in layers], dim=-1)


# ----------------------------------------------------------------------------- compile

_COMPILED = None
_COMPILE_LOCK = threading.Lock()


def compile_enabled() -> bool:
    """Whether the layer step is compiled: only with ``SPECDEMO_INT8_COMPILE=1``. Measured on a
    2-core AMD EPYC (docs/cpu-backends.md, one thread, CPU clock): a one-token forward took
    28.2 ms compiled against 33.0 ms eager with ``int_mm`` (and 23.4 ms eager with ``fbgemm``),
    after 67 s of compiling on the first start and 16 s of loading compiled code on the next;
    not worth an app's start."""
    return os.environ.get(COMPILE_ENV, "").strip().lower() in ("1", "true", "yes")


def _layer_fn():
    """:func:`layer_step`, compiled with ``SPECDEMO_INT8_COMPILE=1`` (:func:`compile_layer`)."""
    return compile_layer() if compile_enabled() else layer_step


def compile_layer():
    """``torch.compile(layer_step)`` (inductor defaults), with its FX graph cache on disk under
    ``models.cache_dir()/inductor`` (unless ``TORCHINDUCTOR_CACHE_DIR`` names another folder
    than inductor's default), so that a second start loads the compiled code instead of
    compiling again. Dynamo's automatic dynamic shapes make the cache position and then the
    width symbolic after their first change: one decode and one verification graph in all
    (measured: 2 graphs for plain and speculative decoding of SmolLM2-135M)."""
    global _COMPILED
    with _COMPILE_LOCK:
        if _COMPILED is None:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir
            if os.environ.get("TORCHINDUCTOR_CACHE_DIR", default_cache_dir()) == default_cache_dir():
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")
            import torch._inductor.config as inductor_config
            inductor_config.fx_graph_cache = True
            _COMPILED = torch.compile(layer_step, dynamic=None)
        return _COMPILED


# ----------------------------------------------------------------------------- attaching

_ATTR = "_specdemo_int8"  # the Int8Model, kept on the transformers model it quantises
_ATTACH_LOCK = threading.Lock()


def unavailable_reason(loaded) -> str | None:
    """Why ``loaded`` (a ``models.LoadedModel``) cannot run on the int8 backend; None when it can."""
    if getattr(loaded, "quantization", None):
        return (f"--quantization {loaded.quantization} is a transformers path; the int8 backend "
                "quantises the float32 weights itself")
    return unsupported_reason(loaded.model)


def int8_model(loaded) -> Int8Model:
    """The :class:`Int8Model` of ``loaded``, built once per transformers model (~1 s for 135M).

    Raises:
        Int8Error: :func:`unavailable_reason`.
    """
    return attached(loaded.model, _ATTR, _ATTACH_LOCK, lambda: Int8Model(loaded.model),
                    lambda: unavailable_reason(loaded), Int8Error)
