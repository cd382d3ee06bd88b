"""A causal LM with its own KV cache: incremental forwards and rollback in one place.

Rollback after a rejection is ``DynamicCache.crop`` (transformers); gpt-fast's position-indexed
cache is the same idea. Both the target and model drafters use this class.

Sliding-window layers (Gemma 2/3, Mistral) keep only the last ``window - 1`` tokens, so once the
sequence passes the window they cannot give back a rejected token's predecessors. transformers'
``activate_past_recording`` makes them keep everything fed since the last ``crop``, and ``crop``
then trims them back to the window: every rollback crops (``crop(0)`` when nothing is removed),
so a rollback of the latest round's tokens is always exact. A rollback further back than a
layer still holds (a draft cache meeting a new context) feeds the kept tokens again instead.

Long inputs (a prompt's prefill, a draft model catching up with it) are fed in chunks of
:data:`PREFILL_CHUNK` tokens, and within :func:`stop_on` a set cancel event stops them between
two chunks (:class:`Cancelled`): Stop waits for one chunk, not for a whole prefill. Each chunk
attends to the cache of the ones before, so the result is the same model output (chunked
prefill, as in vLLM and llama.cpp's ``n_batch``).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Iterator, Protocol, runtime_checkable

import torch
from transformers import DynamicCache

PREFILL_CHUNK = 256  # tokens per forward of a long input: ~0.3-1 s on a 2-core CPU for 135-270M


class Cancelled(Exception):
    """A long forward stopped between two chunks because its cancel event was set."""


_STOP = threading.local()


@contextlib.contextmanager
def stop_on(cancel: threading.Event | None) -> Iterator[None]:
    """Inside this block, a long forward of any :class:`KVModel` on this thread raises
    :class:`Cancelled` between chunks once ``cancel`` is set (the cache keeps the chunks fed).

    A scope rather than an argument, so that it also reaches the caches inside drafters (a draft
    model's first proposal feeds it the whole prompt) without widening the drafter protocol.
    ``cancel`` None keeps the enclosing block's event (a warm-up decode, which is given none,
    inside a race's ``stop_on(race.cancel)`` still stops).
    """
    previous = getattr(_STOP, "cancel", None)
    _STOP.cancel = cancel if cancel is not None else previous
    try:
        yield
    finally:
        _STOP.cancel = previous


@contextlib.contextmanager
def prefill_progress(report) -> Iterator[None]:
    """Inside this block, a long input fed in more than one chunk on this thread calls
    ``report(fed, total)`` (tokens) before its first chunk and after each one, so a page can
    show how far a long prefill is and what is left of it."""
    previous = getattr(_STOP, "progress", None)
    _STOP.progress = report
    try:
        yield
    finally:
        _STOP.progress = previous


def _check_stop() -> None:
    if stop_requested():
        raise Cancelled()


def stop_requested() -> bool:
    """Whether the event of the enclosing :func:`stop_on` block on this thread is set."""
    cancel = getattr(_STOP, "cancel", None)
    return cancel is not None and cancel.is_set()


def _report(fed: int, total: int) -> None:
    report = getattr(_STOP, "progress", None)
    if report is not None:
        report(fed, total)


def _chunks(n: int, keep: int, size: int) -> list[tuple[int, int]]:
    """(start, end) pieces of ``n`` tokens, ``size`` long, the last holding at least ``keep``."""
    cuts = [c for c in range(size, n, size) if c <= n - keep]
    bounds = [0, *cuts, n]
    return list(zip(bounds[:-1], bounds[1:]))


def cache_bytes(cache: DynamicCache) -> int:
    """Bytes held by the key/value tensors of a transformers cache."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers >= 5.x names the cache argument ``cache``; earlier releases ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _sliding_layers(cache: DynamicCache) -> list:
    """The cache's sliding-window layers (transformers' ``is_sliding`` with a ``sliding_window``)."""
    return [layer for layer in getattr(cache, "layers", [])
            if getattr(layer, "is_sliding", False) and hasattr(layer, "sliding_window")]


def _can_drop(layer, drop: int) -> bool:
    """Whether a sliding ``layer`` still holds what it must keep after removing ``drop`` tokens:
    the last ``window - 1`` of the remaining ones (fewer when fewer remain)."""
    if not getattr(layer, "is_initialized", False):
        return True
    remaining = layer.cumulative_length - drop
    return layer.keys.shape[-2] >= min(layer.sliding_window - 1, remaining) + drop


def feed_in_chunks(run, ids, keep: int, layers: tuple[int, ...], size: int | None = None):
    """Feed ``ids`` through ``run(ids_chunk, keep, layers) -> (logits, features or None)`` in
    chunks of at most ``size`` tokens (default :data:`PREFILL_CHUNK`, read at each call;
    :func:`_chunks`), checking for Stop between chunks.

    Returns:
        (the last chunk's (keep, V) logits, (S, F) features of every fed position joined, or
        None when no ``layers`` were asked for).
    Raises:
        Cancelled: inside :func:`stop_on`, when its event is set between two chunks.
    """
    pieces = _chunks(len(ids), keep, PREFILL_CHUNK if size is None else size)
    features = []
    for n, (start, end) in enumerate(pieces):
        if n:
            _check_stop()
        if len(pieces) > 1:
            _report(start, len(ids))
        last = n == len(pieces) - 1
        logits, feats = run(ids[start:end], keep if last else 1, layers)
        features.append(feats)
    if len(pieces) > 1:
        _report(len(ids), len(ids))
    return logits, (torch.cat(features) if layers else None)


def warm_prefix(n: int, size: int | None = None) -> int:
    """How many of a prompt's ``n`` tokens a warm-up must feed to meet every chunk width the
    prefill of all ``n`` will use (:func:`_chunks` with ``keep`` 1: one full chunk, then the
    last piece's width): ``n`` itself when it fits in one chunk. A warm-up of a long prompt
    then costs at most two chunks instead of a whole prefill."""
    size = PREFILL_CHUNK if size is None else size
    pieces = _chunks(n, 1, size)
    if len(pieces) <= 2:
        return n
    return size + (pieces[-1][1] - pieces[-1][0])


def unknown_hidden_states(layers: tuple[int, ...], n_layer: int) -> str | None:
    """Why ``layers`` are not ``hidden_states`` indices of an ``n_layer``-layer target (valid:
    0..n_layer), or None when they all are."""
    bad = [i for i in layers if not 0 <= i <= n_layer]
    if not bad:
        return None
    return (f"hidden state(s) {bad} do not exist: the target has {n_layer} layers "
            f"(hidden states 0..{n_layer})")


def keep_tree_rows(kv, caches: list[torch.Tensor], start: int, rows: list[int]) -> None:
    """``kv.keep_rows`` for a cache whose tensors hold positions along dim 2: rows
    ``start + rows[i]`` move to ``start + i`` in every tensor of ``caches`` and in ``kv.ids``,
    then ``kv.rollback`` drops the rest (a draft tree's accepted branch)."""
    n = len(rows)
    moved = [start + r for r in rows]
    if moved != list(range(start, start + n)):
        index = torch.tensor(moved, device=caches[0].device)
        for cache in caches:
            cache[:, :, start:start + n] = cache.index_select(2, index)
    kv.ids[start:start + n] = [kv.ids[i] for i in moved]
    kv.rollback(start + n)


class RotaryTables:
    """``rope(capacity)`` for a forward of our own: ``self.rotary`` (the model's rotary
    module), ``self.embed`` (a float32 tensor giving the dtype and device) and ``self._rope``
    (None at first) are the subclass's."""

    def rope(self, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(capacity, head_dim) cos and sin tables for positions 0..capacity-1, from the
        model's own rotary module (its scaling type and attention factor included); computed
        again only when a larger capacity is asked for."""
        if self._rope is None or self._rope[0].shape[0] < capacity:
            with torch.no_grad():
                pos = torch.arange(capacity)[None]
                cos, sin = self.rotary(self.embed[:1][None], pos)
            self._rope = (cos[0].float().contiguous(), sin[0].float().contiguous())
        return self._rope


@runtime_checkable
class TargetKV(Protocol):
    """The target as the engine runs it: a model plus a KV cache holding the first ``length``
    tokens of the one sequence it was fed. Every backend implements it (``models.backends.TABLE``:
    :class:`KVModel` for transformers, ``NativeKV`` and ``Int8KV`` over :class:`StaticCacheKV`,
    ``GgmlKV``; ``tests/test_target_kv.py`` checks each); the methods below hold the one
    description of the contract, the classes only what differs.

    Attributes:
        model: the transformers module (its config and input embeddings; ggml: the model the
            GGUF was converted to, which may be None).
        device: where the logits come back.
        length: tokens in the cache.
        ids: those tokens.
        cache_bytes: bytes of the cached keys and values (a property).
    """

    model: torch.nn.Module | None
    device: torch.device
    length: int
    ids: list[int]

    @property
    def cache_bytes(self) -> int: ...

    def forward(self, ids: list[int], logits_to_keep: int = 1) -> torch.Tensor:
        """Feed ``ids`` after the cached tokens; return the logits of the last positions.

        Args:
            ids: the S new token ids (S >= 1), fed in chunks of :data:`PREFILL_CHUNK` (fewer
                where the backend's context is smaller).
            logits_to_keep: how many of the last positions to return logits for (1 <= n <= S).
        Returns:
            (logits_to_keep, V) float logits; row j predicts the token after ids[S - n + j].
        Raises:
            Cancelled: inside :func:`stop_on`, when its event is set between two chunks.
        """
        ...

    def forward_features(self, ids: list[int], logits_to_keep: int,
                         layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` that also returns hidden states from the same forward.

        Args:
            ids, logits_to_keep: as :meth:`forward`.
            layers: transformers ``hidden_states`` indices (0 = embeddings, k = input of layer k,
                L = final output after the norm).
        Returns:
            ((logits_to_keep, V) logits, (S, len(layers) * H) features of every fed position,
            the layers concatenated in the order given).
        Raises:
            Cancelled: as :meth:`forward`; the backend's error for an index it cannot give.
        """
        ...

    def rollback(self, length: int) -> None:
        """Drop cached tokens beyond ``length`` (nothing to drop: no-op)."""
        ...

    def reset(self) -> None:
        """Forget everything (an empty cache)."""
        ...


class StaticCacheKV:
    """:class:`TargetKV` for a forward of our own over a static KV cache of one
    sequence (rollback is a length change). Subclasses set ``n_layer`` and implement
    ``_run(ids: list[int], keep, layers) -> ((keep, V) logits, (S, F) features or None)``,
    which appends to ``length`` and ``ids``."""

    n_layer: int

    def reset(self) -> None:
        """Forget everything (length 0; the allocation stays)."""
        self.length = 0
        self.ids: list[int] = []

    def forward(self, ids, logits_to_keep: int = 1) -> torch.Tensor:
        """As :meth:`TargetKV.forward`; ``ids`` may also be an (S,) long tensor.

        Raises:
            ValueError: ids empty or logits_to_keep outside 1..S (or what ``_run`` refuses).
        """
        return self._feed(ids, logits_to_keep, ())[0]

    def forward_features(self, ids, logits_to_keep: int,
                         layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`TargetKV.forward_features` (float32 features).

        Raises:
            ValueError: an index outside 0..L.
        """
        layers = tuple(int(i) for i in layers)
        problem = unknown_hidden_states(layers, self.n_layer)
        if problem:
            raise ValueError(problem)
        return self._feed(ids, logits_to_keep, layers)

    def reserve(self, positions: int) -> None:
        """Allocate room for ``positions`` cached tokens now (the subclass's ``_grow``), so that
        a timed prefill of that many does not grow the cache inside its clock."""
        grow = getattr(self, "_grow", None)
        if grow is not None:
            grow(positions)

    def rollback(self, length: int) -> None:
        """Drop cached tokens beyond ``length`` (a length change; nothing to drop: no-op)."""
        if length < self.length:
            self.length, self.ids = length, self.ids[:length]

    def _feed(self, ids, keep: int, layers: tuple[int, ...]):
        if isinstance(ids, torch.Tensor):
            ids = [int(i) for i in ids.view(-1).tolist()]
        if len(ids) == 0:
            raise ValueError("nothing to feed: ids is empty")
        if not 1 <= keep <= len(ids):
            raise ValueError(f"logits_to_keep must be in 1..{len(ids)}, got {keep}")
        return feed_in_chunks(lambda chunk, k, lay: self._run(list(chunk), k, lay), ids, keep,
                              layers)


class KVModel:
    """:class:`TargetKV` over a transformers model and its own cache (``DynamicCache``): the
    ``transformers`` backend, the float32 reference.

    Args:
        model: a transformers causal LM (``logits_to_keep`` supported), batch size 1.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self._cache_arg = _cache_kwarg(model)
        self.reset()

    def reset(self) -> None:
        """Forget everything (a fresh, empty cache)."""
        self.cache = DynamicCache(config=self.model.config)
        self._bounded = bool(_sliding_layers(self.cache))
        if self._bounded:  # keep past states until the next crop, so rollbacks are exact
            self.cache.activate_past_recording()
        self.length = 0
        self.ids: list[int] = []  # the tokens whose keys/values are cached, for a re-feed

    def forward(self, ids: list[int], logits_to_keep: int = 1) -> torch.Tensor:
        """As :meth:`TargetKV.forward`; ``ids`` may also be an (S,) long tensor (a drafter's
        token on the device: ``self.ids`` holds 0-d tensors for it until the caller replaces them
        with the ids)."""
        return self._feed(ids, logits_to_keep, ())[0]

    def forward_features(self, ids: list[int], logits_to_keep: int,
                         layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`TargetKV.forward_features`, the chunks' features joined (transformers >= 5:
        ``output_hidden_states=[...]`` keeps only the layers asked for)."""
        return self._feed(ids, logits_to_keep, tuple(layers))

    def _feed(self, ids: list[int], keep: int,
              layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        return feed_in_chunks(self._run, ids, keep, layers)

    @torch.inference_mode()
    def _run(self, ids: list[int], keep: int, layers: tuple[int, ...],
             inputs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One model call: ((keep, V) logits, (S, F) features or None). ``ids`` may be an (S,)
        long tensor already on the device (a drafter's token: fed without a host round trip).
        ``inputs``: more model arguments (a draft tree's ``attention_mask``, ``position_ids``)."""
        if isinstance(ids, torch.Tensor):
            input_ids = ids.view(1, -1).to(self.device)
            ids = list(ids.view(-1).unbind())  # 0-d tensors until the caller names them
        else:
            input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)  # (1, S)
        extra = {"output_hidden_states": list(layers)} if layers else {}
        out = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=keep,
                         **extra, **(inputs or {}), **{self._cache_arg: self.cache})
        self.length += len(ids)
        self.ids += ids
        if not layers:
            return out.logits[0], None  # (keep, V)
        return out.logits[0], torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)

    def rollback(self, length: int) -> None:
        """Drop cached tokens beyond ``length`` (nothing to drop: only trims sliding layers).

        Exact for any ``length``: when a sliding-window layer no longer holds what the kept
        tokens need, the cache is rebuilt by feeding ``ids[:length]`` again (one forward).
        """
        drop = self.length - length
        if drop > 0 and not all(_can_drop(layer, drop) for layer in _sliding_layers(self.cache)):
            kept = [int(i) for i in self.ids[:length]]
            self.reset()
            if kept:
                self.forward(kept)
            return
        if drop > 0:
            self.cache.crop(-drop)  # negative: tokens to remove (old and new API)
            self.length, self.ids = length, self.ids[:length]
        elif self._bounded and self.length:
            self.cache.crop(0)  # trim the recorded past back to the window

    @torch.inference_mode()
    def forward_tree(self, ids: list[int], depth: list[int], anc: list[int],
                     layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward over a draft tree's rows after the cached tokens, with tree attention.

        Args:
            ids: the S rows' token ids (row 0 the context's last token, then the nodes).
            depth: per row, its depth (row 0: 0); its position is ``length + depth``.
            anc: per row, a bitmask of the rows it attends to among these S (itself and its
                ancestors; ``core.tree.DraftTree.rows``).
            layers: hidden-state indices to return, as :meth:`forward_features`.
        Returns:
            ((S, V) logits of every row, (S, F) features or None). The cache holds all S rows
            until :meth:`keep_rows` keeps the accepted ones.
        Raises:
            ValueError: on a model with sliding-window layers (its cache cannot drop rows out
                of order) or rows that do not match.
        """
        if self._bounded:
            raise ValueError("tree drafting needs a cache that can drop any row; this model has "
                             "sliding-window layers")
        s = len(ids)
        if not (s == len(depth) == len(anc)) or s == 0:
            raise ValueError("forward_tree: ids, depth and anc must have the same length >= 1")
        start = self.length
        allowed = torch.tensor([[(a >> j) & 1 for j in range(s)] for a in anc], dtype=torch.bool)
        mask = torch.ones(s, start + s, dtype=torch.bool)
        mask[:, start:] = allowed
        dtype = getattr(self.model, "dtype", torch.float32)  # the compute dtype, quantised too
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            dtype = torch.float32
        bias = torch.zeros(s, start + s, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
        return self._run(list(ids), s, tuple(layers), {
            "attention_mask": bias[None, None].to(self.device),
            "position_ids": torch.tensor([[start + d for d in depth]], device=self.device)})

    @torch.inference_mode()
    def keep_rows(self, start: int, rows: list[int]) -> None:
        """After :meth:`forward_tree` at ``start``: keep that call's rows ``rows`` (increasing,
        call-relative), moved to positions start, start + 1, ...; drop the rest."""
        keep_tree_rows(self, [getattr(layer, name) for layer in self.cache.layers
                              for name in ("keys", "values")], start, rows)

    @property
    def cache_bytes(self) -> int:
        return cache_bytes(self.cache)
