"""The drafter's confidence in its tokens: what DraftSampler records, and the engine verifying
only what the confidence says is worth it (policy.AdaptiveDraftLength.more / limit), losslessly."""

import pytest
import torch

from specdemo.core import engine
from specdemo.core.drafters.base import DraftSampler, Proposal
from specdemo.core.engine import generate
from specdemo.core.policy import AdaptiveDraftLength
from specdemo.core.sampling import SamplingParams
from tiny import CharTokenizer, FakeClock, TimedKV, tiny_llama


def test_greedy_confidence_is_the_top_probability():
    logits = torch.tensor([0.0, 2.0, 1.0, -1.0])
    sampler = DraftSampler([1], SamplingParams(), None)
    token = sampler.draw(logits)
    assert int(token) == 1
    assert sampler.last_confidence() == pytest.approx(float(torch.softmax(logits, -1)[1]))
    p = sampler.proposal("x")
    assert p.confidence == pytest.approx([float(torch.softmax(logits, -1).max())])
    assert p.probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]  # q stays one-hot


def test_greedy_confidence_over_a_draft_vocabulary():
    logits = torch.tensor([3.0, 0.0, 1.0])  # over target ids 2, 5, 7
    sampler = DraftSampler([1], SamplingParams(), None)
    token = sampler.draw_subset(logits, torch.tensor([2, 5, 7]), 9, increasing=True)
    assert int(token) == 2
    assert sampler.last_confidence() == pytest.approx(float(torch.softmax(logits, -1)[0]))


def test_sampled_confidence_is_q_of_the_token_drawn():
    logits = torch.tensor([0.0, 1.0, 2.0, 0.5])
    params = SamplingParams(temperature=0.8, seed=1)
    sampler = DraftSampler([1], params, torch.Generator().manual_seed(4))
    token = int(sampler.draw(logits))
    q = sampler.proposal("x").probs[0]
    assert sampler.last_confidence() == pytest.approx(float(q[token]))


class _Oracle:
    """Proposes the plain decode's continuation for ``right`` tokens, sure of them (0.99), then
    wrong tokens it is unsure of (0.02), one at a time, asking ``keep_going`` as EAGLE-3 does."""

    name = "oracle"
    feature_layers = ()
    stops_early = True
    extra_memory_bytes = 0

    def __init__(self, plain_ids, prompt_len, right=2):
        self.plain, self.prompt_len, self.right = plain_ids, prompt_len, right
        self.drafted = []

    def propose(self, context, k, params, generator, keep_going=None):
        done = len(context) - self.prompt_len
        ids, conf = [], []
        for j in range(k):
            truth = self.plain[done + j] if done + j < len(self.plain) else 0
            sure = j < self.right
            ids.append(truth if sure else (truth + 1) % 32)
            conf.append(0.99 if sure else 0.02)
            if j + 1 < k and keep_going is not None and not keep_going(list(conf)):
                break
        self.drafted.append(len(ids))
        return Proposal(ids, source="oracle", confidence=conf)

    def feedback(self, n_accepted):
        pass


def test_engine_verifies_the_sure_tokens_and_stays_lossless(monkeypatch):
    # forward times on a fake clock: on the real one a busy machine's noise made wide forwards
    # look as cheap as narrow ones, and the drafter was let on past its doubtful token
    clock = FakeClock()
    monkeypatch.setattr(engine, "time", clock)
    costs = {n: 0.010 + 0.001 * n for n in range(1, 18)}
    target = tiny_llama(seed=5, layers=2)
    tok, kv = CharTokenizer(), TimedKV(target, clock, lambda n: costs[min(n, max(costs))])
    prompt = tok.encode("made visible")
    plain = generate(kv, prompt, tok, max_new_tokens=40)
    drafter = _Oracle(plain.token_ids[1:], len(prompt) + 1)
    spec = generate(kv, prompt, tok, drafter=drafter,
                    policy=AdaptiveDraftLength(forward_s=costs, use_confidence=True),
                    max_new_tokens=40)
    assert spec.token_ids == plain.token_ids
    s = spec.stats
    assert s.drafted > 0
    # after the first rounds teach the calibration, the unsure third token is not verified
    assert s.accepted / s.drafted > 0.8, (s.drafted, s.accepted)
    assert max(drafter.drafted) <= 4  # it stopped drafting at the first doubtful token
