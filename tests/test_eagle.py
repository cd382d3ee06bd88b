"""EAGLE-3 heads: lossless in the engine, rollback, both folder layouts, load-time checks."""

import json

import pytest
import torch

from specdemo.core.drafters import eagle_io
from specdemo.core.drafters.eagle import Eagle3Drafter
from specdemo.models.learned import DrafterRefused, eagle3_problems, load_learned
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.models.loading import LoadedModel
from specdemo.core.policy import FixedDraftLength, make_policy
from specdemo.core.sampling import SamplingParams
from tiny import CharTokenizer, tiny_eagle, tiny_llama

PROMPT = CharTokenizer().encode("speculative decoding, made visible")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=4)


def loaded(target) -> LoadedModel:
    return LoadedModel("tiny-llama", target, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")


@pytest.mark.parametrize("k", [1, 3, 6, "auto", "auto-confidence"])
@pytest.mark.parametrize("draft_vocab", [None, 20])
def test_greedy_equals_plain(target, k, draft_vocab):
    kv = KVModel(target)
    plain = generate(kv, PROMPT, CharTokenizer(), max_new_tokens=48)
    head = tiny_eagle(target, draft_vocab, seed=1)
    if k == "auto-confidence":  # drafting stops early on the head's confidence (policy.more)
        from specdemo.core.policy import AdaptiveDraftLength
        policy = AdaptiveDraftLength(forward_s={n: 1.0 for n in range(1, 18)}, use_confidence=True)
    else:
        policy = make_policy(k, {n: 1.0 for n in range(1, 18)}) if k == "auto" else FixedDraftLength(k)
    spec = generate(kv, PROMPT, CharTokenizer(), drafter=Eagle3Drafter(head, 32), policy=policy,
                    max_new_tokens=48)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > 0 and spec.stats.extra_memory_bytes > 0


def test_features_are_the_requested_hidden_states(target):
    kv = KVModel(target)
    logits, feats = kv.forward_features(PROMPT, 1, (0, 2, 4))
    with torch.no_grad():
        full = target(torch.tensor([PROMPT]), output_hidden_states=True)
    expected = torch.cat([full.hidden_states[i][0] for i in (0, 2, 4)], dim=-1)
    assert feats.shape == (len(PROMPT), 3 * 32)
    assert torch.allclose(feats, expected, atol=1e-5)
    assert torch.allclose(logits[-1], full.logits[0, -1], atol=1e-5)


def _scratch_proposal(head, target, context, k):
    """A fresh drafter fed the features of the whole context at once (no rollback involved)."""
    kv = KVModel(target)
    _, feats = kv.forward_features(context[:-1], 1, head.feature_layers)
    drafter = Eagle3Drafter(head, 32)
    drafter.observe(feats)
    return drafter.propose(context, k, SamplingParams(), None).ids


def test_rollback_matches_a_drafter_recomputed_from_scratch(target):
    """Drive a drafter through rounds with rejections; each proposal must equal the proposal of
    a drafter built from scratch on the same context."""
    head = tiny_eagle(target, seed=2)
    kv = KVModel(target)
    drafter = Eagle3Drafter(head, 32)
    context = list(PROMPT)
    _, feats = kv.forward_features(context, 1, head.feature_layers)
    drafter.observe(feats)
    context.append(7)
    rejected = 0
    for round_ in range(6):
        proposal = drafter.propose(context, 4, SamplingParams(), None).ids
        assert proposal == _scratch_proposal(head, target, context, 4), round_
        n_acc = round_ % 3  # 0, 1 or 2 accepted: the rest rejected
        rejected += 4 - n_acc
        _, feats = kv.forward_features([context[-1]] + proposal, 1, head.feature_layers)
        kv.rollback(len(context) + n_acc)
        drafter.observe(feats[:n_acc + 1])
        context += proposal[:n_acc] + [(proposal[n_acc] + 1) % 32]
    assert rejected > 0


def test_a_primed_drafter_proposes_as_an_unprimed_one(target):
    """``prime`` feeds the prompt's features after the first token (``base.Primes``): the
    first proposal is then the one an unprimed drafter makes, and a second
    prime or a proposal without new features after the primed one is refused as before."""
    head = tiny_eagle(target, seed=2)
    context = list(PROMPT) + [7]
    _, feats = KVModel(target).forward_features(list(PROMPT), 1, head.feature_layers)
    primed = Eagle3Drafter(head, 32)
    primed.observe(feats)
    primed.prime(context)
    primed.prime(context)  # nothing pending: nothing happens
    assert primed.propose(context, 4, SamplingParams(), None).ids == \
        _scratch_proposal(head, target, context, 4)
    with pytest.raises(RuntimeError, match="no new target features"):
        primed.propose(context, 4, SamplingParams(), None)


@pytest.mark.parametrize("layout", ["speculators", "safeailab"])
def test_saved_head_loads_back_with_the_same_proposals(target, tmp_path, layout):
    head = tiny_eagle(target, 20, seed=4)
    folder = eagle_io.save_head(head, tmp_path / "head", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    if layout == "safeailab":  # rewrite into SafeAILab's layout: flat config, midlayer.* weights
        from safetensors.torch import load_file, save_file
        state = {k.replace("layers.0.", "midlayer.", 1): v
                 for k, v in load_file(str(folder / "model.safetensors")).items()}
        save_file(state, str(folder / "model.safetensors"))
        flat = {**config["transformer_layer_config"], "architectures": ["LlamaForCausalLMEagle3"],
                "draft_vocab_size": 20,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": config["eagle_aux_hidden_state_layer_ids"]}}
        (folder / "config.json").write_text(json.dumps(flat))
    else:
        assert config["speculators_model_type"] == "eagle3"
        assert config["speculators_config"]["verifier"]["name_or_path"] == "tiny-llama"
        assert set(load_file_keys(folder)) >= {"fc.weight", "layers.0.self_attn.q_proj.weight",
                                               "norm.weight", "lm_head.weight", "d2t", "t2d"}
    back = load_learned(str(folder), loaded(target))
    assert back.info["layout"] == layout
    context = PROMPT + [5]
    assert _scratch_proposal(back.new_drafter(target, 32, "x").head, target, context, 5) == \
        _scratch_proposal(head, target, context, 5)


def load_file_keys(folder):
    from safetensors.torch import load_file
    return load_file(str(folder / "model.safetensors")).keys()


def test_refusals_name_the_problem(target, tmp_path):
    deep = tiny_eagle(target, seed=5, layers=(2, 6, 9))
    folder = eagle_io.save_head(deep, tmp_path / "deep")
    with pytest.raises(DrafterRefused, match="only 4 layers"):
        load_learned(str(folder), loaded(target))
    small = tiny_eagle(target, 20, seed=5)
    folder = eagle_io.save_head(small, tmp_path / "nomap")
    from safetensors.torch import load_file, save_file
    state = load_file(str(folder / "model.safetensors"))
    del state["d2t"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(DrafterRefused, match="no d2t map"):
        load_learned(str(folder), loaded(target))
    ok = tiny_eagle(target, 20, seed=5)
    assert eagle3_problems(ok, {"missing": []}, loaded(target))[0] == []


def test_combined_drafter_is_lossless_and_counts_per_source(target):
    """ngram stacked over an EAGLE-3 head: same tokens as plain, stats split by source."""
    from specdemo.core.drafters.combined import CombinedDrafter
    tok = CharTokenizer()
    prompt = tok.encode("abc abc abc abc abc abc abc abc ") + PROMPT
    kv = KVModel(target)
    plain = generate(kv, prompt, tok, max_new_tokens=48)
    drafter = CombinedDrafter(Eagle3Drafter(tiny_eagle(target, seed=6), 32), name="eagle3+ngram")
    spec = generate(kv, prompt, tok, drafter=drafter, policy=FixedDraftLength(4), max_new_tokens=48)
    assert spec.token_ids == plain.token_ids
    s = spec.stats
    assert sum(s.drafted_by.values()) == s.drafted and sum(s.accepted_by.values()) == s.accepted
    assert set(s.drafted_by) <= {"ngram", "eagle3"} and "eagle3" in s.drafted_by


class _Wrong:
    """A learned drafter that always proposes token 0 (never what the target picks)."""

    name = "wrong"
    feature_layers = ()

    def __init__(self):
        self.calls = 0

    def propose(self, context, k, params, generator):
        from specdemo.core.drafters.base import Proposal
        self.calls += 1
        return Proposal([0] * k, source="wrong")

    def feedback(self, n_accepted):
        pass

    extra_memory_bytes = 0


class _Clock:
    """A fake ``time`` for the engine: seconds pass only where a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _SlowWrong(_Wrong):
    """Wrong and dear: 20 ms a drafted token, ten target forwards' worth (on ``clock``)."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.clock = clock

    def propose(self, context, k, params, generator):
        self.clock.now += 0.02 * k
        return super().propose(context, k, params, generator)


class _TimedKV(KVModel):
    """A target whose forwards take 2 ms + 0.2 ms a token on ``clock``."""

    def __init__(self, model, clock: _Clock) -> None:
        super().__init__(model)
        self.clock = clock

    def _run(self, ids, keep, layers):
        self.clock.now += 0.002 + 0.0002 * len(ids)
        return super()._run(ids, keep, layers)


def test_auto_weighs_prompt_lookup_apart_from_a_dear_learned_drafter(target, monkeypatch):
    """Under auto, prompt lookup's drafts are judged at their own cost and acceptance: a learned
    drafter that accepts nothing at 20 ms a token must not stop free lookup drafts that are
    accepted (on an AVX2 CPU, head + ngram on auto drafted almost nothing where ngram alone ran
    at 1.20x). Lossless either way."""
    from specdemo.core.drafters.combined import CombinedDrafter
    from specdemo.core.policy import AdaptiveDraftLength
    from specdemo.core import engine
    clock = _Clock()  # the engine's clock: the same figures however busy the machine is
    monkeypatch.setattr(engine, "time", clock)
    tok, kv = CharTokenizer(), _TimedKV(target, clock)
    plain = generate(kv, PROMPT, tok, max_new_tokens=96)  # falls into a greedy loop
    learned = _SlowWrong(clock)
    policy = AdaptiveDraftLength(forward_s={n: 0.002 + 0.0002 * n for n in range(1, 18)})
    spec = generate(kv, PROMPT, tok, drafter=CombinedDrafter(learned, name="wrong+ngram"),
                    policy=policy, max_new_tokens=96)
    assert spec.token_ids == plain.token_ids
    s = spec.stats
    assert s.accepted_by.get("ngram", 0) >= 32, (s.drafted_by, s.accepted_by)  # before: 0 of 0
    assert learned.calls <= 3  # asked only where prompt lookup had nothing, if at all
    assert policy.sources["lookup"].draft_token_s < 0.001  # a lookup, not a model


def test_combined_drafter_lets_short_matches_through_once_the_learned_drafter_fails():
    """Stacked over a learned drafter that accepts nothing (a small head on Chinese), prompt
    lookup's two-token matches are used, not only the three-token ones."""
    from specdemo.core.drafters.combined import CombinedDrafter
    from specdemo.core.sampling import SamplingParams
    learned = _Wrong()
    drafter = CombinedDrafter(learned, min_match=3)
    context = [5, 6, 7, 8, 9, 5, 6]  # the suffix [5, 6] occurred before: a 2-token match only
    first = drafter.propose(context, 4, SamplingParams(), None)
    assert first.source == "wrong" and learned.calls == 1  # the learned drafter is trusted first
    sources = []
    for _ in range(6):  # it fails: 0 accepted each round, until prompt lookup takes over
        drafter.feedback(0)
        later = drafter.propose(context, 4, SamplingParams(), None)
        sources.append(later.source)
        if later.source == "ngram":
            break
    # running acceptance 0.5 -> 0.4 -> 0.32 -> 0.256: the third failure leaves it under half of
    # prompt lookup's 0.6, and the two-token match [5, 6] -> 7, 8, 9 is proposed
    assert sources == ["wrong", "wrong", "ngram"]
    assert later.ids[:3] == [7, 8, 9]
