"""The drafter protocol and what every drafter family shares.

One small protocol (propose, then learn how many were accepted), after transformers'
``CandidateGenerator`` (``get_candidates`` / ``update_candidate_strategy``) but returning only the
new tokens. Drafters that read the target's hidden states (EAGLE-3, DFlash, MTP) add one method,
``observe``, and name the hidden states they need (``feature_layers``); the engine asks the target
for exactly those in the verification forward it runs anyway, so drafting costs no extra target
forward (:class:`FeatureDrafter`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from ..clock import read_on_host
from ..kv import cache_bytes
from ..sampling import (Generators, SamplingParams, choose, generator_for, next_token_probs,
                        penalize, probs_from_logits)
from .vocab import expand_logits


@dataclass
class Proposal:
    """Draft tokens for one round.

    Attributes:
        ids: the proposed ids (0 <= len <= k requested), in the target's vocabulary.
        probs: (len(ids), V) the distributions they were drawn from, or None when the drafter
            has none (verification then treats q as one-hot).
        source: which drafter proposed them (a combined drafter names the one it chose).
        confidence: per proposed token, the drafter's own probability of it (the largest
            probability of its distribution at temperature 1 when greedy, else q(token)), or
            None when the drafter has none (prompt lookup). A draft-length policy may verify
            fewer of the tokens when it is low (EAGLE-2's observation that a draft model's
            confidence approximates its acceptance rate; Li et al. 2024, section 4).
    """

    ids: list[int]
    probs: torch.Tensor | None = None
    source: str | None = None
    confidence: list[float] | None = None


class Drafter(Protocol):
    """Proposes up to k tokens after ``context``; then hears how many were accepted."""

    name: str

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal: ...

    def feedback(self, n_accepted: int) -> None: ...

    @property
    def extra_memory_bytes(self) -> int: ...


@runtime_checkable
class TreeDrafter(Protocol):
    """A drafter that drafts a tree of candidates (EAGLE-3; a stacked drafter over one):
    ``propose_tree(context, shape) -> core.tree.DraftTree``; ``drafts_trees`` says whether it
    does here (a stacked drafter over a chain drafter does not)."""

    drafts_trees: bool

    def propose_tree(self, context: list[int], shape): ...


@runtime_checkable
class StackedDrafter(Protocol):
    """Prompt lookup stacked over a learned drafter (``CombinedDrafter``): the engine may weigh
    the free ``lookup`` against ``propose_learned`` itself, then ``use`` the one it took."""

    def lookup(self, context: list[int], k: int, params: SamplingParams,
               generator: torch.Generator | None) -> Proposal | None: ...

    def use(self, proposal: Proposal) -> Proposal: ...

    def prefers(self, found: Proposal | None, k: int) -> bool: ...

    def propose_learned(self, context: list[int], k: int, params: SamplingParams,
                        generator: torch.Generator | None,
                        keep_going: KeepGoing | None = None) -> Proposal: ...


class KeepGoing(Protocol):
    """Asked by a drafter that stops early after each drafted token with the confidences so
    far (``Proposal.confidence``): True to draft another (``AdaptiveDraftLength.more``)."""

    def __call__(self, confidence: list[float]) -> bool: ...


@runtime_checkable
class CatchesUp(Protocol):
    """A draft model that feeds itself the prompt in pieces: ``begin(prompt_length, max_k)``
    before the first round (``ModelDrafter.begin``)."""

    def begin(self, prompt_length: int, max_k: int) -> None: ...


@runtime_checkable
class Primes(Protocol):
    """A drafter that feeds itself the prompt's target features at once, after the prefill and
    the first new token (``prime(context)``; ``Eagle3Drafter.prime``), so that its first draft
    costs what a later one does instead of carrying the whole prompt: the engine times it as
    drafting, and ``auto`` does not take it for what drafting a token costs."""

    def prime(self, context: list[int]) -> None: ...


@runtime_checkable
class StopsEarly(Protocol):
    """A token-by-token drafter whose ``propose`` takes ``keep_going(confidence) -> bool``
    (asked after each token) when ``stops_early`` is true."""

    stops_early: bool


@runtime_checkable
class FeatureDrafter(Protocol):
    """A drafter that reads target hidden states.

    ``feature_layers`` are indices into transformers' ``hidden_states`` tuple: 0 is the embedding
    output, k is the *input* of decoder layer k (= the output of layer k-1), L the final output.
    EAGLE-3 asks for inputs of layers [2, L//2, L-3]; DFlash for outputs of layer k (index k+1).

    The engine keeps one invariant: after every target forward it calls ``observe`` with the
    features of the context positions that forward settled, in order, so that the drafter holds
    features for every context position except the last (whose token has just been chosen and
    not yet been through the target). ``observe`` receives (n, F) with F = len(feature_layers) *
    hidden size, the layers concatenated in the order given.
    """

    feature_layers: tuple[int, ...]

    def observe(self, features: torch.Tensor) -> None: ...


@runtime_checkable
class LoadedDrafter(Protocol):
    """A loaded, checked learned drafter (EAGLE-3, DFlash, DSpark, MTP, a Gemma 4 assistant,
    ``<learned>+ngram``), ready to make a fresh drafter per decode.

    ``feature_layers(target)`` says which target hidden states its drafters read, from what was
    loaded (its config), without building a drafter; ``new_drafter`` builds one per decode.
    """

    spec: str

    def new_drafter(self, target: torch.nn.Module, vocab_size: int, name: str) -> object: ...

    def feature_layers(self, target: torch.nn.Module) -> tuple[int, ...]: ...


def wants_features(drafter: object) -> tuple[int, ...]:
    """The hidden-state indices ``drafter`` needs: a ``FeatureDrafter``'s ``feature_layers``,
    empty for any other drafter."""
    return tuple(drafter.feature_layers) if isinstance(drafter, FeatureDrafter) else ()


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
    """Bytes of a module's parameters and buffers (tied tensors once)."""
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


@dataclass
class LoadedModule:
    """A loaded, checked drafter module, ready to make a fresh drafter per decode; the kinds
    (``dflash.LoadedDFlash``, ``mtp.LoadedAssistant``) add ``new_drafter`` and ``summary``.

    Attributes:
        spec: as given.  model: the module, on the target's device.  info: what loading found
            (its layout, and the kind's own entries).
        warnings: checks that did not refuse it.  load_s: seconds loading took.
    """

    spec: str
    model: torch.nn.Module
    info: dict
    warnings: list[str] = field(default_factory=list)
    load_s: float = 0.0

    @property
    def weight_bytes(self) -> int:
        """Bytes of the module's parameters and buffers (:func:`param_bytes`)."""
        return param_bytes(self.model)


_EMPTY = torch.empty(0, dtype=torch.long)


def draw(logits: torch.Tensor, context: list[int], params: SamplingParams,
         generator: torch.Generator | None) -> tuple[int, torch.Tensor]:
    """One draft token from (V,) target-vocabulary logits with the target's sampling parameters.

    The distribution is the one the token was drawn from (one-hot at the argmax when greedy),
    so it is the q of the speculative-sampling rule.

    Returns:
        (token id, (V,) float32 probabilities).
    """
    seen = (torch.tensor(context, device=logits.device) if params.repetition_penalty != 1.0
            else _EMPTY)
    p = next_token_probs(logits, seen, params)
    return choose(p, params, generator), p


class ModuleDrafter:
    """What a drafter built from a loaded module shares (DFlash, DSpark, MTP, the Gemma 4
    assistant): its extra memory is the module's own weights plus its cache, and ``feedback`` has
    nothing to do (the target features it observes, of settled positions only, keep it in step).
    Subclasses set ``_weight_bytes`` and ``_cache`` (a transformers cache), or override
    :attr:`extra_memory_bytes`."""

    _weight_bytes: int
    _cache: object

    def feedback(self, n_accepted: int) -> None:
        """Nothing to do: the features it observes keep it in step."""

    @property
    def extra_memory_bytes(self) -> int:
        """Bytes of the module's own weights (not the target's it reads) and its cache."""
        return self._weight_bytes + cache_bytes(self._cache)


class DraftSampler:
    """Draws one proposal's tokens on the device of the drafter's logits and hands the ids to
    the host once, at the end (:meth:`proposal`): no ``int(argmax)`` per drafted token, so an
    autoregressive drafter on a GPU queues its whole draft without waiting for the device.

    Tokens come back as (1,) long tensors to feed the drafter's next step. Each distribution is
    the one its token was drawn from (one-hot at the argmax when greedy): the q of the
    speculative-sampling rule. The repetition penalty sees the context and the tokens drawn so
    far, as :func:`draw` does. Each token's confidence (``Proposal.confidence``) is recorded
    beside it.

    Greedy logits on the CPU are read through numpy (argmax and the top probability, ~13 us for
    8,192 logits, where torch's small-tensor ops took 20-100 us each beside the native target's
    threads), and the one-hot rows are built once per proposal.

    Args:
        context: the ids before the first draft token.
        params: the target's sampling parameters.
        generator: see ``sampling.generator_for``; used on the logits' device.
    """

    def __init__(self, context: list[int], params: SamplingParams,
                 generator: Generators | torch.Generator | None) -> None:
        self.context, self.params, self.generator = context, params, generator
        self.tokens: list[torch.Tensor] = []
        self.probs: list[torch.Tensor | None] = []  # None: one-hot at the token (greedy)
        self.confidence: list[float | torch.Tensor] = []  # host float, or () on the device
        self._host: list[int | None] = []  # the token id when known on the host
        self._seen: torch.Tensor | None = None
        self._vocab: int | None = None  # V of the one-hot rows

    def last_confidence(self) -> float:
        """The drafter's probability of the token drawn last (:attr:`Proposal.confidence`), on
        the host (a device-to-host transfer when it is on a GPU), for a caller deciding whether
        to draft on."""
        return float(self.confidence[-1])

    def last_id(self) -> int:
        """The id of the token drawn last, on the host (a transfer only when it is not yet)."""
        known = self._host[-1]
        return known if known is not None else int(self.tokens[-1])

    def _greedy(self, logits: torch.Tensor, ids: list[int] | None = None) -> torch.Tensor:
        """Record the argmax of (n,) logits (mapped through ``ids`` when given) as one-hot."""
        if read_on_host(logits):
            index, confidence = host_top(logits)
            token_id = ids[index] if ids is not None else index
            token = torch.tensor([token_id])
            self._host.append(token_id)
            self.confidence.append(confidence)
        else:
            token = logits.float().argmax(-1, keepdim=True)
            self._host.append(None)
            self.confidence.append(_top_probability(logits))
        self.tokens.append(token)
        self.probs.append(None)
        return token

    def draw(self, logits: torch.Tensor) -> torch.Tensor:
        """One token from (V,) target-vocabulary logits; returns it as a (1,) long tensor on
        the logits' device."""
        params = self.params
        if params.repetition_penalty != 1.0:
            if self._seen is None:
                self._seen = torch.tensor(self.context, device=logits.device)
            logits = penalize(logits, self._seen, params.repetition_penalty)
        self._vocab = logits.shape[-1]
        if params.greedy:  # one-hot q, built in proposal()
            token = self._greedy(logits)
        else:
            p = probs_from_logits(logits, params)
            token = torch.multinomial(p, 1, generator=generator_for(self.generator, p.device))
            self.tokens.append(token)
            self.probs.append(p)
            self._host.append(None)
            self.confidence.append(p[token[0]])
        if self._seen is not None:
            self._seen = torch.cat([self._seen, token.to(self._seen.device)])
        return token

    def draw_subset(self, logits: torch.Tensor, ids: torch.Tensor, vocab_size: int,
                    increasing: bool = False, ids_host: list[int] | None = None) -> torch.Tensor:
        """:meth:`draw` from (Vd,) logits over a sub-vocabulary (a draft head's): ``ids`` (Vd,)
        their target ids (``ids_host`` the same as a list, when the caller has one), the others
        -inf (``vocab.expand_logits``). When ``increasing`` (the caller knows ``ids`` is strictly
        increasing), greedy without a repetition penalty takes the argmax among the Vd logits
        and maps it instead of building the V logits every step: the same token, since argmax
        returns the first of equal maxima either way."""
        params = self.params
        if params.greedy and params.repetition_penalty == 1.0 and increasing:
            self._vocab = vocab_size
            if read_on_host(logits):
                return self._greedy(logits, ids_host if ids_host is not None else ids.tolist())
            token = ids[logits.float().argmax(-1)].view(1).to(logits.device)
            self.tokens.append(token)
            self.probs.append(None)
            self._host.append(None)
            self.confidence.append(_top_probability(logits))
            return token
        return self.draw(expand_logits(logits, ids, vocab_size))

    def proposal(self, source: str | None) -> Proposal:
        """The tokens drawn so far, their ids moved to the host in one transfer."""
        if not self.tokens:
            return Proposal([], source=source)
        n = len(self.tokens)
        on_device = [c for c in self.confidence if isinstance(c, torch.Tensor)]
        if all(t is not None for t in self._host):
            ids = list(self._host)
            moved = iter(torch.stack(on_device).tolist() if on_device else [])
        else:  # ids and confidences in one transfer (ids are exact in float64)
            both = torch.cat([torch.cat(self.tokens).double(),
                              torch.stack(on_device).double() if on_device
                              else self.tokens[0].new_empty(0, dtype=torch.float64)]).tolist()
            ids, moved = [int(x) for x in both[:n]], iter(both[n:])
        device = self.tokens[0].device
        if all(p is None for p in self.probs):  # greedy: one-hot rows, built at once
            probs = torch.zeros(len(ids), self._vocab, device=device)
            probs[torch.arange(len(ids)), torch.tensor(ids)] = 1.0
        else:
            rows = []
            for i, p in enumerate(self.probs):
                if p is None:  # one-hot at the token
                    p = torch.zeros(self._vocab, device=device)
                    p[ids[i]] = 1.0
                rows.append(p)
            probs = torch.stack(rows)
        confidence = [c if not isinstance(c, torch.Tensor) else next(moved)
                      for c in self.confidence]
        return Proposal(ids, probs, source=source, confidence=confidence)


def host_top(logits: torch.Tensor) -> tuple[int, float]:
    """(argmax, its softmax probability) of (n,) CPU logits, through numpy: the first of equal
    maxima, as ``torch.argmax``."""
    a = logits.detach()
    if a.dtype != torch.float32:
        a = a.float()
    a = a.numpy()
    index = int(a.argmax())
    return index, 1.0 / float(np.exp(a - a[index]).sum())


def _top_probability(logits: torch.Tensor) -> torch.Tensor:
    """() the largest probability of softmax((V,) logits): exp(max - logsumexp)."""
    logits = logits.float()
    return torch.exp(logits.max() - torch.logsumexp(logits, -1))