"""An EAGLE-3 head's draft step in C (:class:`NativeEagleHead`), given to the drafter on the
native backends (:func:`head_stepper`)."""

from __future__ import annotations

import logging

import torch

from ...core.shape import ModelShape
from .attach import _ATTACH_LOCK
from .build import KERNELS, NativeError, default_kernel
from .model import MIN_CAPACITY, CModel, _grow_cache, _tree_mode, unfit_widths
from .weights import _WEIGHTS, _packer, _set_scales

log = logging.getLogger(__name__)


HEAD_NORM_BEFORE_RESIDUAL, HEAD_NORM_OUTPUT = 1, 2  # native_forward.c's NF_HEAD_* flags

_HEAD_ATTR = "_specdemo_native_head"  # {(embedding pointer, kernel): NativeEagleWeights}


def head_unsupported_reason(head) -> str | None:
    """Why the C head step cannot compute ``head``'s (an ``Eagle3Head``) layer (None when it
    can): biases, an activation other than SiLU, widths that are not multiples of 32, a head
    off the CPU. ``fc`` and its optional norms are not its part (``Eagle3Head.project`` runs
    in torch once per round)."""
    cfg = head.config
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "the native EAGLE-3 head step computes heads without biases; this one has biases"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"the native EAGLE-3 head step computes SiLU MLPs; this head uses {cfg.hidden_act}"
    widths = unfit_widths(ModelShape(cfg))
    if widths:
        return f"the native EAGLE-3 head step needs widths that are multiples of 32; this head has {widths}"
    if head.fc.weight.device.type != "cpu":
        return f"the native EAGLE-3 head step runs on the CPU; this head is on {head.fc.weight.device.type}"
    return None


class NativeEagleWeights(CModel):
    """An ``Eagle3Head``'s decoder layer, final norm and ``lm_head`` in BF16 (or int8) and the C
    head model over them (``nf_head_create``), built once per head, embedding table, kernel and
    weight format (:meth:`of`) and shared by the drafters' caches (one step at a time).

    Args:
        head: the EAGLE-3 head (float32 or bfloat16 weights on the CPU).
        embed: (V, H) the embedding table its ids index (the target's, or the head's own);
            read as float32 (no copy when it is float32 and contiguous).
        threads, kernel: as :class:`NativeModel`.
        weights: as :class:`NativeModel` (``bf16``, ``int8``, ``w8a8``): the matrices of the
            layer and ``lm_head`` (the step reads them all every draft token, so int8 halves
            what a step waits for where it is memory-bound).
    Raises:
        NativeError: :func:`head_unsupported_reason`, the library could not be built, or the C
            model could not be created.
    """

    def __init__(self, head, embed: torch.Tensor, threads: int | None = None,
                 kernel: str | None = None, weights: str = "bf16") -> None:
        super().__init__(head_unsupported_reason(head), head.config, weights, kernel, threads,
                         head.rotary_emb)  # the widths of the head's one layer
        layer = head.layers[0]
        self.scaling = self.head_dim ** -0.5  # F.scaled_dot_product_attention's default
        self.draft_vocab = head.draft_vocab_size
        a, m = layer.self_attn, layer.mlp
        pack = _packer(weights, self.lib, self.scales)  # int8 scales: qkv, o, gate_up, down, lm_head

        def f32(t):
            return t.detach().float().contiguous()

        with torch.no_grad():
            self.embed = f32(embed)
            if self.embed.shape[1] != self.hidden:
                raise NativeError(f"the embedding table is {self.embed.shape[1]} wide; the EAGLE-3 "
                                  f"head reads {self.hidden}")
            self.tensors = {
                "qkv": pack(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                "o": pack(a.o_proj.weight),
                "gate_up": pack(m.gate_proj.weight, m.up_proj.weight),
                "down": pack(m.down_proj.weight),
                "input_ln": f32(layer.input_layernorm.weight),
                "hidden_norm": f32(layer.hidden_norm.weight),
                "post_ln": f32(layer.post_attention_layernorm.weight),
                "norm": f32(head.norm.weight),
                "lm_head": pack(head.lm_head.weight),
            }
        flags = ((HEAD_NORM_BEFORE_RESIDUAL if layer.norm_before_residual else 0)
                 | (HEAD_NORM_OUTPUT if head.norm_output else 0))
        handle = self.lib.nf_head_create(self.hidden, self.n_head, self.n_kv, self.head_dim,
                                         self.inter, self.draft_vocab, self.embed.shape[0],
                                         self.eps, self.scaling, self.threads,
                                         KERNELS[self.kernel], flags)
        if not handle:
            raise NativeError("the native backend could not create the EAGLE-3 head's model "
                              "(widths or memory)")
        self.handle = handle
        t = self.tensors
        self.lib.nf_head_set(handle, *(t[k].data_ptr() for k in (
            "qkv", "o", "gate_up", "down", "input_ln", "hidden_norm", "post_ln", "norm",
            "lm_head")), self.embed.data_ptr())
        _set_scales(self.lib, handle, weights, self.scales, 1)

    @classmethod
    def of(cls, head, embed: torch.Tensor, kernel: str | None = None,
           weights: str = "bf16") -> "NativeEagleWeights":
        """The weights of ``head`` over ``embed``, built on first use and kept on the head."""
        kernel = kernel or default_kernel()
        with _ATTACH_LOCK:
            built = head.__dict__.setdefault(_HEAD_ATTR, {})
            key = (embed.data_ptr(), tuple(embed.shape), kernel, weights)
            if key not in built:
                built[key] = cls(head, embed, kernel=kernel, weights=weights)
            return built[key]


class NativeEagleHead:
    """``Eagle3Head.step`` in C with a static float32 KV cache of one sequence (rollback by
    length): the object ``Eagle3Drafter`` takes as its ``stepper``.

    Args:
        head: the EAGLE-3 head (its embeddings attached, or its own).
        embed: (V, H) the embedding table (default: the head's own or the attached one).
        kernel: ``fma`` or ``dpbf16`` (default :func:`default_kernel`).
        capacity: cache positions allocated at first (doubled when a step passes them).
        weights: ``bf16``, ``int8`` or ``w8a8`` (:class:`NativeEagleWeights`).
    Raises:
        NativeError: as :class:`NativeEagleWeights`.
    """

    def __init__(self, head, embed: torch.Tensor | None = None, kernel: str | None = None,
                 capacity: int = MIN_CAPACITY, weights: str = "bf16") -> None:
        if embed is None:
            table = head.embedding_table()
            if table is None:
                raise NativeError("the EAGLE-3 head needs the target's embeddings: call attach()")
            embed = table.weight
        self.weights = NativeEagleWeights.of(head, embed, kernel, weights)
        self.capacity = 0
        self.k_cache = self.v_cache = None
        self.length = 0
        self._grow(capacity)

    def _grow(self, needed: int) -> None:
        _grow_cache(self, needed, 1, self.weights)

    def step(self, hidden: torch.Tensor, ids: list[int], start: int,
             keep: int = 1, tree: tuple[list[int], list[int], int] | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head pass over T positions start..start+T-1 (``Eagle3Head.step`` without the
        batch dimension); the cache keeps positions 0..start+T-1 afterwards.

        Args:
            hidden: (T, H) inputs (``project(features)``, or the previous step's output).
            ids: the T target ids of the tokens after those positions.
            start: the first position, at most the cached length (later positions are dropped).
            keep: logits for the last ``keep`` positions (1..T).
            tree: None, or draft-tree nodes (``nf_set_tree``): (per position its rotary
                position, per position a bitmask of the rows from ``first`` on it attends to,
                ``first``); the positions stay in cache rows start..start+T-1.
        Returns:
            (output (T, H) float32, the one the next draft step reads; logits (keep, Vd)
            float32).
        Raises:
            ValueError: shapes or ``keep`` out of range, ``start`` beyond the cache, or an id
                outside the embedding table.
        """
        w = self.weights
        n = len(ids)
        if hidden.dim() != 2 or hidden.shape != (n, w.hidden) or n == 0:
            raise ValueError(f"hidden must be (T, {w.hidden}) for T = len(ids) = {n} >= 1; got "
                             f"{tuple(hidden.shape)}")
        if not 1 <= keep <= n:
            raise ValueError(f"keep must be in 1..{n}, got {keep}")
        if not 0 <= start <= self.length:
            raise ValueError(f"start {start} is beyond the cached length {self.length}")
        self._grow(start + n)
        x = hidden.detach().float().contiguous()
        tokens = torch.tensor(ids, dtype=torch.int32)
        out = torch.empty(n, w.hidden)
        logits = torch.empty(keep, w.draft_vocab)
        with w.lock:
            cos, sin = w.rope(self.capacity)
            w.lib.nf_set_cache(w.handle, self.k_cache.data_ptr(), self.v_cache.data_ptr(),
                               cos.data_ptr(), sin.data_ptr(), self.capacity)
            with _tree_mode(w.lib, w.handle, tree):
                status = w.lib.nf_head_forward(w.handle, x.data_ptr(), tokens.data_ptr(), n,
                                               start, keep, logits.data_ptr(), out.data_ptr())
        if status == -2:
            raise ValueError(f"a token id outside 0..{w.embed.shape[0] - 1}: {ids}")
        if status != 0:
            raise MemoryError("the native head step could not allocate its buffers")
        self.length = start + n
        return out, logits

    def rollback(self, length: int) -> None:
        """Drop cached positions beyond ``length`` (nothing to drop: no-op)."""
        self.length = min(self.length, max(0, length))

    @property
    def cache_bytes(self) -> int:
        """Bytes of the float32 keys and values of the cached positions."""
        return 2 * 4 * self.weights.n_kv * self.weights.head_dim * self.length


def head_stepper(drafter, loaded) -> None:
    """Give ``drafter`` (an ``Eagle3Drafter``, or a drafter stacked over one, e.g.
    ``CombinedDrafter``) the C head step when ``loaded`` (a ``models.LoadedModel``) runs on a
    native backend, in that backend's weight format (BF16, int8, or int8 with int8 activations:
    the drafts of a head change with it, the output does not); anything else is left as it is
    (the torch head is the reference). A head the C step cannot compute keeps the torch step
    (logged once, not an error)."""
    backend = getattr(loaded, "backend", "transformers")
    if backend not in _WEIGHTS or drafter is None:
        return
    for d in (drafter, getattr(drafter, "learned", None)):
        if d is None or not hasattr(d, "use_stepper") or getattr(d, "stepper", None) is not None:
            continue
        try:
            d.use_stepper(NativeEagleHead(d.head, weights=_WEIGHTS[backend]))
        except NativeError as exc:
            log.info("the EAGLE-3 head keeps its torch step: %s", exc)
