"""Stacking prompt lookup over a learned drafter (as llama.cpp stacks an n-gram drafter over a
draft model): each round takes the proposal more likely to be accepted.

When the context's last tokens occurred before (a long n-gram match), the answer is probably
copying (code edits, quotes, lists), where prompt lookup's continuation beats any model; elsewhere
the learned drafter proposes. Each source's acceptance is tracked, and prompt lookup is preferred
only while its own running acceptance is at least the learned drafter's. Proposals name their
source, so the statistics stay per drafter.
"""

from __future__ import annotations

import torch

from ..sampling import SamplingParams
from .base import CatchesUp, Primes, Proposal, StopsEarly, TreeDrafter, wants_features
from .ngram import NgramDrafter


class CombinedDrafter:
    """Prompt lookup (``ngram``) over a learned drafter.

    Args:
        learned: the learned drafter (EAGLE-3, DFlash, ...); it keeps observing target features
            in rounds where prompt lookup proposes, so it never falls out of step.
        ngram: the prompt-lookup drafter.
        min_match: the shortest n-gram match that lets prompt lookup propose while the learned
            drafter does at least half as well as prompt lookup (then ``ngram.min_ngram``).
        name: shown in stats and the UI.
    """

    def __init__(self, learned, ngram: NgramDrafter | None = None, min_match: int = 3,
                 name: str = "combined") -> None:
        self.learned = learned
        self.ngram = ngram or NgramDrafter(max_ngram=4, min_ngram=2)
        self.min_match = min_match
        self.name = name
        self.feature_layers = wants_features(learned)
        self.acceptance = {"ngram": 0.6, "learned": 0.5}  # running per-token acceptance
        self._last: str | None = None
        self._last_n = 0

    def begin(self, prompt_length: int, max_k: int) -> None:
        """Passed on to the learned drafter when it takes it (``ModelDrafter.begin``)."""
        if isinstance(self.learned, CatchesUp):
            self.learned.begin(prompt_length, max_k)

    def observe(self, features: torch.Tensor) -> None:
        self.learned.observe(features)

    def prime(self, context: list[int]) -> None:
        """Passed on to the learned drafter when it primes (``Eagle3Drafter.prime``)."""
        if isinstance(self.learned, Primes):
            self.learned.prime(context)

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        found = self.lookup(context, k, params, generator)
        if self.prefers(found, k):
            return self.use(found)
        return self.propose_learned(context, k, params, generator)

    def lookup(self, context: list[int], k: int, params: SamplingParams,
               generator: torch.Generator | None) -> Proposal | None:
        """Prompt lookup's proposal alone, or None: None without a match as long as
        :meth:`propose` requires (``min_match`` tokens while the learned drafter does at least
        half as well as prompt lookup, else ``ngram.min_ngram``: two-token matches are common in
        prose and mostly wrong, and would crowd out a learned drafter that does better).
        Nothing is recorded and the learned drafter does not run. For a draft-length policy
        that weighs each source at its own measured acceptance and cost
        (``AdaptiveDraftLength``, engine.decode), which then calls :meth:`use` or
        :meth:`propose_learned`."""
        found = self.ngram.propose(context, k, params, generator)
        if not found.ids or self.ngram.last_match < self._need():
            return None
        return Proposal(found.ids, found.probs, source="ngram")

    def use(self, proposal: Proposal) -> Proposal:
        """Record that ``proposal`` (from :meth:`lookup`) is this round's, for ``feedback``."""
        self._last, self._last_n = "ngram", len(proposal.ids)
        return proposal

    @property
    def stops_early(self) -> bool:
        """Whether :meth:`propose_learned` takes ``keep_going`` (the learned drafter's does)."""
        return isinstance(self.learned, StopsEarly) and bool(self.learned.stops_early)

    def propose_learned(self, context: list[int], k: int, params: SamplingParams,
                        generator: torch.Generator | None, keep_going=None) -> Proposal:
        """The learned drafter's proposal of up to k tokens, recorded as this round's;
        ``keep_going`` is passed on when given (``Eagle3Drafter.propose``)."""
        if keep_going is None:
            proposal = self.learned.propose(context, k, params, generator)
        else:
            proposal = self.learned.propose(context, k, params, generator, keep_going=keep_going)
        self._last, self._last_n = "learned", len(proposal.ids)
        return Proposal(proposal.ids, proposal.probs, source=proposal.source or "learned",
                        confidence=proposal.confidence)

    def prefers(self, found: Proposal | None, k: int) -> bool:
        """Whether :meth:`propose` would take prompt lookup's ``found`` (from :meth:`lookup`)
        over the learned drafter for a k-token round."""
        return (found is not None and len(found.ids) >= min(k, 2)
                and self.acceptance["ngram"] >= self.acceptance["learned"])

    @property
    def drafts_trees(self) -> bool:
        """Whether the learned drafter drafts trees (:meth:`propose_tree`)."""
        return isinstance(self.learned, TreeDrafter) and bool(self.learned.drafts_trees)

    def propose_tree(self, context: list[int], shape):
        """The learned drafter's draft tree (``Eagle3Drafter.propose_tree``), recorded as this
        round's (its acceptance per depth: accepted / the tree's depth)."""
        tree = self.learned.propose_tree(context, shape)
        self._last, self._last_n = "learned", shape.depth
        return tree

    def _need(self) -> int:
        """The n-gram match that lets prompt lookup propose: ``min_match`` while the learned
        drafter does at least half as well as prompt lookup, else prompt lookup's own shortest
        match. A learned drafter that fails on this text (a head trained on little Chinese
        accepted 0 of 11 where prompt lookup alone accepted 18 of 36) then stops keeping prompt
        lookup's shorter matches out."""
        if self.acceptance["learned"] * 2 >= self.acceptance["ngram"]:
            return self.min_match
        return min(self.min_match, self.ngram.min_ngram)

    def feedback(self, n_accepted: int) -> None:
        if self._last is not None and self._last_n:
            rate = n_accepted / self._last_n
            self.acceptance[self._last] += 0.2 * (rate - self.acceptance[self._last])
        self.learned.feedback(n_accepted)

    @property
    def extra_memory_bytes(self) -> int:
        return self.learned.extra_memory_bytes
