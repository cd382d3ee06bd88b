"""MTP drafters: Gemma 4 assistants (reading the target's keys/values) and native MTP layers
(``--draft mtp``): lossless in the engine, rollback, loading, refusals with reasons."""

import json
from pathlib import Path

import pytest
import torch

from specdemo.checks.compat import learned_verdict
from specdemo.models.learned import DrafterRefused, load_learned
from specdemo.core.drafters.mtp import Gemma4AssistantDrafter, NativeMtpDrafter
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.models.loading import LoadedModel
from specdemo.core.policy import FixedDraftLength, make_policy
from specdemo.core.sampling import SamplingParams
from tiny import (CharTokenizer, tiny_gemma4, tiny_gemma4_assistant, tiny_llama,
                  tiny_mtp_target)

PROMPT = CharTokenizer().encode("speculative decoding, made visible")


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma4(seed=1)


@pytest.fixture(scope="module")
def glm():
    return tiny_mtp_target(seed=2)


def loaded(model, spec="tiny") -> LoadedModel:
    return LoadedModel(spec, model, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")


def _policy(k):
    return make_policy(k, {n: 1.0 for n in range(1, 18)}) if k == "auto" else FixedDraftLength(k)


def _drive_with_rejections(target, make, rounds=6, k=4):
    """Drive a drafter through rounds with 0, 1 or 2 accepted tokens; each proposal must equal
    that of a fresh drafter fed the whole context at once (no rollback involved)."""
    drafter, kv, context = make(), KVModel(target), list(PROMPT)
    _, feats = kv.forward_features(context, 1, drafter.feature_layers)
    drafter.observe(feats)
    context.append(7)
    for round_ in range(rounds):
        proposal = drafter.propose(context, k, SamplingParams(), None).ids
        fresh = make()
        _, whole = KVModel(target).forward_features(context[:-1], 1, fresh.feature_layers)
        fresh.observe(whole)
        assert proposal == fresh.propose(context, k, SamplingParams(), None).ids, round_
        n_acc = round_ % 3
        _, feats = kv.forward_features([context[-1]] + proposal, 1, drafter.feature_layers)
        kv.rollback(len(context) + n_acc)
        drafter.observe(feats[:n_acc + 1])
        context += proposal[:n_acc] + [(proposal[n_acc] + 1) % 32]


# --- Gemma 4 assistants -----------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 3, "auto"])
def test_gemma4_assistant_greedy_equals_plain(gemma, k):
    kv = KVModel(gemma)
    plain = generate(kv, PROMPT, CharTokenizer(), max_new_tokens=40)
    drafter = Gemma4AssistantDrafter(tiny_gemma4_assistant(gemma, seed=3), gemma, 32)
    spec = generate(kv, PROMPT, CharTokenizer(), drafter=drafter, policy=_policy(k),
                    max_new_tokens=40)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > 0 and spec.stats.extra_memory_bytes > 0


def test_store_keys_values_equal_the_targets_own(gemma):
    """The keys/values recomputed from the store layers' inputs are the ones transformers hands
    its assistant (``return_shared_kv_states``)."""
    drafter = Gemma4AssistantDrafter(tiny_gemma4_assistant(gemma), gemma, 32)
    assert drafter.feature_layers == (0, 1, 4)  # inputs of the store layers, then the last state
    with torch.no_grad():
        out = gemma(torch.tensor([PROMPT]), output_hidden_states=True,
                    return_shared_kv_states=True, use_cache=True)
    drafter.observe(torch.cat([out.hidden_states[i][0] for i in drafter.feature_layers], -1))
    for kind in ("sliding_attention", "full_attention"):
        for ours, theirs in zip(drafter._kv[kind], out.shared_kv_states[kind]):
            assert torch.allclose(ours, theirs, atol=1e-6), kind


def test_gemma4_rollback_matches_a_drafter_recomputed_from_scratch(gemma):
    assistant = tiny_gemma4_assistant(gemma, seed=4, scale=8.0)
    _drive_with_rejections(gemma, lambda: Gemma4AssistantDrafter(assistant, gemma, 32))


def test_gemma4_assistant_folder_loads_back_with_the_same_proposals(gemma, tmp_path):
    assistant = tiny_gemma4_assistant(gemma, seed=5, scale=8.0)
    assistant.save_pretrained(tmp_path / "assistant")
    back = load_learned(str(tmp_path / "assistant"), loaded(gemma))
    assert back.summary.startswith("Gemma 4 assistant (2 layers)")
    context = PROMPT + [5]

    def proposal(model):
        drafter = Gemma4AssistantDrafter(model, gemma, 32)
        _, feats = KVModel(gemma).forward_features(context[:-1], 1, drafter.feature_layers)
        drafter.observe(feats)
        return drafter.propose(context, 4, SamplingParams(), None).ids
    assert proposal(back.model) == proposal(assistant)


def test_gemma4_assistant_refusals(gemma, tmp_path):
    tiny_gemma4_assistant(gemma).save_pretrained(tmp_path / "ok")
    with pytest.raises(DrafterRefused, match="reads the keys/values of a Gemma 4 target; .* is a llama"):
        load_learned(str(tmp_path / "ok"), loaded(tiny_llama()))
    wide = tiny_gemma4(hidden=48)
    tiny_gemma4_assistant(wide).save_pretrained(tmp_path / "wide")
    verdict = learned_verdict("tiny-gemma4", str(tmp_path / "wide"), load_target=lambda s: loaded(gemma))
    assert verdict.status == "incompatible" and verdict.exit_status == 2
    assert verdict.reasons == ["the assistant was trained on a target of hidden size 48, this one "
                               "has 32: it belongs to another Gemma 4 size"]


# --- native MTP layers ------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 3, "auto"])
def test_native_mtp_greedy_equals_plain(glm, k):
    model, mtp = glm
    kv = KVModel(model)
    plain = generate(kv, PROMPT, CharTokenizer(), max_new_tokens=40)
    spec = generate(kv, PROMPT, CharTokenizer(), drafter=NativeMtpDrafter(mtp, model, 32),
                    policy=_policy(k), max_new_tokens=40)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > 0 and spec.stats.extra_memory_bytes > 0


def test_native_mtp_rollback_matches_a_drafter_recomputed_from_scratch(glm):
    model, mtp = glm
    _drive_with_rejections(model, lambda: NativeMtpDrafter(mtp, model, 32))


def test_native_mtp_draws_with_the_targets_sampling_parameters(glm):
    """transformers drafts MTP tokens greedily and passes raw logits on as q; here a greedy draft
    is a one-hot q and a sampled one carries the distribution it was drawn from."""
    model, mtp = glm
    for params, one_hot in ((SamplingParams(), True), (SamplingParams(temperature=0.7, top_k=5), False)):
        drafter = NativeMtpDrafter(mtp, model, 32)
        _, feats = KVModel(model).forward_features(PROMPT[:-1], 1, drafter.feature_layers)
        drafter.observe(feats)
        proposal = drafter.propose(PROMPT, 3, params, torch.Generator().manual_seed(0))
        assert torch.allclose(proposal.probs.sum(-1), torch.ones(3))
        assert bool((proposal.probs.max(-1).values == 1).all()) is one_hot
        assert int((proposal.probs[0] > 0).sum()) == (1 if one_hot else 5)
        assert all(proposal.probs[i, t] > 0 for i, t in enumerate(proposal.ids))


def test_mtp_is_refused_for_a_target_without_mtp_layers():
    from specdemo.models.learned import is_learned
    assert is_learned("mtp") and is_learned("mtp+ngram")
    for spec in ("mtp", "mtp+ngram"):
        with pytest.raises(DrafterRefused, match="has no multi-token prediction layers"):
            load_learned(spec, loaded(tiny_llama(), "tiny-llama"))
    verdict = learned_verdict("tiny-llama", "mtp", load_target=lambda s: loaded(tiny_llama(), s))
    assert verdict.status == "incompatible"
    assert verdict.reasons[0].startswith("tiny-llama has no multi-token prediction layers")


def _glm_checkpoint_with_mtp(folder: Path, hidden: int = 16) -> None:
    """A 46-layer GLM-4.5-style checkpoint (GLM-4.5-Air's depth, so transformers' key patterns
    find its MTP layer) whose layer 46 is the MTP layer: written as a 47-layer model, then the
    MTP-only tensors added and the config cut to 46 layers."""
    from safetensors.torch import load_file, save_file
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
    torch.manual_seed(0)
    config = Glm4MoeConfig(
        vocab_size=32, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=8,
        num_hidden_layers=47, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        n_routed_experts=2, num_experts_per_tok=1, n_shared_experts=1, n_group=1, topk_group=1,
        first_k_dense_replace=46, num_mtp_layers=1, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=0, pad_token_id=None)
    Glm4MoeForCausalLM(config).save_pretrained(folder)
    state = load_file(str(folder / "model.safetensors"))
    for name, shape in (("enorm", (hidden,)), ("hnorm", (hidden,)), ("shared_head.norm", (hidden,)),
                        ("eh_proj", (hidden, 2 * hidden))):
        base = torch.ones(shape) if "norm" in name else torch.zeros(shape)
        state[f"model.layers.46.{name}.weight"] = base + 0.1 * torch.randn(shape)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 46}))


def test_draft_mtp_loads_the_layers_from_the_targets_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM
    _glm_checkpoint_with_mtp(tmp_path / "glm")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "glm", dtype=torch.float32).eval()
    mtp = load_learned("mtp", loaded(model, "tiny-glm"))
    assert len(mtp.model.layers) == 1 and "its MTP layer" in mtp.summary
    kv = KVModel(model)
    plain = generate(kv, PROMPT, CharTokenizer(), max_new_tokens=24)
    spec = generate(kv, PROMPT, CharTokenizer(), drafter=mtp.new_drafter(model, 32, "mtp"),
                    policy=FixedDraftLength(3), max_new_tokens=24)
    assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0
