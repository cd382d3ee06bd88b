"""The C forward over a loaded target: :class:`NativeModel` (its packed weights, one per
weight format), :class:`NativeKV` (the ``core.kv.TargetKV`` the engine runs) and
:class:`NativeBatch` (continuous batching of several sequences, for generating answers)."""

from __future__ import annotations

import contextlib
import logging
import threading

import torch

from ...core.kv import RotaryTables, StaticCacheKV, keep_tree_rows
from ...core.machine import default_threads
from ...core.shape import ModelShape
from ..compiled_backend import llama_reason
from .build import KERNELS, NativeError, default_kernel, library
from .weights import NAME, _WEIGHTS, _check_weights, _packer, _set_scales

log = logging.getLogger(__name__)


ARCHITECTURES = ("llama",)  # transformers model_type values whose forward the C file computes

MIN_CAPACITY = 512  # cache positions allocated at first; doubled when a forward passes them


def unfit_widths(shape: ModelShape) -> tuple[int, ...] | None:
    """(hidden, MLP width, heads x head width) when the C kernels cannot take them (a width not
    a multiple of 32, or a head width over 1024 or odd); None when they can."""
    widths = (shape.hidden, shape.inter, shape.n_head * shape.head_dim)
    if any(w % 32 for w in widths) or shape.head_dim > 1024 or shape.head_dim % 2:
        return widths
    return None


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the native backend cannot compute ``model``'s forward (None when it can): a Llama
    (``model_type`` in :data:`ARCHITECTURES`) with SiLU MLPs, no biases, no sliding window,
    widths the C kernels take (multiples of 32), on the CPU in float32 or bfloat16
    (``compiled_backend.llama_reason`` and the widths)."""
    reason = llama_reason(model, "native", ARCHITECTURES)
    if reason is not None:
        return reason
    widths = unfit_widths(ModelShape(model.config))
    if widths:
        return f"the native backend needs widths that are multiples of 32; this target has {widths}"
    p = next(model.parameters())
    if p.dtype not in (torch.float32, torch.bfloat16):
        return f"the native backend reads float32 or bfloat16 weights; this target is {p.dtype}"
    return None


class CModel(RotaryTables, ModelShape):
    """What a C model over packed weights holds, a target's (:class:`NativeModel`) or an EAGLE-3
    head's (``eagle.NativeEagleWeights``): the weight format, the library, the kernel, the
    widths (``core.shape.ModelShape`` of ``config``), the threads, the rotary tables, a lock
    (one forward at a time), the int8 row scales; the subclass creates ``handle``, freed here.

    Raises:
        NativeError: ``reason`` (a refusal, None for none), or the library could not be built.
        ValueError: ``weights`` is not a weight format.
    """

    def __init__(self, reason: str | None, config, weights: str, kernel: str | None,
                 threads: int | None, rotary: torch.nn.Module) -> None:
        if reason:
            raise NativeError(reason)
        self.weights = _check_weights(weights)
        self.lib = library()
        self.kernel = kernel or default_kernel()
        ModelShape.__init__(self, config)
        self.threads = threads or default_threads()
        self.rotary = rotary
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.lock = threading.Lock()
        self.scales: list[torch.Tensor] = []  # int8: the row scales of the packed matrices, in order

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle:
            self.lib.nf_free(handle)
            self.handle = None


class NativeModel(CModel):
    """The BF16 weights of one transformers Llama and the C model over them, built once and
    shared by its caches (one forward at a time: the C model owns one set of scratch buffers).

    Args:
        model: a transformers ``LlamaForCausalLM`` on the CPU (float32 or bfloat16).
        threads: threads of the C forward (default: the cores this process may use, at most 8).
        kernel: ``fma`` or ``dpbf16`` (default :func:`default_kernel`); int8 weights always
            use the ``fma`` arithmetic (float32 activations).
        weights: ``bf16``, ``int8`` (per-row scales, :func:`_int8`) or ``w8a8`` (the same int8
            weights times int8 activations, one scale per 32 values: ``nf_quantize_activations``).
    Raises:
        NativeError: :func:`unsupported_reason`, the library could not be built, or the C
            model could not be created.
    """

    def __init__(self, model: torch.nn.Module, threads: int | None = None,
                 kernel: str | None = None, weights: str = "bf16") -> None:
        super().__init__(unsupported_reason(model), model.config, weights, kernel, threads,
                         model.model.rotary_emb)
        self.model = model
        base = model.model
        pack = _packer(weights, self.lib, self.scales)  # int8 scales: (qkv, o, gate_up, down) a layer, then the head's
        self.scaling = float(getattr(base.layers[0].self_attn, "scaling", self.head_dim ** -0.5))
        with torch.no_grad():
            self.embed = base.embed_tokens.weight.detach().float().contiguous()  # (V, H)
            self.vocab = self.embed.shape[0]
            self.layers = []
            for layer in base.layers:
                a, m = layer.self_attn, layer.mlp
                self.layers.append({
                    "qkv": pack(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                    "o": pack(a.o_proj.weight),
                    "gate_up": pack(m.gate_proj.weight, m.up_proj.weight),
                    "down": pack(m.down_proj.weight),
                    "norm1": layer.input_layernorm.weight.detach().float().contiguous(),
                    "norm2": layer.post_attention_layernorm.weight.detach().float().contiguous(),
                })
            self.norm = base.norm.weight.detach().float().contiguous()
            self.head = pack(model.get_output_embeddings().weight)
        handle = self.lib.nf_create(self.n_layer, self.hidden, self.n_head, self.n_kv,
                                    self.head_dim, self.inter, self.vocab, self.eps, self.scaling,
                                    self.threads, KERNELS[self.kernel])
        if not handle:
            raise NativeError("the native backend could not create its model (widths or memory)")
        self.handle = handle
        for i, lay in enumerate(self.layers):
            self.lib.nf_set_layer(handle, i, *(lay[k].data_ptr() for k in
                                               ("qkv", "o", "gate_up", "down", "norm1", "norm2")))
        self.lib.nf_set_output(handle, self.embed.data_ptr(), self.norm.data_ptr(),
                               self.head.data_ptr())
        _set_scales(self.lib, handle, weights, self.scales, self.n_layer)
        self._cache_owner = None  # the NativeKV whose cache the C model points at
        self.prefetch: dict | None = None  # native-w8a8: choose_prefetch's choice

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one forward reads: the BF16 or int8 matrices (with their row scales)
        and the norms (the embedding rows read are not counted, as in
        ``costs.weight_bytes_per_forward``)."""
        total = self.head.numel() * self.head.element_size() + self.norm.numel() * 4
        for lay in self.layers:
            total += sum(lay[k].numel() * lay[k].element_size() for k in ("qkv", "o", "gate_up", "down"))
            total += (lay["norm1"].numel() + lay["norm2"].numel()) * 4
        return total + sum(t.numel() * 4 for t in self.scales)


def _grow_cache(owner, needed: int, layers: int, weights) -> None:
    """Give ``owner`` (a :class:`NativeKV` or :class:`NativeEagleHead`: ``capacity``,
    ``k_cache``, ``v_cache``) room for ``needed`` positions: float32 (layers, n_kv, capacity,
    head_dim) keys and values, the capacity doubled from :data:`MIN_CAPACITY` until it fits, the
    cached positions copied; ``weights`` (its ``n_kv``, ``head_dim`` and rotary tables) computes
    the tables for the new capacity."""
    capacity = max(owner.capacity, MIN_CAPACITY)
    while capacity < needed:
        capacity *= 2
    if capacity == owner.capacity:
        return
    shape = (layers, weights.n_kv, capacity, weights.head_dim)
    new_k, new_v = torch.zeros(shape), torch.zeros(shape)
    if owner.k_cache is not None:
        new_k[:, :, :owner.capacity] = owner.k_cache
        new_v[:, :, :owner.capacity] = owner.v_cache
    owner.k_cache, owner.v_cache, owner.capacity = new_k, new_v, capacity
    weights.rope(capacity)


class NativeKV(StaticCacheKV):
    """:class:`specdemo.core.kv.KVModel`'s interface over a :class:`NativeModel`: a static
    float32 KV cache of one sequence, rollback by length.

    Args:
        nmodel: the BF16 weights and C model.
        capacity: cache positions allocated at first (grows by doubling).
    """

    backend = NAME

    def __init__(self, nmodel: NativeModel, capacity: int = MIN_CAPACITY) -> None:
        self.nmodel = nmodel
        self.backend = next(name for name, w in _WEIGHTS.items() if w == nmodel.weights)
        self.n_layer = nmodel.n_layer
        self.model = nmodel.model  # what callers read: config, input embeddings
        self.device = torch.device("cpu")
        self.capacity = 0
        self.k_cache = self.v_cache = None
        self._grow(capacity)
        self.reset()

    def _grow(self, needed: int) -> None:
        m = self.nmodel
        _grow_cache(self, needed, m.n_layer, m)

    @property
    def cache_bytes(self) -> int:
        """Bytes of the float32 keys and values of the cached tokens (``capacity`` of them are
        allocated)."""
        return self.nmodel.kv_bytes(self.length, 4)

    # ------------------------------------------------------------------ internals

    def _run(self, ids: list[int], keep: int, layers: tuple[int, ...],
             tree: tuple[list[int], list[int], int] | None = None):
        """One C forward after the cached tokens; ``tree`` as :func:`_tree_mode`."""
        m = self.nmodel
        s, start = len(ids), self.length
        self._grow(start + s)
        tokens = torch.tensor(ids, dtype=torch.int32)
        want = torch.tensor(layers, dtype=torch.int32)
        logits = torch.empty(keep, m.vocab)
        feats = torch.empty(s, len(layers) * m.hidden) if layers else None
        with m.lock:
            cos, sin = m.rope(self.capacity)
            m.lib.nf_set_cache(m.handle, self.k_cache.data_ptr(), self.v_cache.data_ptr(),
                               cos.data_ptr(), sin.data_ptr(), self.capacity)
            with _tree_mode(m.lib, m.handle, tree):
                status = m.lib.nf_forward(m.handle, tokens.data_ptr(), s, start, keep,
                                          logits.data_ptr(), want.data_ptr() if layers else None,
                                          len(layers), feats.data_ptr() if layers else None)
        if status == -2:
            raise ValueError(f"a token id outside 0..{m.vocab - 1}: {ids}")
        if status != 0:
            raise MemoryError("the native forward could not allocate its buffers")
        self.length += s
        self.ids += ids
        return logits, feats

    def forward_tree(self, ids: list[int], depth: list[int], anc: list[int],
                     layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``core.kv.KVModel.forward_tree`` in C (tree attention: ``nf_set_tree``)."""
        s, start = len(ids), self.length
        if not (s == len(depth) == len(anc)) or not 1 <= s <= 64:
            raise ValueError("forward_tree: ids, depth and anc must have the same length 1..64")
        return self._run(list(ids), s, tuple(layers), ([start + d for d in depth], anc, start))

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """``core.kv.KVModel.keep_rows``: the kept rows' keys and values moved into place."""
        keep_tree_rows(self, [self.k_cache, self.v_cache], start, rows)


@contextlib.contextmanager
def _tree_mode(lib, handle, tree: tuple[list[int], list[int], int] | None):
    """Within the block the C model computes draft-tree rows (``nf_set_tree``): ``tree`` is
    (per row its rotary position, per row the bitmask of the cache rows from ``first`` on it
    attends to, ``first``); None: the ordinary causal forward. Call with the model's lock."""
    if tree is None:
        yield
        return
    pos = torch.tensor(tree[0], dtype=torch.int32)
    anc = torch.tensor([a - (1 << 64) if a >= 1 << 63 else a for a in tree[1]],
                       dtype=torch.int64)  # uint64 bit patterns in an int64 tensor
    lib.nf_set_tree(handle, pos.data_ptr(), anc.data_ptr(), tree[2])
    try:
        yield
    finally:
        lib.nf_set_tree(handle, None, None, 0)


class NativeBatch:
    """Several sequences decoded together over one :class:`NativeModel` (continuous batching,
    for generating training data): sequence slot ``i`` owns cache rows ``i * positions ..
    (i + 1) * positions - 1``, and one forward (``nf_forward_rows``) runs any mix of the slots'
    new tokens, reading each matrix once for all of them. A token's logits are exactly those a
    :class:`NativeKV` of its sequence alone gives it (the kernels' numbers do not depend on the
    other tokens of a forward).

    Args:
        nmodel: the weights and C model (shared with its other caches: one forward at a time).
        slots: sequences at once.
        positions: cache positions per sequence (prompt + answer).
    Raises:
        ValueError: ``slots`` or ``positions`` below 1.
    """

    def __init__(self, nmodel: NativeModel, slots: int, positions: int) -> None:
        if slots < 1 or positions < 1:
            raise ValueError(f"slots and positions must be at least 1; got {slots}, {positions}")
        self.nmodel, self.slots, self.positions = nmodel, slots, positions
        self.capacity = slots * positions
        shape = (nmodel.n_layer, nmodel.n_kv, self.capacity, nmodel.head_dim)
        self.k_cache, self.v_cache = torch.zeros(shape), torch.zeros(shape)
        self.lengths = [0] * slots
        self._logits = torch.empty(slots, nmodel.vocab)  # reused: no fresh pages every step

    @property
    def cache_bytes(self) -> int:
        """Bytes of the float32 keys and values allocated (all slots)."""
        return 2 * self.k_cache.numel() * 4

    def reset(self, slot: int) -> None:
        """Forget slot ``slot``'s sequence (its rows are written again from position 0)."""
        self.lengths[slot] = 0

    def forward(self, entries: list[tuple[int, list[int]]]) -> torch.Tensor:
        """Append each entry's ids to its slot's sequence, all in one forward.

        Args:
            entries: (slot, ids) pairs, each slot at most once, ids non-empty.
        Returns:
            (len(entries), vocab) float32: the logits after each entry's last id (a view of a
            buffer the next call overwrites).
        Raises:
            ValueError: a slot out of range or given twice, empty ids, a sequence longer than
                ``positions``, or an id outside the vocabulary.
            MemoryError: the C forward could not allocate its buffers.
        """
        m = self.nmodel
        ids, base, pos, keep = [], [], [], []
        seen = set()
        for slot, toks in entries:
            if not 0 <= slot < self.slots or slot in seen or not toks:
                raise ValueError(f"entry for slot {slot}: slots are 0..{self.slots - 1}, once each, "
                                 "with at least one id")
            seen.add(slot)
            start = self.lengths[slot]
            if start + len(toks) > self.positions:
                raise ValueError(f"slot {slot} would hold {start + len(toks)} positions; it has "
                                 f"{self.positions}")
            ids += toks
            base += [slot * self.positions] * len(toks)
            pos += range(start, start + len(toks))
            keep.append(len(ids) - 1)
        as_int = [torch.tensor(v, dtype=torch.int32) for v in (ids, base, pos, keep)]
        logits = self._logits[:len(keep)]
        with m.lock:
            cos, sin = m.rope(self.positions)
            m.lib.nf_set_cache(m.handle, self.k_cache.data_ptr(), self.v_cache.data_ptr(),
                               cos.data_ptr(), sin.data_ptr(), self.capacity)
            status = m.lib.nf_forward_rows(m.handle, as_int[0].data_ptr(), len(ids), as_int[1].data_ptr(),
                                           as_int[2].data_ptr(), as_int[3].data_ptr(), len(keep),
                                           logits.data_ptr())
        if status == -2:
            raise ValueError(f"a token id outside 0..{m.vocab - 1}")
        if status != 0:
            raise MemoryError("the native forward could not allocate its buffers")
        for slot, toks in entries:
            self.lengths[slot] += len(toks)
        return logits
