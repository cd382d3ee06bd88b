"""DFlash drafters: lossless in the engine, the output-of-layer index convention, rollback, both
folder layouts, load-time refusals."""

import json
import re

import pytest
import torch

from specdemo.checks.compat import learned_verdict
from specdemo.core.drafters import dflash
from specdemo.core.drafters.dflash import DFlashDrafter
from specdemo.core.drafters.features import dflash_indices
from specdemo.models.learned import DrafterRefused, load_learned
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.models.loading import LoadedModel
from specdemo.core.policy import FixedDraftLength, make_policy
from specdemo.core.sampling import SamplingParams
from tiny import CharTokenizer, tiny_dflash, tiny_llama

PROMPT = CharTokenizer().encode("speculative decoding, made visible")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=4)


def loaded(target) -> LoadedModel:
    return LoadedModel("tiny-llama", target, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")


@pytest.mark.parametrize("k", [1, 3, 6, "auto"])
def test_greedy_equals_plain(target, k):
    kv = KVModel(target)
    plain = generate(kv, PROMPT, CharTokenizer(), max_new_tokens=48)
    policy = make_policy(k, {n: 1.0 for n in range(1, 18)}) if k == "auto" else FixedDraftLength(k)
    drafter = DFlashDrafter(tiny_dflash(target, block_size=5, seed=1), target, 32)
    spec = generate(kv, PROMPT, CharTokenizer(), drafter=drafter, policy=policy, max_new_tokens=48)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > 0 and spec.stats.extra_memory_bytes > 0


def test_reads_outputs_of_layers_and_drafts_at_most_a_block(target):
    drafter = DFlashDrafter(tiny_dflash(target, layer_ids=(0, 3), block_size=5), target, 32)
    assert drafter.feature_layers == dflash_indices([0, 3]) == (1, 4)  # hidden_states[k + 1]
    kv = KVModel(target)
    _, feats = kv.forward_features(PROMPT[:-1], 1, drafter.feature_layers)
    drafter.observe(feats)
    proposal = drafter.propose(PROMPT, 9, SamplingParams(), None)
    assert len(proposal.ids) == 4  # block_size - 1
    assert torch.equal(proposal.probs.sum(-1), torch.ones(4))
    assert (proposal.probs.max(-1).values == 1).all()  # greedy drafts are one-hot q


def _scratch_proposal(model, target, context, k):
    """A fresh drafter fed the features of the whole context at once (no rollback involved)."""
    drafter = DFlashDrafter(model, target, 32)
    _, feats = KVModel(target).forward_features(context[:-1], 1, drafter.feature_layers)
    drafter.observe(feats)
    return drafter.propose(context, k, SamplingParams(), None).ids


def test_rollback_matches_a_drafter_recomputed_from_scratch(target):
    model = tiny_dflash(target, seed=2)
    kv = KVModel(target)
    drafter = DFlashDrafter(model, target, 32)
    context = list(PROMPT)
    _, feats = kv.forward_features(context, 1, drafter.feature_layers)
    drafter.observe(feats)
    context.append(7)
    for round_ in range(6):
        proposal = drafter.propose(context, 4, SamplingParams(), None).ids
        assert proposal == _scratch_proposal(model, target, context, 4), round_
        n_acc = round_ % 3  # 0, 1 or 2 accepted: the rest rejected
        _, feats = kv.forward_features([context[-1]] + proposal, 1, drafter.feature_layers)
        kv.rollback(len(context) + n_acc)
        drafter.observe(feats[:n_acc + 1])
        context += proposal[:n_acc] + [(proposal[n_acc] + 1) % 32]


def _zlab_folder(model, folder):
    """Rewrite a saved assistant into z-lab's layout: Qwen3-style config with dflash_config,
    weights fc / hidden_norm at the top level."""
    from safetensors.torch import load_file, save_file
    state = load_file(str(folder / "model.safetensors"))
    back = {v: k for k, v in dflash.ZLAB_RENAMES.items()}
    save_file({back.get(k, k): v for k, v in state.items()}, str(folder / "model.safetensors"))
    cfg = model.config
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": cfg.block_size,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": cfg.target_layer_ids},
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
        "num_target_layers": 4, "max_position_embeddings": 512, "rope_theta": 10000.0,
        "rms_norm_eps": cfg.rms_norm_eps, "vocab_size": 32}))


@pytest.mark.parametrize("layout", ["transformers", "z-lab"])
def test_saved_drafter_loads_back_with_the_same_proposals(target, tmp_path, layout):
    model = tiny_dflash(target, seed=4)
    folder = dflash.save_assistant(model, tmp_path / "dflash")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "muse_glimmer_assistant"
    if layout == "z-lab":
        _zlab_folder(model, folder)
    back = load_learned(str(folder), loaded(target))
    assert back.info["layout"] == layout
    assert "outputs of target layers [0, 3]" in back.summary
    context = PROMPT + [5]
    drafter = back.new_drafter(target, 32, "x")
    assert _scratch_proposal(drafter.model, target, context, 4) == \
        _scratch_proposal(model, target, context, 4)


@pytest.mark.parametrize("change, words", [
    (dict(layer_ids=(0, 4)), "outputs of target layers [4] but the target has only 4 layers"),
    (dict(mask_token_id=40), "mask token id 40 is outside the target's vocabulary of 32 ids"),
])
def test_refusals_name_the_problem(target, tmp_path, change, words):
    folder = dflash.save_assistant(tiny_dflash(target, **change), tmp_path / "bad")
    with pytest.raises(DrafterRefused, match=re.escape(words)):
        load_learned(str(folder), loaded(target))
    verdict = learned_verdict("tiny-llama", str(folder), load_target=lambda spec: loaded(target))
    assert verdict.status == "incompatible" and verdict.exit_status == 2
    assert any(words in reason for reason in verdict.reasons)


def test_a_drafter_for_another_target_is_refused(target, tmp_path):
    wide = tiny_llama(seed=0, layers=4, hidden=48)
    folder = dflash.save_assistant(tiny_dflash(wide), tmp_path / "wide")
    with pytest.raises(DrafterRefused, match="hidden size is 48 but the target's is 32"):
        load_learned(str(folder), loaded(target))
    zlab = tmp_path / "zlab"
    model = tiny_dflash(target)
    dflash.save_assistant(model, zlab)
    _zlab_folder(model, zlab)
    config = json.loads((zlab / "config.json").read_text())
    (zlab / "config.json").write_text(json.dumps({**config, "num_target_layers": 36}))
    with pytest.raises(DrafterRefused, match="trained on a target of 36 layers, this one has 4"):
        load_learned(str(zlab), loaded(target))
    (zlab / "config.json").write_text(json.dumps({**config, "architectures": ["DFlash2DraftModel"]}))
    with pytest.raises(DrafterRefused, match="DFlash2DraftModel .* is not what transformers"):
        load_learned(str(zlab), loaded(target))


def test_checked_folder_passes(target, tmp_path):
    folder = dflash.save_assistant(tiny_dflash(target), tmp_path / "ok")
    verdict = learned_verdict("tiny-llama", str(folder), load_target=lambda spec: loaded(target))
    assert verdict.status == "compatible", verdict.reasons
    assert verdict.reasons[0].startswith("DFlash drafter (transformers layout, 2 layers)")


def test_prompt_lookup_stacked_over_dflash_stays_lossless(target):
    from specdemo.core.drafters.combined import CombinedDrafter
    tok = CharTokenizer()
    prompt = tok.encode("abc abc abc abc abc abc abc abc ") + PROMPT
    kv = KVModel(target)
    plain = generate(kv, prompt, tok, max_new_tokens=40)
    drafter = CombinedDrafter(DFlashDrafter(tiny_dflash(target, seed=7), target, 32, "dflash"),
                              name="dflash+ngram")
    spec = generate(kv, prompt, tok, drafter=drafter, policy=FixedDraftLength(4), max_new_tokens=40)
    assert spec.token_ids == plain.token_ids
    assert set(spec.stats.drafted_by) <= {"ngram", "dflash"} and "dflash" in spec.stats.drafted_by
