"""The ``cuda-graphs`` target backend: a Llama's forward over a static KV cache, replayed as one
captured CUDA graph per verification width (issue 50, item 3; after gpt-fast's ``generate.py``
and its ``KVCache``, and vLLM's and SGLang's CUDA-graph decode).

On a GPU a forward of a 135M-parameter model over a few tokens is bound by kernel launches, not
by bytes: eager PyTorch spends most of a step launching ~300 small kernels. Replaying a captured
graph launches them in one call. What makes the forward capturable:

* **a static KV cache**: one preallocated (1, n_kv, capacity, head_dim) tensor per layer for
  keys and one for values, in the model's dtype, written at the fed positions with
  ``index_copy_``; rollback sets ``length`` (gpt-fast's position-indexed cache). Attention reads
  the whole capacity under a mask, so every forward of a width has the same shapes.
* **static inputs**: per width, device buffers for the ids, their positions, the cache slots
  they are written to and, for a draft tree, the mask; a forward copies its inputs into them and
  replays. No step reads a tensor's value on the host (no ``.item()``, no data-dependent branch).
* **one graph per (width, feature layers, chain or tree)**, captured the first time it is
  needed (the warm-up's forwards capture the chain widths before a race's clocks start; a draft
  tree's width is captured in its first round); forwards wider than :data:`MAX_GRAPH_WIDTH`
  (prefill chunks) run the same function eagerly.

The weights are the transformers model's own tensors (no copy; float32, bfloat16 or float16);
the rotary tables come from the model's own rotary module. Offered only where a CUDA device
holds the target (:func:`unavailable_reason`); the same function runs eagerly on the CPU, which
is how its cache, rollback, per-width dispatch and greedy identity are tested
(``tests/test_cuda_graph_backend.py``; the capture itself under the ``cuda`` marker).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import torch
import torch.nn.functional as F

from ..core.errors import ModelLoadError
from ..core.kv import StaticCacheKV, keep_tree_rows
from ..core.shape import ModelShape
from .attached import attached
from .compiled_backend import llama_reason, rotate

log = logging.getLogger(__name__)

NAME = "cuda-graphs"
MAX_GRAPH_WIDTH = 32  # forwards over more tokens (prefill chunks) run eagerly
MIN_CAPACITY = 1024  # cache positions allocated at first; doubled (graphs captured again) beyond


class CudaGraphError(ModelLoadError):
    """The cuda-graphs backend cannot serve this target (one sentence, as every backend's)."""


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why this backend cannot compute ``model``'s forward (None when it can): a Llama with SiLU
    MLPs, no biases and no sliding window (``compiled_backend.llama_reason``), on a CUDA device."""
    reason = llama_reason(model, "cuda-graphs", on_cpu=False)
    if reason is not None:
        return reason
    device = next(model.parameters()).device
    if device.type != "cuda":
        return f"the cuda-graphs backend captures CUDA graphs; this target is on {device.type}"
    return None


def unavailable_reason(loaded) -> str | None:
    """Why ``loaded`` (a ``models.LoadedModel``) cannot run on this backend; None when it can."""
    if getattr(loaded, "quantization", None):
        return (f"--quantization {loaded.quantization} is a transformers path; the cuda-graphs "
                "backend multiplies the model's own float weights")
    return unsupported_reason(loaded.model)


class StaticLlama(ModelShape):
    """The weights of one transformers Llama as the static forward reads them (the model's own
    tensors, no copies), and its rotary tables for a capacity.

    Args:
        model: a transformers ``LlamaForCausalLM`` (any device, a float dtype).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        ModelShape.__init__(self, model.config)
        self.model = model
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        base = model.model
        self.embed = base.embed_tokens.weight  # (V, H)
        self.dtype, self.device = self.embed.dtype, self.embed.device
        self.layers = [{
            "q": lay.self_attn.q_proj.weight, "k": lay.self_attn.k_proj.weight,
            "v": lay.self_attn.v_proj.weight, "o": lay.self_attn.o_proj.weight,
            "gate": lay.mlp.gate_proj.weight, "up": lay.mlp.up_proj.weight,
            "down": lay.mlp.down_proj.weight,
            "norm1": lay.input_layernorm.weight, "norm2": lay.post_attention_layernorm.weight,
        } for lay in base.layers]
        self.norm = base.norm.weight
        self.head = model.get_output_embeddings().weight  # (V, H)
        self.rotary = base.rotary_emb
        self.scaling = getattr(base.layers[0].self_attn, "scaling", self.head_dim ** -0.5)

    @torch.no_grad()
    def rope(self, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(capacity, head_dim) cos and sin tables in the model's dtype, on its device."""
        pos = torch.arange(capacity, device=self.device)[None]  # (1, capacity)
        cos, sin = self.rotary(self.embed[:1][None], pos)
        return cos[0].to(self.dtype).contiguous(), sin[0].to(self.dtype).contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm in float32 whatever x's dtype, as transformers' ``LlamaRMSNorm``:
    ``weight * (x / sqrt(mean(x^2) + eps))``, the normalised x cast back to x's dtype first."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
              scaling: float) -> torch.Tensor:
    """Grouped-query attention of S queries over the whole static cache, softmax in float32 (as
    transformers' eager attention).

    Args:
        q: (n_head, S, D); keys, values: (n_kv, capacity, D), n_head a multiple of n_kv.
        mask: (S, capacity) bool, True where a query may attend.
    Returns:
        (n_head, S, D) in q's dtype.
    """
    n_head, s, d = q.shape
    n_kv = keys.shape[0]
    g = n_head // n_kv
    scores = (q.reshape(n_kv, g * s, d) @ keys.transpose(1, 2)).float() * scaling  # (n_kv, g*S, C)
    scores = scores.view(n_kv, g, s, -1).masked_fill(~mask, float("-inf")).view(n_kv, g * s, -1)
    return (torch.softmax(scores, dim=-1).to(q.dtype) @ values).view(n_head, s, d)


def forward_static(m: StaticLlama, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
                   cos_table: torch.Tensor, sin_table: torch.Tensor, ids: torch.Tensor,
                   pos: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
                   layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The whole forward over S new tokens, with fixed shapes for a given S (capturable).

    Args:
        m: the weights.
        k_cache, v_cache: per layer (1, n_kv, capacity, D); slots are written.
        cos_table, sin_table: (capacity, D) rotary tables.
        ids: (S,) long token ids; pos: (S,) long rotary positions; slots: (S,) long cache
            positions written (a chain: ``slots == pos``; a tree: consecutive slots, positions by
            depth).
        mask: (S, capacity) bool, True where a query may attend (its own slot included).
        layers: ``hidden_states`` indices to return (0 = embeddings, k = input of layer k,
            n_layer = output after the final norm).
    Returns:
        ((S, V) logits in float32, (S, len(layers) * H) features or None).
    """
    s = ids.shape[0]
    x = m.embed.index_select(0, ids)  # (S, H)
    cos, sin = cos_table.index_select(0, pos), sin_table.index_select(0, pos)  # (S, D)
    saved = {}
    for i, lay in enumerate(m.layers):
        if i in layers:
            saved[i] = x
        h = rms_norm(x, lay["norm1"], m.eps)
        q = rotate(F.linear(h, lay["q"]).view(s, m.n_head, m.head_dim).transpose(0, 1), cos, sin)
        k = rotate(F.linear(h, lay["k"]).view(s, m.n_kv, m.head_dim).transpose(0, 1), cos, sin)
        v = F.linear(h, lay["v"]).view(s, m.n_kv, m.head_dim).transpose(0, 1)  # (n_kv, S, D)
        k_cache[i].index_copy_(2, slots, k[None])
        v_cache[i].index_copy_(2, slots, v[None])
        att = attention(q, k_cache[i][0], v_cache[i][0], mask, m.scaling)  # (n_head, S, D)
        x = x + F.linear(att.transpose(0, 1).reshape(s, m.n_head * m.head_dim), lay["o"])
        h = rms_norm(x, lay["norm2"], m.eps)
        x = x + F.linear(F.silu(F.linear(h, lay["gate"])) * F.linear(h, lay["up"]), lay["down"])
    x = rms_norm(x, m.norm, m.eps)
    if m.n_layer in layers:
        saved[m.n_layer] = x
    logits = F.linear(x, m.head).float()  # (S, V)
    return logits, (torch.cat([saved[i] for i in layers], dim=-1) if layers else None)


# ----------------------------------------------------------------------------- graphs

Replay = Callable[[], tuple[torch.Tensor, torch.Tensor | None]]


def capture_cuda(fn: Replay, warmups: int = 2) -> Replay:
    """``fn`` captured as a ``torch.cuda.CUDAGraph`` (warmed up on a side stream first, as
    PyTorch's CUDA-graph notes ask); returns a replay giving the graph's static outputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay():
        graph.replay()
        return out
    replay.graph = graph
    return replay


def run_eagerly(fn: Replay) -> Replay:
    """The stand-in of :func:`capture_cuda` off CUDA: each replay runs ``fn`` on the same static
    buffers (the CPU tests' path through the same dispatch)."""
    return fn


class _Width:
    """The static input buffers of one (width, layers, chain or tree) and its replay."""

    def __init__(self, s: int, capacity: int, device: torch.device) -> None:
        self.ids = torch.zeros(s, dtype=torch.long, device=device)
        self.pos = torch.zeros(s, dtype=torch.long, device=device)
        self.slots = torch.zeros(s, dtype=torch.long, device=device)
        self.mask = torch.zeros(s, capacity, dtype=torch.bool, device=device)
        self.replay: Replay | None = None


class CudaGraphKV(StaticCacheKV):
    """:class:`specdemo.core.kv.TargetKV` over :func:`forward_static`: a static KV
    cache of one sequence, rollback by length, one replayed graph per width up to
    :data:`MAX_GRAPH_WIDTH` (wider forwards run eagerly), draft trees included.

    Args:
        weights: the :class:`StaticLlama` of the target.
        capacity: cache positions allocated at first (doubled, graphs captured again, when a
            forward would pass them; at most the model's ``max_position_embeddings``).
        capture: ``fn -> replay``: :func:`capture_cuda` on a CUDA device, else
            :func:`run_eagerly`.
    """

    backend = NAME

    def __init__(self, weights: StaticLlama, capacity: int = MIN_CAPACITY,
                 capture: Callable[[Replay], Replay] | None = None) -> None:
        self.weights = weights
        self.model = weights.model  # what callers read: config, input embeddings
        self.device = weights.device
        self.n_layer = weights.n_layer
        self.capture = capture or (capture_cuda if self.device.type == "cuda" else run_eagerly)
        self.captures = 0  # graphs captured so far (tests count them)
        self.capture_error: str | None = None  # why capturing failed (then every forward is eager)
        self.capacity, self.first_capacity = 0, capacity
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self._grow(min(capacity, weights.max_positions or capacity))
        self.reset()

    def _grow(self, needed: int) -> None:
        """Make room for ``needed`` positions: a new cache (the old one copied in), new rotary
        tables, and no graphs (they read the old tensors)."""
        m = self.weights
        capacity = self.capacity or self.first_capacity
        while capacity < needed:
            capacity *= 2
        if m.max_positions:
            if needed > m.max_positions:
                raise ValueError(f"{needed} positions exceed the model's context of "
                                 f"{m.max_positions}")
            capacity = min(capacity, m.max_positions)
        if capacity == self.capacity:
            return
        shape = (1, m.n_kv, capacity, m.head_dim)
        new_k = [torch.zeros(shape, dtype=m.dtype, device=self.device) for _ in range(m.n_layer)]
        new_v = [torch.zeros(shape, dtype=m.dtype, device=self.device) for _ in range(m.n_layer)]
        for old, new in zip(self.k_cache + self.v_cache, new_k + new_v):
            new[:, :, :self.capacity] = old
        self.k_cache, self.v_cache, self.capacity = new_k, new_v, capacity
        self.cos, self.sin = m.rope(capacity)
        self.key_slots = torch.arange(capacity, device=self.device)  # (C,)
        self.widths: dict[tuple[int, tuple[int, ...], bool], _Width] = {}

    @property
    def cache_bytes(self) -> int:
        """Bytes of the keys and values of the cached tokens (``capacity`` are allocated)."""
        return self.weights.kv_bytes(self.length, self.k_cache[0].element_size())

    def _width(self, s: int, layers: tuple[int, ...], tree: bool) -> _Width:
        key = (s, layers, tree)
        width = self.widths.get(key)
        if width is None:
            width = self.widths[key] = _Width(s, self.capacity, self.device)
        return width

    def _forward(self, width: _Width, layers: tuple[int, ...]):
        return forward_static(self.weights, self.k_cache, self.v_cache, self.cos, self.sin,
                              width.ids, width.pos, width.slots, width.mask, layers)

    @torch.inference_mode()
    def _replay(self, s: int, layers: tuple[int, ...], fill: Callable[[_Width], None],
                tree: bool):
        """Fill the static buffers of width ``s`` and run its graph (captured the first time;
        eagerly past :data:`MAX_GRAPH_WIDTH`): ((S, V) logits, features or None), copies."""
        width = self._width(s, layers, tree) if s <= MAX_GRAPH_WIDTH else \
            _Width(s, self.capacity, self.device)
        fill(width)
        if s > MAX_GRAPH_WIDTH:
            return self._forward(width, layers)
        if width.replay is None and self.capture_error is None:
            try:
                width.replay = self.capture(lambda: self._forward(width, layers))
                self.captures += 1
            except RuntimeError as exc:  # a capture CUDA refuses: this cache runs eagerly
                log.warning("cuda-graphs: capturing a %d-token forward failed (%s); this cache "
                            "runs its forwards eagerly", s, exc)
                self.capture_error = f"{type(exc).__name__}: {exc}"[:300]
        if width.replay is None:
            width.replay = run_eagerly(lambda: self._forward(width, layers))
        logits, feats = width.replay()
        return logits.clone(), (feats.clone() if feats is not None else None)

    def _run(self, ids: list[int], keep: int, layers: tuple[int, ...]):
        s, start = len(ids), self.length
        self._grow(start + s)

        def fill(width: _Width) -> None:
            width.ids.copy_(torch.tensor(ids, dtype=torch.long), non_blocking=True)
            torch.arange(start, start + s, out=width.pos)
            width.slots.copy_(width.pos)
            torch.le(self.key_slots[None, :], width.pos[:, None], out=width.mask)  # causal
        logits, feats = self._replay(s, layers, fill, tree=False)
        self.length += s
        self.ids += ids
        return logits[s - keep:], feats

    def forward_tree(self, ids: list[int], depth: list[int], anc: list[int],
                     layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward over a draft tree's rows (``core.kv.KVModel.forward_tree``'s contract):
        row i is written at slot ``length + i`` with rotary position ``length + depth[i]`` and
        attends to the cached tokens and its ancestors among the rows (``anc``'s bitmask).

        Returns:
            ((S, V) logits of every row, (S, F) features or None); the cache holds all S rows
            until :meth:`keep_rows`.
        """
        s, start = len(ids), self.length
        if not (s == len(depth) == len(anc)) or s == 0:
            raise ValueError("forward_tree: ids, depth and anc must have the same length >= 1")
        self._grow(start + s)
        layers = tuple(int(i) for i in layers)
        mask = torch.zeros(s, self.capacity, dtype=torch.bool)
        mask[:, :start] = True
        mask[:, start:start + s] = torch.tensor([[(a >> j) & 1 for j in range(s)] for a in anc],
                                                dtype=torch.bool)

        def fill(width: _Width) -> None:
            width.ids.copy_(torch.tensor(ids, dtype=torch.long), non_blocking=True)
            width.pos.copy_(torch.tensor([start + d for d in depth], dtype=torch.long))
            torch.arange(start, start + s, out=width.slots)
            width.mask.copy_(mask)
        logits, feats = self._replay(s, layers, fill, tree=True)
        self.length += s
        self.ids += list(ids)
        return logits, feats

    @torch.inference_mode()
    def keep_rows(self, start: int, rows: list[int]) -> None:
        """After :meth:`forward_tree` at ``start``: keep its rows ``rows`` (increasing), moved to
        slots start, start + 1, ...; drop the rest."""
        keep_tree_rows(self, self.k_cache + self.v_cache, start, rows)


# ----------------------------------------------------------------------------- attaching

_ATTR = "_specdemo_static_llama"  # the StaticLlama, kept on the transformers model it reads
_LOCK = threading.Lock()


def static_model(loaded) -> StaticLlama:
    """The :class:`StaticLlama` of ``loaded``, built once per transformers model.

    Raises:
        CudaGraphError: :func:`unavailable_reason`.
    """
    return attached(loaded.model, _ATTR, _LOCK, lambda: StaticLlama(loaded.model),
                    lambda: unavailable_reason(loaded), CudaGraphError)
