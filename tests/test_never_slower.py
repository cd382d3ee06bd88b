"""Draft length ``auto`` never makes speculative decoding slower than plain decoding, for every
kind of drafter: where verifying costs more than it can gain it drafts nothing (k = 0, a plain
step, with rare probes), where verifying is cheap it drafts. The target's forwards take time on a
fake clock (``_TimedKV``), so the figures are the same however busy the machine is: nothing here
reads a real clock."""

import pytest

from specdemo.core import engine
from specdemo.core.drafters.base import Proposal
from specdemo.core.drafters.combined import CombinedDrafter
from specdemo.core.drafters.draft_model import ModelDrafter
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.core.policy import PROBE_BUDGET, AdaptiveDraftLength
from tiny import CharTokenizer, tiny_llama

PROMPT = CharTokenizer().encode("speculative decoding, made visible")
STEP_S = 0.010  # a one-token forward on the fake clock
N = 96  # new tokens


class _Clock:
    """A fake ``time`` for the engine: seconds pass only where a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _TimedKV(KVModel):
    """A target whose forward over n tokens takes STEP_S * (1 + extra * (n - 1)) on ``clock``:
    ``extra`` is what each further token costs in one-token forwards."""

    def __init__(self, model, clock: _Clock, extra: float) -> None:
        super().__init__(model)
        self.clock, self.extra = clock, extra

    def _run(self, ids, keep, layers):
        self.clock.now += self.seconds(len(ids))
        return super()._run(ids, keep, layers)

    def seconds(self, n: int) -> float:
        return STEP_S * (1 + self.extra * (n - 1))


class _Oracle:
    """A learned drafter stand-in that knows the target's greedy answer: it proposes it (or,
    while ``wrong(position)``, a token the target never picks there), at ``draft_s`` a token."""

    feature_layers = ()
    extra_memory_bytes = 0

    def __init__(self, answer: list[int], clock: _Clock, draft_s: float = 0.001,
                 wrong=lambda position: False, name: str = "oracle") -> None:
        self.answer, self.clock, self.draft_s, self.wrong, self.name = (answer, clock, draft_s,
                                                                         wrong, name)
        self.proposed = 0

    def propose(self, context, k, params, generator):
        self.clock.now += self.draft_s * k
        start = len(context) - len(PROMPT)
        ids = [t if not self.wrong(start + i) else (t + 1) % 32
               for i, t in enumerate(self.answer[start:start + k])]
        self.proposed += len(ids)
        return Proposal(ids, source=self.name)

    def feedback(self, n_accepted):
        pass


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=2)


@pytest.fixture(scope="module")
def answer(target):
    return generate(KVModel(target), PROMPT, CharTokenizer(), max_new_tokens=N).token_ids


def drafter_of(kind: str, target, answer, clock, **kw):
    """A learned drafter (the oracle), prompt lookup stacked over it, or a draft model (the
    target itself: always right, its drafting free on the fake clock)."""
    if kind == "learned":
        return _Oracle(answer, clock, **kw)
    if kind == "stacked":  # prompt lookup stacked over the learned drafter
        return CombinedDrafter(_Oracle(answer, clock, **kw), name="oracle+ngram")
    return ModelDrafter(target, 32, name="self", shares_weights=True)  # a draft model


def race(target, answer, kind: str, extra: float, monkeypatch, **kw):
    """(plain, speculative) results with ``auto`` seeded with the fake forward costs."""
    clock = _Clock()
    monkeypatch.setattr(engine, "time", clock)
    kv = _TimedKV(target, clock, extra)
    plain = generate(kv, PROMPT, CharTokenizer(), max_new_tokens=N)
    policy = AdaptiveDraftLength(forward_s={n: kv.seconds(n) for n in range(1, 18)})
    spec = generate(kv, PROMPT, CharTokenizer(), drafter=drafter_of(kind, target, answer, clock, **kw),
                    policy=policy, max_new_tokens=N)
    assert spec.token_ids == plain.token_ids == answer
    return plain.stats, spec.stats


@pytest.mark.parametrize("kind,wrong", [("learned", False), ("learned", True),
                                        ("stacked", False), ("stacked", True),
                                        ("draft model", False)])
def test_no_drafting_where_verification_costs_more_than_it_can_gain(target, answer, kind, wrong,
                                                                    monkeypatch):
    """Each further token in a forward costs 1.2 one-token forwards: no draft pays, not even one
    that is always accepted (k + 1 tokens for 1 + 1.2 k steps). Drafting drops to zero but for
    probes, and the speculative lane costs at most the probes' budget more than plain, also when
    every probe is refused (``wrong``: before, probes after 8, 16, 32 and 64 plain steps cost it
    4% here)."""
    plain, spec = race(target, answer, kind, 1.2, monkeypatch,
                       **({"wrong": lambda position: True} if wrong else {}))
    probes = spec.position_drafted[0] if spec.position_drafted else 0  # rounds that drafted
    assert probes <= 4, (probes, spec.draft_length_sum)  # back-off: rounds 8+, 16+, 32+, 64+
    assert spec.draft_length_max <= 1  # a probe is the cheapest draft: one token
    plain_s = plain.elapsed_s - plain.prefill_s
    spec_s = spec.elapsed_s - spec.prefill_s
    assert spec_s <= plain_s * (1 + 2 * PROBE_BUDGET), (spec_s, plain_s)


@pytest.mark.parametrize("kind", ["learned", "stacked", "draft model"])
def test_drafting_where_verification_is_cheap(target, answer, kind, monkeypatch):
    """A forward over any width costs one step (a GPU): the always-right drafter drafts long."""
    plain, spec = race(target, answer, kind, 0.0, monkeypatch)
    assert spec.mean_draft_length > 4 and spec.target_forwards < plain.target_forwards / 4
    assert spec.elapsed_s - spec.prefill_s < (plain.elapsed_s - plain.prefill_s) / 2


def test_drafting_comes_back_when_the_drafter_becomes_right_again(target, answer, monkeypatch):
    """Wrong for the first 24 tokens, right afterwards; a further token costs 0.3 steps. Auto
    stops drafting while it is wrong, probes, and drafts again once probes are accepted."""
    plain, spec = race(target, answer, "learned", 0.3, monkeypatch,
                       wrong=lambda position: position < 24)
    per_position = spec.per_position_acceptance
    assert spec.draft_length_max >= 2 and spec.accepted >= 30, (spec.accepted, per_position)
    assert spec.elapsed_s - spec.prefill_s < plain.elapsed_s - plain.prefill_s


def test_probes_are_spaced_by_their_expected_loss():
    """A probe that costs a step more than it is expected to gain waits 1 / PROBE_BUDGET plain
    steps; where a wider forward costs the same as a one-token one, the back-off's 8."""
    dear = AdaptiveDraftLength(forward_s={1: 1.0, 2: 2.0})
    for _ in range(20):  # nothing accepted: the expected tokens of a probe fall towards 1
        dear.update(2, 2.0, 1, 0, 0.0)
    assert dear.best()[0] == 0
    loss = dear.round_s(1) - dear.expected_tokens(1) * 1.0
    assert loss == pytest.approx(1.0, abs=0.05)
    assert dear.probe_wait(1) == pytest.approx(loss / PROBE_BUDGET, abs=1)
    flat = AdaptiveDraftLength(forward_s={n: 1.0 for n in range(1, 18)})
    for _ in range(20):
        flat.update(2, 1.0, 1, 0, 0.0)
    assert flat.probe_wait(1) == 8
