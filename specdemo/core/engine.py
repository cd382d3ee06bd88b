"""The decoding engine: one streaming loop for plain and speculative decoding.

Plain decoding is the same loop with no drafter (every round verifies zero draft tokens).
Each round: the drafter proposes k tokens; one target forward over [last token, d_1..d_k] gives
k+1 distributions; the speculative-sampling rule (``sampling.verify``) keeps a prefix and adds
one correction or bonus token; the KV caches are rolled back past the rejected tokens.
Structure after gpt-fast's ``speculative_decode`` (pytorch-labs/gpt-fast, generate.py).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from .clock import read_on_host
from .clock import sync as _sync
from .drafters import Drafter, Proposal, wants_features
from .drafters.base import CatchesUp, KeepGoing, Primes, StackedDrafter, StopsEarly, TreeDrafter
from .kv import Cancelled, TargetKV, stop_on
from .machine import OtherCpuUse
from .policy import (ConfidencePolicy, CostModelPolicy, DraftLengthPolicy, FixedDraftLength,
                     FixedLength, PerSourcePolicy)
from .sampling import (Generators, SamplingParams, choose, next_token_probs, penalize, verify,
                       verify_greedy)
from .stats import DecodeStats
from .tree import DraftTree, TreeOrChain, TreeShape, TreeTarget, verify_tree_greedy


@dataclass
class DecodeEvent:
    """One streamed step.

    Attributes:
        token_ids: the new token ids of this step (may be empty on the final event).
        from_draft: per new token, True when it is an accepted draft token, False when the
            target produced it (plain step, correction or bonus token).
        text: the new text since the previous event (held back while it could still turn into
            a stop string or an incomplete character).
        stats: a snapshot of the statistics so far (final on the last event).
        done: True on the last event.
        pieces: per new token, the text it added (:meth:`TextTracker.pieces`), for
            highlighting each token; None where the source does not say.
    """

    token_ids: list[int]
    from_draft: list[bool]
    text: str
    stats: DecodeStats
    done: bool = False
    pieces: list[str] | None = None


@dataclass
class DecodeResult:
    """A whole decode, as :func:`generate` returns it."""

    text: str
    token_ids: list[int]
    from_draft: list[bool]
    stats: DecodeStats
    events: int = 0


_REPLACEMENT = "\ufffd"  # what a decoder shows for bytes that are not (yet) a whole character
_WINDOW = 6  # tokens before a round's new ones that spell its inner tokens' pieces (TextTracker)


def _grow(shown: str, text: str) -> tuple[str, str]:
    """(the piece, the text shown after it) when the decoded text is now ``text`` and
    ``shown`` was handed out so far: what ``text`` adds. A decoder that takes characters back
    (Gemma's byte fallback spells a finished character as U+FFFD again while the next one is
    incomplete) adds nothing until it passes what was shown; one that changed earlier text (a
    space clean-up) adds its part after the two's common prefix."""
    if text.startswith(shown):
        return text[len(shown):], text
    if shown.startswith(text):
        return "", shown
    return text[len(os.path.commonprefix([text, shown])):], text


class TextTracker:
    """Incremental detokenisation with stop strings, and the text of each token.

    Decodes the generated ids as a whole (no drift between deltas and the final text), holds
    back any tail that could begin a stop string and every trailing U+FFFD: a character spelled
    by several tokens (byte-level BPE, SentencePiece byte fallback) decodes as one or more U+FFFD
    until its last byte arrives. At the end of a run a trailing U+FFFD run is an incomplete
    character (cut by max_new_tokens, EOS or Stop) and is dropped, so the joined deltas equal the
    final text. Same rule as the tokenizers library's ``DecodeStream`` (which vLLM streams with):
    text ending in U+FFFD is never emitted.

    Each token's piece (:meth:`pieces`, for the page's per-token highlighting) comes from the
    same decodes: ``pieces[i]`` is what token i added to the decoded text less a trailing U+FFFD
    run (:func:`_grow`), so a token that ends inside a multi-byte character gets ``""`` and the
    token completing it the whole character; the pieces join to that text, not cut at a stop
    string.
    The ids are decoded whole once per :meth:`delta` (after every token with stop strings);
    the tokens of a round before its last are spelled from the ``_WINDOW`` tokens before the
    round (a decode of a few ids, not of the whole answer), checked against the whole decode
    and decoded whole where the two disagree.

    Args:
        tokenizer: a transformers tokenizer (``decode``).
        stop_strings: strings that end generation; the output text ends before the first one.
    """

    def __init__(self, tokenizer, stop_strings: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.ids: list[int] = []
        self.text = ""  # decoded text, cut at a stop string once one appeared
        self.sent = 0  # characters already streamed
        self.stopped = False
        self._decoded, self._decoded_n = "", 0  # decode(ids[:_decoded_n])
        self._shown = ""  # the pieces handed out so far, joined
        self._pieced = 0  # tokens with a piece
        self._pieces: list[str] = []  # pieces not handed out yet

    def add(self, token_id: int) -> None:
        """Append one token; sets ``stopped`` when the text now contains a stop string."""
        self.ids.append(token_id)
        if self.stop_strings:
            decoded = self._decode(len(self.ids))
            self._take(decoded)  # decoded whole for the stop strings: the piece comes with it
            cut = min((i for i in (decoded.find(s) for s in self.stop_strings) if i >= 0),
                      default=-1)
            self.text = decoded[:cut] if cut >= 0 else decoded
            self.stopped = self.stopped or cut >= 0

    def _decode(self, n: int, start: int = 0) -> str:
        """The text of ``ids[start:n]``; the whole ids' is decoded once per length."""
        if start:
            return self.tokenizer.decode(self.ids[start:n], skip_special_tokens=True)
        if n != self._decoded_n:
            self._decoded = self.tokenizer.decode(self.ids[:n], skip_special_tokens=True)
            self._decoded_n = n
        return self._decoded

    def _take(self, decoded: str) -> None:
        """The next token's piece, from the text of the ids up to it."""
        piece, self._shown = _grow(self._shown, decoded.rstrip(_REPLACEMENT))
        self._pieces.append(piece)
        self._pieced += 1

    def pieces(self) -> list[str]:
        """The pieces (see the class) of the tokens added since the last call, in order: one
        per token."""
        first, n = self._pieced, len(self.ids)
        if n - first > 1:  # a round's tokens before its last: spelled from a short window
            start = max(0, first - _WINDOW)
            shown = self._decode(first, start).rstrip(_REPLACEMENT)
            inner = []
            for end in range(first + 1, n):
                piece, shown = _grow(shown, self._decode(end, start).rstrip(_REPLACEMENT))
                inner.append(piece)
            spelled = self._shown + "".join(inner)
            if self._decode(n).rstrip(_REPLACEMENT).startswith(spelled):
                self._pieces += inner
                self._shown, self._pieced = spelled, n - 1
            else:  # the window reads otherwise than the whole text: each prefix decoded whole
                for end in range(first + 1, n):
                    self._take(self.tokenizer.decode(self.ids[:end], skip_special_tokens=True))
        if self._pieced < n:
            self._take(self._decode(n))
        out, self._pieces = self._pieces, []
        return out

    def delta(self, final: bool = False) -> str:
        """Text not yet streamed that can be streamed safely now (when ``final``: all of it but
        an incomplete trailing character)."""
        if not self.stop_strings:
            self.text = self._decode(len(self.ids))
        end = len(self.text.rstrip(_REPLACEMENT)) if not self.stopped else len(self.text)
        if not (final or self.stopped):
            for s in self.stop_strings:  # hold back a tail that may grow into a stop string
                for n in range(min(len(s) - 1, end), 0, -1):
                    if self.text[:end].endswith(s[:n]):
                        end -= n
                        break
        end = max(end, self.sent)
        out, self.sent = self.text[self.sent:end], end
        return out


def decode(
    target: TargetKV,
    prompt_ids: list[int],
    tokenizer,
    *,
    drafter: Drafter | None = None,
    policy: DraftLengthPolicy | None = None,
    params: SamplingParams = SamplingParams(),
    max_new_tokens: int = 128,
    eos_token_ids: frozenset[int] = frozenset(),
    stop_strings: tuple[str, ...] = (),
    cancel: threading.Event | None = None,
    tree: TreeShape | None = None,
) -> Iterator[DecodeEvent]:
    """Decode ``prompt_ids`` with the target, speculatively when a drafter is given.

    Args:
        target: the target model with its KV cache (reset here).
        prompt_ids: the P >= 1 prompt token ids.
        tokenizer: used for text deltas and stop strings.
        drafter: None for plain decoding.
        policy: draft length per round; default fixed k = 4. Ignored without a drafter.
        params: sampling parameters, identical for both modes.
        max_new_tokens: generation stops after this many new tokens.
        eos_token_ids: generation stops after emitting any of these (included in token_ids).
        stop_strings: generation stops once the text contains one; the text ends before it.
        cancel: when set, generation stops after the current round, or between two chunks of a
            long prefill (of the target, or of a draft model catching up with the prompt);
            finish_reason "cancelled", what was emitted is kept.
        tree: a draft tree shape (``core.tree``): rounds of the learned drafter verify a tree
            of candidates in one forward with tree attention instead of a chain of k. Used
            only when it can be exact and cheap to check: greedy decoding without a repetition
            penalty, a drafter with ``propose_tree`` (EAGLE-3, alone or under prompt lookup)
            and a target with ``forward_tree``; otherwise the chain as usual
            (``stats.tree`` says which). Prompt lookup's rounds stay chains.
    Yields:
        DecodeEvent per round; the last has ``done=True`` and the final stats (with
        ``other_cpu_share``: how much of the CPU other processes took meanwhile).
    Raises:
        ValueError: on an empty prompt or max_new_tokens < 1.
    """
    if not prompt_ids:
        raise ValueError("the prompt is empty: nothing to condition on")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    run = _Decoding(target, prompt_ids, tokenizer, drafter, policy or FixedDraftLength(4), params,
                    max_new_tokens, eos_token_ids, stop_strings, tree)
    try:
        with stop_on(cancel):  # the prompt goes in chunks; Stop is honoured between them
            logits, features = run.prefill()
    except Cancelled:
        yield run.cancelled()
        return
    yield run.first(logits, features)
    run.prime()
    while run.stats.finish_reason is None:
        if cancel is not None and cancel.is_set():
            yield run.cancelled()
            return
        t0 = time.perf_counter()
        room = max_new_tokens - run.stats.new_tokens - 1
        try:
            with stop_on(cancel):  # a draft model's first proposal feeds it the whole prompt
                draft = run.propose(room)
        except Cancelled:
            yield run.cancelled()
            return
        verify = run.verify_chain if draft.tree is None else run.verify_tree
        yield run.settle(verify(draft, t0))


@dataclass
class _Draft:
    """One round's proposal: a chain (``proposal``, the k asked for) or a ``tree``, and the
    policy's name for its source (None: the drafter as a whole)."""

    proposal: Proposal | None = None
    k: int = 0
    source: str | None = None
    tree: DraftTree | None = None


@dataclass
class _Verified:
    """One verified round: ``drafts`` (a chain's verified drafts; a tree's accepted branch),
    ``n_accepted`` of them kept, the target's ``next_token``, and the round's clock readings
    (t0 drafting began, t1 verification began, t2 it ended)."""

    drafts: list[int]
    n_accepted: int
    next_token: int
    times: tuple[float, float, float]
    draft: _Draft


class _Decoding:
    """The state of one :func:`decode` and its steps: prefill, propose (prompt lookup, a chain,
    a tree), verify (a chain, a tree) and one bookkeeping step per round (:meth:`settle`)."""

    def __init__(self, target: TargetKV, prompt_ids: list[int], tokenizer, drafter: Drafter | None,
                 policy: DraftLengthPolicy, params: SamplingParams, max_new_tokens: int,
                 eos_token_ids: frozenset[int], stop_strings: tuple[str, ...],
                 tree: TreeShape | None) -> None:
        self.target, self.drafter, self.policy, self.params = target, drafter, policy, params
        self.max_new_tokens, self.eos_token_ids = max_new_tokens, eos_token_ids
        # one seeded generator per device: drafters sample on the target's device, verification
        # (sampling mode) on the CPU
        self.generator = Generators(params.seed) if params.seed is not None else None
        self.device = target.device
        self.stats = DecodeStats(prompt_tokens=len(prompt_ids),
                                 extra_memory_bytes=drafter.extra_memory_bytes if drafter else 0,
                                 drafter=drafter.name if drafter else None)
        self.context = list(prompt_ids)
        self.text = TextTracker(tokenizer, stop_strings)
        self.penalised = params.repetition_penalty != 1.0
        self.layers = wants_features(drafter)
        if tree is not None:
            why_not = tree_unusable_reason(drafter, target, params)
            if not why_not and isinstance(policy, FixedLength) and isinstance(policy.k, int):
                tree = tree.cut(policy.k)  # a fixed draft length k: the tree's depth is at most k
            self.stats.tree = f"not used: {why_not}" if why_not else tree.describe()
            tree = None if why_not else tree
        self.tree = tree
        # under auto the tree is kept only while it beats the draft-length rule here (TreeOrChain)
        self.shape_choice = (TreeOrChain(adaptive=isinstance(policy, CostModelPolicy)) if tree
                             else None)
        # A stacked drafter (prompt lookup over a learned one) under a per-source policy: the
        # free lookup is weighed at its own acceptance and cost against the learned drafter's
        # best (policy.py), and the policy learns each source's figures apart.
        self.is_stack = isinstance(drafter, StackedDrafter)  # (a Protocol check: ~0.1 ms)
        self.stacked = isinstance(policy, PerSourcePolicy) and policy.per_source and self.is_stack
        # a token-by-token drafter asks the policy after each token (policy.more: the
        # drafter's confidence against the cost model)
        self.asks = (isinstance(policy, ConfidencePolicy) and policy.use_confidence
                     and isinstance(drafter, StopsEarly) and drafter.stops_early)
        # the source of the previous round's chain draft (None: a plain step, a tree or no
        # round yet): a source drafting after other rounds first feeds its drafter every
        # position since, which is not what its drafting costs a token (policy.update's backlog)
        self.last_source: object = _NONE

    def probs_at(self, logits: torch.Tensor, upto: list[int]) -> torch.Tensor:
        seen = torch.tensor(upto, device=logits.device) if self.penalised else _NO_IDS
        return next_token_probs(logits, seen, self.params).cpu()

    def greedy_ids(self, logits: torch.Tensor, drafts: list[int]) -> list[int]:
        """The target's k+1 argmaxes (after the repetition penalty) as ids, in one transfer."""
        rows = logits[:len(drafts) + 1].float()
        if self.penalised:
            seen = torch.tensor(self.context + drafts, device=logits.device)
            rows = torch.stack([penalize(rows[i], seen[:len(self.context) + i],
                                         self.params.repetition_penalty)
                                for i in range(len(rows))])
        return _argmax_rows(rows)

    def target_forward(self, ids: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(keep, V) logits and, for a drafter that reads hidden states, (len(ids), F) features."""
        if self.layers:
            return self.target.forward_features(ids, keep, self.layers)
        return self.target.forward(ids, logits_to_keep=keep), None

    def emit(self, tokens: list[int], flags: list[bool]) -> DecodeEvent:
        """Append tokens one at a time, stopping exactly where plain decoding would."""
        stats, kept = self.stats, 0
        for token in tokens:
            self.context.append(token)
            self.text.add(token)
            kept += 1
            stats.new_tokens += 1
            if token in self.eos_token_ids:
                stats.finish_reason = "eos"
            elif self.text.stopped:
                stats.finish_reason = "stop"
            elif stats.new_tokens >= self.max_new_tokens:
                stats.finish_reason = "length"
            if stats.finish_reason:
                break
        _sync(self.device)
        now = time.perf_counter()
        stats.elapsed_s = now - self.start
        if stats.ttft_s is None:
            stats.ttft_s = stats.elapsed_s
        done = stats.finish_reason is not None
        if done:
            stats.other_cpu_share = self.others.share_if_measurable()
        pieces = self.text.pieces()  # one per kept token, from the same decodes as the text
        return DecodeEvent(tokens[:kept], flags[:kept], self.text.delta(final=done), stats.copy(),
                           done, pieces)

    def cancelled(self) -> DecodeEvent:
        self.stats.finish_reason = "cancelled"
        self.stats.other_cpu_share = self.others.share_if_measurable()
        return DecodeEvent([], [], self.text.delta(final=True), self.stats.copy(), True, [])

    def prefill(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Reset the target and run it over the prompt: (1, V) last logits, features or None."""
        self.others = OtherCpuUse()  # how busy the machine is while this decode is timed
        self.start = time.perf_counter()
        self.target.reset()
        return self.target_forward(self.context, 1)

    def first(self, logits: torch.Tensor, features: torch.Tensor | None) -> DecodeEvent:
        """After the prefill: the drafter told of the prompt, the first new token chosen."""
        if features is not None:
            self.drafter.observe(features)  # features of every prompt position, chunks joined
        if isinstance(self.drafter, CatchesUp):  # draft models: catch-up widths
            self.drafter.begin(len(self.context), _longest_draft(self.policy))
        first = choose(self.probs_at(logits[-1], self.context), self.params, self.generator)
        self.stats.prefill_s = time.perf_counter() - self.start
        return self.emit([first], [False])

    def prime(self) -> None:
        """After the first token is out: a drafter that primes feeds itself the prompt's
        features now, timed as drafting. Left to its first draft, that draft would cost the
        whole prompt and ``auto`` would take it for what a draft costs (on a 2-core CPU 4-7 ms
        a token where later ones cost 1 ms)."""
        if self.layers and isinstance(self.drafter, Primes) and self.stats.finish_reason is None:
            t0 = time.perf_counter()
            self.drafter.prime(self.context)
            self.stats.draft_s += time.perf_counter() - t0

    def propose(self, room: int) -> _Draft:
        """This round's draft: prompt lookup's (a stacked drafter), else a tree, else a chain of
        up to ``room`` tokens (k = 0 without a drafter: a plain step)."""
        source = "learned" if self.stacked else None  # the policy's name for this round's source
        # a tree round for the learned drafter? Under auto only where it may beat the chain's
        # (or a plain step's) expected rate (TreeOrChain)
        use_tree = self.shape_choice is not None and room > 0 and self.shape_choice.use_tree(
            *_tree_rivals(self.policy, self.tree, source))
        draft = None
        if room > 0 and (self.stacked or self.tree is not None):
            draft = self.lookup(room, use_tree)
        if draft is None and use_tree:
            return _Draft(tree=self.drafter.propose_tree(self.context, self.tree), source=source)
        return draft or self.chain(room, source)

    def lookup(self, room: int, use_tree: bool) -> _Draft | None:
        """Prompt lookup's proposal of a stacked drafter when it is taken, else None: weighed by
        a per-source policy against the learned drafter's best (or the tree's rate), else by the
        stacked drafter's own rule (``CombinedDrafter.prefers``)."""
        drafter, policy, context = self.drafter, self.policy, self.context
        if not self.is_stack:
            return None
        if not self.stacked:  # a stacked drafter's own rule
            k = min(policy.choose(None), room)
            found = drafter.lookup(context, k, self.params, self.generator)
            if drafter.prefers(found, k):
                proposal = drafter.use(found)
                return _Draft(proposal, len(proposal.ids))
            return None
        found = drafter.lookup(context, min(policy.max_k, room), self.params, self.generator)
        m = policy.limit(len(found.ids), "lookup") if found is not None else 0
        if m <= 0:
            return None
        rival = policy.best("learned")[1]
        if use_tree:
            rival = self.shape_choice.rate or rival
        if policy.expected_rate(m, "lookup") >= rival:
            probs = found.probs[:m] if found.probs is not None else None
            return _Draft(drafter.use(Proposal(found.ids[:m], probs, found.source)), m, "lookup")
        return None

    def chain(self, room: int, source: str | None) -> _Draft:
        """A chain of the k the policy chooses (within ``room``); no proposal when k = 0."""
        drafter, policy = self.drafter, self.policy
        k = min(policy.choose(source), room) if drafter else 0
        if k <= 0:
            return _Draft(None, k, source)
        propose = drafter.propose_learned if self.stacked else drafter.propose
        if not self.asks:
            return _Draft(propose(self.context, k, self.params, self.generator), k, source)
        k = policy.draft_budget(k, room)
        return _Draft(propose(self.context, k, self.params, self.generator,
                              keep_going=_asker(policy, k, source)), k, source)

    def verify_chain(self, draft: _Draft, t0: float) -> _Verified:
        """One target forward over [last token, drafts]: the kept prefix and the next token (the
        speculative-sampling rule; greedy: the argmaxes); the caches rolled back past it."""
        proposal, context, params = draft.proposal, self.context, self.params
        confidence = proposal.confidence if proposal else None
        drafts = (proposal.ids[:self.policy.limit(min(draft.k, len(proposal.ids)), draft.source,
                                                  confidence)] if proposal else [])
        _sync(self.device)
        t1 = time.perf_counter()
        logits, features = self.target_forward([context[-1]] + drafts, len(drafts) + 1)
        if params.greedy:  # only the argmaxes leave the device, in one transfer
            n_accepted, next_token = verify_greedy(drafts, self.greedy_ids(logits, drafts))
        else:
            target_probs = torch.stack([self.probs_at(logits[i], context + drafts[:i])
                                        for i in range(len(drafts) + 1)])  # (k+1, V)
            q = (proposal.probs[:len(drafts)].cpu() if proposal and proposal.probs is not None
                 else None)
            n_accepted, next_token = verify(drafts, q, target_probs, params, self.generator)
        self.target.rollback(len(context) + n_accepted)  # keep last token + accepted drafts
        if features is not None:  # the same positions the target keeps
            self.drafter.observe(features[:n_accepted + 1])
        _sync(self.device)
        return _Verified(drafts, n_accepted, next_token, (t0, t1, time.perf_counter()), draft)

    def verify_tree(self, draft: _Draft, t0: float) -> _Verified:
        """One tree-attention forward over the draft tree: the longest branch the target's
        greedy choices follow, its KV rows kept (``verify_tree_greedy``)."""
        tree, context = draft.tree, self.context
        _sync(self.device)
        t1 = time.perf_counter()
        depth, anc = tree.rows()
        logits, features = self.target.forward_tree([context[-1]] + tree.ids, depth, anc,
                                                    self.layers)
        rows, next_token = verify_tree_greedy(tree, _argmax_rows(logits.float()))
        self.target.keep_rows(len(context) - 1, [0] + rows)
        if features is not None:
            self.drafter.observe(features[[0] + rows])
        _sync(self.device)
        accepted = [tree.ids[r - 1] for r in rows]
        return _Verified(accepted, len(rows), next_token, (t0, t1, time.perf_counter()), draft)

    def settle(self, v: _Verified) -> DecodeEvent:
        """The round's bookkeeping, one for every kind: timings, what the policy (or the tree's
        chooser) and the drafter learn, the tokens emitted, the round's counters."""
        stats, drafter, draft = self.stats, self.drafter, v.draft
        t0, t1, t2 = v.times
        stats.draft_s += t1 - t0
        stats.verify_s += t2 - t1
        proposal = draft.proposal
        if draft.tree is not None:
            self.shape_choice.record(v.n_accepted + 1, t2 - t0)
        elif drafter:
            confidence = proposal.confidence if proposal else None
            self.policy.update(len(v.drafts) + 1, t2 - t1, len(v.drafts), v.n_accepted, t1 - t0,
                               draft.source,
                               confidence=confidence[:len(v.drafts)] if confidence else None,
                               n_proposed=len(proposal.ids) if proposal else 0,
                               backlog=proposal is not None and self.last_source != draft.source)
        self.last_source = draft.source if proposal is not None and draft.tree is None else _NONE
        if drafter:
            drafter.feedback(v.n_accepted)
        event = self.emit(v.drafts[:v.n_accepted] + [v.next_token],
                          [True] * v.n_accepted + [False])
        # Drafts after a stop point (EOS, stop string, length) count neither way.
        if draft.tree is not None:
            stats.record_tree_round(len(draft.tree.ids), self.tree.depth, v.n_accepted,
                                    len(event.token_ids), draft.tree.source)
        else:
            stats.record_round(len(v.drafts), v.n_accepted, len(event.token_ids),
                               proposal.source if proposal else None)
        stats.extra_memory_bytes = drafter.extra_memory_bytes if drafter else 0
        event.stats = stats.copy()
        return event


_NO_IDS = torch.empty(0, dtype=torch.long)
_NONE = object()  # _Decoding.last_source when the round before drafted no chain


def _argmax_rows(rows: torch.Tensor) -> list[int]:
    """Argmax of each row of (n, V) float32 logits, on the host: through numpy on a CPU (22 us
    for 5 x 49,152 logits where torch's argmax took 360 us on a 2-core Xeon), the first of
    equal maxima as torch's."""
    if read_on_host(rows):
        return rows.detach().numpy().argmax(-1).tolist()
    return rows.argmax(-1).tolist()


def tree_unusable_reason(drafter, target, params: SamplingParams) -> str | None:
    """Why ``decode`` cannot verify draft-tree rounds here (see its ``tree``), or None."""
    if drafter is None:
        return "no drafter"
    if not params.greedy:
        return "sampling keeps the chain (trees are verified greedily only)"
    if params.repetition_penalty != 1.0:
        return "a repetition penalty keeps the chain"
    if not (isinstance(drafter, TreeDrafter) and drafter.drafts_trees):
        return f"the drafter {drafter.name} drafts chains only (trees: EAGLE-3)"
    if not isinstance(target, TreeTarget):
        backend = getattr(target, "backend", None) or type(target).__name__
        return f"the target's {backend} forward has no tree attention"
    return None


def _tree_rivals(policy, tree: TreeShape, source: str | None) -> tuple[float | None, float | None]:
    """(rival, bound) for ``TreeOrChain.use_tree``: under a cost-model policy (``auto``) the
    best expected tokens per second of its own choice (a chain of k, or a plain step) and the
    tree's best case; (None, None) under a fixed draft length (the tree, as asked)."""
    if not isinstance(policy, CostModelPolicy):
        return None, None
    return policy.best(source)[1], policy.tree_rate_bound(tree.size, tree.depth, source)


def _longest_draft(policy) -> int:
    """The longest draft the decode may ask for: ``max_k`` of a cost model, else k, else 1."""
    if isinstance(policy, CostModelPolicy):
        return policy.max_k
    return policy.k if isinstance(policy, FixedLength) else 1


def _asker(policy, k: int, source: str | None) -> KeepGoing:
    """``keep_going(confidence) -> bool`` for a drafter that stops early: ``policy.more``."""
    return lambda confidence: policy.more(confidence, k, source)


def collect(events: Iterator[DecodeEvent]) -> DecodeResult:
    """Run a decode's events to the end and join them into one result."""
    ids: list[int] = []
    flags: list[bool] = []
    pieces: list[str] = []
    n = 0
    for event in events:
        ids += event.token_ids
        flags += event.from_draft
        pieces.append(event.text)
        n += 1
    return DecodeResult("".join(pieces), ids, flags, event.stats, n)


def generate(target: TargetKV, prompt_ids: list[int], tokenizer, **kwargs) -> DecodeResult:
    """:func:`decode` run to the end (same arguments)."""
    return collect(decode(target, prompt_ids, tokenizer, **kwargs))
