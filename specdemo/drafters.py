"""Drafters: what proposes tokens for the target to verify.

One small protocol (propose, then learn how many were accepted), after transformers'
``CandidateGenerator`` (``get_candidates`` / ``update_candidate_strategy``) but returning only the
new tokens. Implementations:

* :class:`NgramDrafter` - prompt lookup over prompt + generated text, no model
  (Saxena, "Prompt Lookup Decoding", 2023; transformers ``PromptLookupCandidateGenerator``).
* :class:`ModelDrafter` - an independent draft model with its own KV cache (Leviathan et al. 2023).
  ``self`` (the target as its own draft) and ``early-exit:N`` (the target's first N layers with
  its final norm and head, as in LayerSkip, Elhoushi et al. 2024) are ModelDrafters over views
  of the target that share its weights.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Protocol

import torch

from .kv import KVModel
from .sampling import SamplingParams, choose, next_token_probs


@dataclass
class Proposal:
    """Draft tokens for one round.

    Attributes:
        ids: the proposed ids (0 <= len <= k requested).
        probs: (len(ids), V) the distributions they were drawn from, or None when the drafter
            has none (verification then treats q as one-hot).
    """

    ids: list[int]
    probs: torch.Tensor | None = None


class Drafter(Protocol):
    """Proposes up to k tokens after ``context``; then hears how many were accepted."""

    name: str

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal: ...

    def feedback(self, n_accepted: int) -> None: ...

    @property
    def extra_memory_bytes(self) -> int: ...


class NgramDrafter:
    """Prompt lookup: find an earlier occurrence of the context's last n-gram and propose the
    tokens that followed it (the latest occurrence, or the first when the latest is too close to
    the end to supply k tokens). Tries n = max_ngram down to min_ngram; proposes nothing when no
    n-gram matches (the round is then a plain step).

    Args:
        max_ngram: longest suffix to match (tokens).
        min_ngram: shortest suffix to match; 2 by default because single-token matches are
            mostly wrong and a rejected block costs a wider forward on a CPU.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        # n-gram -> (position right after its first occurrence, ... after its latest occurrence)
        self._index: dict[tuple[int, ...], tuple[int, int]] = {}
        self._indexed: list[int] = []  # the context the index was built from

    def _update_index(self, context: list[int]) -> None:
        n_old = len(self._indexed)
        if context[:n_old] != self._indexed:  # not an extension of what we indexed: rebuild
            self._index.clear()
            n_old = 0
        # Index n-grams ending before the last token, so every entry has a continuation.
        for end in range(max(n_old - 1, 0), len(context) - 1):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end + 1 >= n:
                    key = tuple(context[end + 1 - n:end + 1])
                    first = self._index.get(key, (end + 1,))[0]
                    self._index[key] = (first, end + 1)
        self._indexed = list(context)

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        self._update_index(context)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) > n:
                found = self._index.get(tuple(context[-n:]))
                if found is not None:
                    first, latest = found  # the latest, unless too close to the end to give k
                    start = latest if len(context) - latest >= k else first
                    return Proposal(context[start:start + k])
        return Proposal([])

    def feedback(self, n_accepted: int) -> None:
        pass

    @property
    def extra_memory_bytes(self) -> int:
        return 0


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Resize (..., V_draft) logits to (..., vocab_size): cut padded rows or pad with -inf.

    Draft and target may share a tokenizer yet pad their embeddings differently
    (Qwen2.5-7B: 152064 rows, Qwen2.5-0.5B: 151936); ids beyond either are never real tokens.
    """
    v = logits.shape[-1]
    if v == vocab_size:
        return logits
    if v > vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - v), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class ModelDrafter:
    """A draft model with its own KV cache, drafting autoregressively with the target's sampling
    parameters. Its cache follows the context by common prefix: after a rejection the stale draft
    tokens are cropped (KVModel.rollback) before the next proposal.

    Args:
        model: a transformers causal LM sharing the target's tokenizer (ids mean the same text).
        vocab_size: the target's logits width; draft distributions are resized to it.
        name: shown in stats and the UI.
        shares_weights: True when ``model``'s weights are the target's (self, early-exit), so only
            its KV cache counts as extra memory.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, name: str = "model",
                 shares_weights: bool = False) -> None:
        self.kv = KVModel(model)
        self.vocab_size = vocab_size
        self.name = name
        self._weight_bytes = 0 if shares_weights else param_bytes(model)
        self._fed: list[int] = []  # ids whose keys/values are in self.kv's cache

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        if k <= 0:
            return Proposal([])
        common = 0
        limit = min(len(self._fed), len(context) - 1)  # feed at least the last token
        while common < limit and self._fed[common] == context[common]:
            common += 1
        self.kv.rollback(common)
        pending, seq = context[common:], list(context)
        ids, probs = [], []
        for _ in range(k):
            logits = fit_vocab(self.kv.forward(pending)[-1], self.vocab_size)
            p = next_token_probs(logits, torch.tensor(seq, device=logits.device), params) \
                if params.repetition_penalty != 1.0 else next_token_probs(logits, _EMPTY, params)
            token = choose(p, params, generator)
            ids.append(token)
            probs.append(p)
            seq.append(token)
            pending = [token]
        self._fed = seq[:-1]  # the last draft token was never fed
        return Proposal(ids, torch.stack(probs))

    def feedback(self, n_accepted: int) -> None:
        pass

    @property
    def extra_memory_bytes(self) -> int:
        return self._weight_bytes + self.kv.cache_bytes


_EMPTY = torch.empty(0, dtype=torch.long)


def early_exit_view(model: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    """A causal LM that runs only the first ``n_layers`` decoder layers of ``model``, then its
    final norm and head. Shares every weight with ``model`` (no copy).

    Works for the decoder-only layouts transformers uses for Llama, Qwen2/3, Gemma, Mistral and
    SmolLM (``model.model.layers``).

    Raises:
        ValueError: if n_layers is not within 1..(number of layers - 1), or the layout differs.
    """
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"early-exit needs a decoder with model.layers; {type(model).__name__} has none")
    if not 1 <= n_layers < len(layers):
        raise ValueError(f"early-exit layers must be in 1..{len(layers) - 1}, got {n_layers}")
    config = copy.copy(model.config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:n_layers]
    view = copy.copy(model)
    view._modules = dict(model._modules)
    view.config = config
    view_inner = copy.copy(inner)
    view_inner._modules = dict(inner._modules)
    view_inner.layers = torch.nn.ModuleList(list(layers)[:n_layers])
    view_inner.config = config
    view.model = view_inner
    return view


def make_drafter(spec: str, target: torch.nn.Module, vocab_size: int,
                 draft_model: torch.nn.Module | None = None) -> Drafter | None:
    """Build the drafter named by ``spec``.

    Args:
        spec: ``none``, ``ngram``, ``self``, ``early-exit:<layers>``, or anything else together
            with ``draft_model`` (an independent draft model, already loaded).
        target: the target model (for self and early-exit views).
        vocab_size: the target's logits width.
    Returns:
        The drafter, or None for ``none`` (plain decoding).
    Raises:
        ValueError: for an unknown spec or bad early-exit layer count.
    """
    if spec in ("none", ""):
        return None
    if spec == "ngram":
        return NgramDrafter()
    if spec == "self":
        return ModelDrafter(target, vocab_size, name="self", shares_weights=True)
    if spec.startswith("early-exit"):
        _, _, layers = spec.partition(":")
        if not layers.isdigit():
            raise ValueError(f"early-exit needs a layer count, e.g. early-exit:8; got {spec!r}")
        return ModelDrafter(early_exit_view(target, int(layers)), vocab_size, name=spec,
                            shares_weights=True)
    if draft_model is None:
        raise ValueError(f"unknown drafter {spec!r}: expected none, ngram, self, early-exit:N or a model")
    return ModelDrafter(draft_model, vocab_size, name=spec)
