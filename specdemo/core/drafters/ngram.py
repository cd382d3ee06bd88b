"""Prompt lookup: propose what followed the last n-gram earlier in the context (no model).

Saxena, "Prompt Lookup Decoding", 2023; transformers ``PromptLookupCandidateGenerator``.
"""

from __future__ import annotations

import torch

from ..sampling import SamplingParams
from .base import Proposal


class NgramDrafter:
    """Find an earlier occurrence of the context's last n-gram and propose the tokens that
    followed it (the latest occurrence, or the first when the latest is too close to the end to
    supply k tokens). Tries n = max_ngram down to min_ngram; proposes nothing when no n-gram
    matches (the round is then a plain step).

    Args:
        max_ngram: longest suffix to match (tokens).
        min_ngram: shortest suffix to match; 2 by default because single-token matches are
            mostly wrong and a rejected block costs a wider forward on a CPU.
    Raises:
        ValueError: unless 1 <= min_ngram <= max_ngram.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        # n-gram -> (position right after its first occurrence, ... after its latest occurrence)
        self._index: dict[tuple[int, ...], tuple[int, int]] = {}
        self._indexed: list[int] = []  # the context the index was built from
        self.last_match = 0  # length of the n-gram behind the latest proposal (0: none)

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
        self.last_match = 0
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) > n:
                found = self._index.get(tuple(context[-n:]))
                if found is not None:
                    first, latest = found  # the latest, unless too close to the end to give k
                    start = latest if len(context) - latest >= k else first
                    self.last_match = n
                    return Proposal(context[start:start + k], source=self.name)
        return Proposal([], source=self.name)

    def feedback(self, n_accepted: int) -> None:
        pass

    @property
    def extra_memory_bytes(self) -> int:
        return 0
