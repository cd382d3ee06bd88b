"""DSpark drafters (speculators layout): lossless in the engine on the transformers and native
backends, the hidden-state index convention, the Markov chain and the confidence head's stop,
rollback, save/load, and the load-time refusals of a folder for another target, a missing
tensor, a wrong-typed option and an option this loader does not run."""

import json
import re

import pytest
import torch

from specdemo.checks.compat import learned_verdict
from specdemo.core.draft_spec import DraftSpec
from specdemo.core.drafters import dspark
from specdemo.core.drafters.dspark import DSparkDrafter
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.core.policy import FixedDraftLength, make_policy
from specdemo.core.sampling import SamplingParams
from specdemo.models.learned import DrafterRefused, load_learned
from specdemo.models.loading import LoadedModel
from tiny import CharTokenizer, tiny_dspark, tiny_llama

PROMPT = CharTokenizer().encode("speculative decoding, made visible")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=4)


def loaded(target) -> LoadedModel:
    return LoadedModel("tiny-llama", target, CharTokenizer(), torch.device("cpu"), torch.float32,
                       0.0, "test")


def _fed(model, target, context, min_survival=0.0):
    """A fresh drafter fed the features of ``context[:-1]``."""
    drafter = DSparkDrafter(model, target, 32, min_survival=min_survival)
    _, feats = KVModel(target).forward_features(context[:-1], 1, drafter.feature_layers)
    drafter.observe(feats)
    return drafter


@pytest.mark.parametrize("k", [1, 3, 6, "auto"])
@pytest.mark.parametrize("options", [{}, {"markov_head_type": "rnn", "sample_from_anchor": False},
                                     {"draft_vocab": 20}])
def test_greedy_equals_plain(target, k, options):
    kv = KVModel(target)
    plain = generate(kv, PROMPT, CharTokenizer(), max_new_tokens=48)
    policy = make_policy(k, {n: 1.0 for n in range(1, 18)}) if k == "auto" else FixedDraftLength(k)
    drafter = DSparkDrafter(tiny_dspark(target, seed=1, **options), target, 32,
                            min_survival=dspark.DEFAULT_MIN_SURVIVAL)
    spec = generate(kv, PROMPT, CharTokenizer(), drafter=drafter, policy=policy, max_new_tokens=48)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > 0 and spec.stats.extra_memory_bytes > 0


@pytest.mark.parametrize("sample_from_anchor, most", [(True, 5), (False, 4)])
def test_reads_hidden_states_by_index_and_drafts_at_most_a_block(target, sample_from_anchor, most):
    model = tiny_dspark(target, feature_layers=(0, 4), sample_from_anchor=sample_from_anchor)
    drafter = _fed(model, target, PROMPT)
    assert drafter.feature_layers == (0, 4)  # speculators' ids are hidden_states indices
    proposal = drafter.propose(PROMPT, 9, SamplingParams(), None)
    assert len(proposal.ids) == most
    assert torch.equal(proposal.probs.sum(-1), torch.ones(most))
    assert (proposal.probs.max(-1).values == 1).all()  # greedy drafts are one-hot q


def test_each_position_is_biased_by_the_token_drafted_before_it(target):
    """The k-th draft's logits are the backbone's plus markov_w2(markov_w1[previous token]),
    the first keyed on the anchor (the last context token)."""
    model = tiny_dspark(target, seed=2)
    rows, _ = _fed(model, target, PROMPT)._chain(PROMPT, 5, lambda l: l.argmax().view(1))
    drafts = [int(r.argmax()) for r in rows]
    hidden = _fed(model, target, PROMPT)._block_hidden(PROMPT)
    with torch.no_grad():
        base = target.lm_head(hidden)
        prev = torch.tensor([PROMPT[-1]] + drafts[:-1])
        expected = base + model.markov_head.markov_w2(model.markov_head.markov_w1(prev))
    torch.testing.assert_close(torch.stack(rows), expected, rtol=0, atol=1e-6)
    assert not torch.equal(base.argmax(-1), expected.argmax(-1))  # the bias changes the drafts


def test_the_confidence_head_sets_the_draft_length(target):
    model = tiny_dspark(target, seed=2)
    whole = _fed(model, target, PROMPT, min_survival=0.0).propose(PROMPT, 5, SamplingParams(), None)
    assert len(whole.ids) == 5
    survival = torch.tensor(whole.confidence).cumprod(0)
    assert ((0 < survival) & (survival < 1)).all()
    for cut in range(1, 5):  # a threshold between the survival after cut and after cut + 1 drafts
        threshold = float(survival[cut - 1] + survival[cut]) / 2
        part = _fed(model, target, PROMPT, threshold).propose(PROMPT, 5, SamplingParams(), None)
        assert part.ids == whole.ids[:cut] and part.confidence == whole.confidence[:cut]
    one = _fed(model, target, PROMPT, 1.0).propose(PROMPT, 5, SamplingParams(), None)
    assert one.ids == whole.ids[:1]  # at least one token is drafted


def test_without_a_confidence_head_the_block_is_drafted_whole(target):
    model = tiny_dspark(target, seed=2, enable_confidence_head=False)
    proposal = _fed(model, target, PROMPT, 1.0).propose(PROMPT, 5, SamplingParams(), None)
    assert len(proposal.ids) == 5
    assert all(0 < c <= 1 for c in proposal.confidence)  # the drafts' own probabilities


def test_rollback_matches_a_drafter_recomputed_from_scratch(target):
    model = tiny_dspark(target, seed=2)
    kv = KVModel(target)
    drafter = DSparkDrafter(model, target, 32, min_survival=0.0)
    context = list(PROMPT)
    _, feats = kv.forward_features(context, 1, drafter.feature_layers)
    drafter.observe(feats)
    context.append(7)
    for round_ in range(6):
        proposal = drafter.propose(context, 4, SamplingParams(), None).ids
        assert proposal == _fed(model, target, context).propose(context, 4, SamplingParams(),
                                                                 None).ids, round_
        n_acc = round_ % 3
        _, feats = kv.forward_features([context[-1]] + proposal, 1, drafter.feature_layers)
        kv.rollback(len(context) + n_acc)
        drafter.observe(feats[:n_acc + 1])
        context += proposal[:n_acc] + [(proposal[n_acc] + 1) % 32]


@pytest.mark.parametrize("options", [{}, {"draft_vocab": 20, "markov_head_type": "gated"}])
def test_saved_drafter_loads_back_with_the_same_proposals(target, tmp_path, options):
    model = tiny_dspark(target, seed=4, **options)
    folder = dspark.save_dspark(model, tmp_path / "dspark")
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_model_type"] == "dspark"
    back = load_learned(str(folder), loaded(target))
    assert back.info["layout"] == "speculators" and back.warnings == []
    assert back.summary.startswith("DSpark drafter (speculators layout, 2 layers) reading target "
                                   "hidden states [1, 4], drafting blocks of 5 tokens")
    context = PROMPT + [5]
    ours = _fed(back.model, target, context).propose(context, 5, SamplingParams(), None)
    theirs = _fed(model, target, context).propose(context, 5, SamplingParams(), None)
    assert ours.ids == theirs.ids and ours.confidence == theirs.confidence


def test_checked_folder_passes(target, tmp_path):
    folder = dspark.save_dspark(tiny_dspark(target), tmp_path / "ok")
    verdict = learned_verdict("tiny-llama", str(folder), load_target=lambda spec: loaded(target))
    assert verdict.status == "compatible", verdict.reasons
    assert verdict.reasons[0].startswith("DSpark drafter (speculators layout, 2 layers)")


def test_prompt_lookup_stacked_over_dspark_stays_lossless(target):
    from specdemo.core.drafters.combined import CombinedDrafter
    tok = CharTokenizer()
    prompt = tok.encode("abc abc abc abc abc abc abc abc ") + PROMPT
    kv = KVModel(target)
    plain = generate(kv, prompt, tok, max_new_tokens=40)
    drafter = CombinedDrafter(DSparkDrafter(tiny_dspark(target, seed=7), target, 32, "dspark"),
                              name="dspark+ngram")
    spec = generate(kv, prompt, tok, drafter=drafter, policy=FixedDraftLength(4), max_new_tokens=40)
    assert spec.token_ids == plain.token_ids
    assert "dspark" in spec.stats.drafted_by


def test_greedy_equals_plain_on_the_native_backend():
    from specdemo.models import native as nb
    from tiny import bf16_valued
    try:
        nb.library()
    except nb.NativeError as exc:  # no C compiler here
        pytest.skip(str(exc))
    target = bf16_valued(tiny_llama(seed=3, layers=3, hidden=64))
    nm = nb.NativeModel(target, kernel="fma")
    plain = generate(nb.NativeKV(nm), PROMPT, CharTokenizer(), max_new_tokens=40)
    drafter = DSparkDrafter(tiny_dspark(target, seed=1), target, 32)
    spec = generate(nb.NativeKV(nm), PROMPT, CharTokenizer(), drafter=drafter,
                    policy=FixedDraftLength(4), max_new_tokens=40)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > 0


# --- refusals -------------------------------------------------------------------------------------

def _folder(target, tmp_path, **options):
    return dspark.save_dspark(tiny_dspark(target, seed=4, **options), tmp_path / "d")


def _edit(folder, change=None, layer=None):
    config = json.loads((folder / "config.json").read_text())
    config.update(change or {})
    config["transformer_layer_config"].update(layer or {})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _refused(folder, target, words):
    with pytest.raises(DrafterRefused, match=re.escape(words)) as refused:
        load_learned(str(folder), loaded(target))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("change, words", [
    (dict(feature_layers=(1, 5)), "reads hidden state(s) [5] but the target has only 4 layers"),
    (dict(mask_token_id=40), "mask token id 40 is outside the target's vocabulary of 32 ids"),
])
def test_refusals_name_the_problem(target, tmp_path, change, words):
    folder = _folder(target, tmp_path, **change)
    _refused(folder, target, words)
    verdict = learned_verdict("tiny-llama", str(folder), load_target=lambda spec: loaded(target))
    assert verdict.status == "incompatible" and verdict.exit_status == 2
    assert any(words in reason for reason in verdict.reasons)


def test_a_drafter_for_another_target_is_refused(target, tmp_path):
    wide = tiny_llama(seed=0, layers=4, hidden=48)
    folder = dspark.save_dspark(tiny_dspark(wide), tmp_path / "wide")
    _refused(folder, target, "hidden size is 48 but the target's is 32: it was built for another "
                             "target")
    other = tiny_llama(seed=0, layers=4, vocab_size=40)
    folder = dspark.save_dspark(tiny_dspark(other), tmp_path / "vocab")
    _refused(folder, target, "built for a vocabulary of 40 ids, the target has 32")


@pytest.mark.parametrize("change, layer, words", [
    ({"markov_rank": "8"}, None, "\"markov_rank\" must be a whole number, got \"8\""),
    ({"enable_confidence_head": "yes"}, None, "\"enable_confidence_head\" must be true or false"),
    ({"aux_hidden_state_layer_ids": "1,4"}, None,
     "\"aux_hidden_state_layer_ids\" must be a list of whole numbers"),
    (None, {"num_key_value_heads": 2.5}, "\"transformer_layer_config.num_key_value_heads\" must be"),
])
def test_a_wrong_typed_option_is_refused(target, tmp_path, change, layer, words):
    _refused(_edit(_folder(target, tmp_path), change, layer), target, words)


@pytest.mark.parametrize("change, layer, words", [
    ({"markov_head_type": "lstm"}, None, "markov_head_type 'lstm' is not one of vanilla, gated, rnn"),
    ({"draft_adapter_rank": 16}, None, "draft_adapter_rank is not a setting of speculators' DSpark "
                                       "config that this loader runs"),
    (None, {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8},
     "layer_types makes layers [0] sliding-window layers"),
    (None, {"attention_bias": True}, "attention_bias is true"),
    ({"target_hidden_size": 64}, None, "target_hidden_size 64 differs from the draft's hidden size"),
    ({"markov_rank": 0}, None, "confidence_head_with_markov needs the Markov head"),
    ({"mask_token_id": None}, None, "the DSpark config names no mask_token_id"),
    ({"speculators_model_type": None, "architectures": ["Qwen3DSparkModel"]}, None,
     "declares Qwen3DSparkModel without speculators_model_type \"dspark\""),
])
def test_an_option_this_loader_does_not_run_is_refused(target, tmp_path, change, layer, words):
    _refused(_edit(_folder(target, tmp_path), change, layer), target, words)


@pytest.mark.parametrize("drop, words", [
    ("markov_head.markov_w1.weight", "weights missing: markov_head.markov_w1.weight"),
    ("confidence_head.proj.bias", "weights missing: confidence_head.proj.bias"),
    ("fc.weight", "weights missing: fc.weight"),
    ("d2t", "weights missing: d2t"),
])
def test_a_missing_tensor_is_refused_by_name(target, tmp_path, drop, words):
    from safetensors.torch import load_file, save_file
    folder = _folder(target, tmp_path, draft_vocab=20)
    path = folder / "model.safetensors"
    state = load_file(str(path))
    del state[drop]
    save_file(state, str(path))
    _refused(folder, target, words)


def test_an_unused_tensor_and_weights_of_the_wrong_shape_are_refused(target, tmp_path):
    from safetensors.torch import load_file, save_file
    folder = _folder(target, tmp_path)
    path = folder / "model.safetensors"
    state = load_file(str(path))
    save_file({**state, "markov_head.gate_proj.weight": torch.ones(8, 40)}, str(path))
    _refused(folder, target, "markov_head.gate_proj.weight would not be used by the DSpark drafter")
    save_file({**state, "markov_head.markov_w1.weight": torch.ones(32, 4)}, str(path))
    _refused(folder, target, "weights do not fit the config: markov_head.markov_w1.weight (32, 4) "
                             "(expected (32, 8))")


def test_target_owned_tensors_are_named_and_not_read(target, tmp_path):
    from safetensors.torch import load_file, save_file
    folder = _folder(target, tmp_path)
    path = folder / "model.safetensors"
    save_file({**load_file(str(path)), "embed_tokens.weight": torch.zeros(32, 32)}, str(path))
    back = load_learned(str(folder), loaded(target))
    assert back.warnings == [f"{folder} also holds embed_tokens.weight: DSpark uses the target's "
                             "own embeddings and head, so these are not read"]


def test_an_identical_copy_of_the_targets_embeddings_is_not_reported(target, tmp_path):
    """speculators saves the verifier's embedding rows with the drafter (as
    makora-ai/gemma4-26b-a4b-dspark ships them): an exact copy is not news."""
    from safetensors.torch import load_file, save_file
    folder = _folder(target, tmp_path)
    path = folder / "model.safetensors"
    rows = target.get_input_embeddings().weight.detach().clone()
    save_file({**load_file(str(path)), "embed_tokens.weight": rows}, str(path))
    assert load_learned(str(folder), loaded(target)).warnings == []


@pytest.mark.parametrize("block, tokens, anchor", [
    (7, 6, False),   # makora-ai/gemma4-26b-a4b-dspark: no key, 6 tokens from a block of 7
    (7, 7, True),    # a block of 7 drafting 7: slot 0 drafts
    (7, None, True),  # neither: speculators 0.9.0's default
])
def test_a_config_without_sample_from_anchor_is_read_from_its_proposal_width(block, tokens, anchor):
    config = {"block_size": block, "speculators_config": {"proposal_methods": (
        [{"proposal_type": "greedy", "speculative_tokens": tokens}] if tokens else [])}}
    assert dspark.samples_from_anchor(config) is anchor
    assert dspark.samples_from_anchor({**config, "sample_from_anchor": not anchor}) is not anchor


def test_a_folder_without_sample_from_anchor_drafts_from_slot_one(target, tmp_path):
    folder = _folder(target, tmp_path, block_size=5, sample_from_anchor=False)
    config = json.loads((folder / "config.json").read_text())
    del config["sample_from_anchor"]
    config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 4
    (folder / "config.json").write_text(json.dumps(config))
    back = load_learned(str(folder), loaded(target))
    assert not back.model.sample_from_anchor
    assert "drafting blocks of 4 tokens" in back.summary


def test_a_bad_min_survival_setting_is_refused(target, tmp_path, monkeypatch):
    folder = _folder(target, tmp_path)
    monkeypatch.setenv("SPECDEMO_DSPARK_MIN_SURVIVAL", "lots")
    _refused(folder, target, "SPECDEMO_DSPARK_MIN_SURVIVAL must be a number from 0 to 1, got 'lots'")
    monkeypatch.setenv("SPECDEMO_DSPARK_MIN_SURVIVAL", "0.5")
    assert load_learned(str(folder), loaded(target)).min_survival == 0.5


@pytest.mark.parametrize("backend", ["transformers", "auto"])
def test_compare_races_a_dspark_folder_and_stays_identical(tmp_path, capsys, backend):
    """Greedy output with a DSpark folder equals plain decoding on the reference backend and on
    the one ``auto`` picks (``compare --draft DIR``)."""
    from specdemo.interfaces import cli
    from test_learned_presets import save_target
    model = tiny_llama(seed=11, vocab_size=64, layers=2)
    save_target(model, tmp_path / "target")
    folder = dspark.save_dspark(tiny_dspark(model, seed=2), tmp_path / "draft")
    code = cli.main(["compare", "--target", str(tmp_path / "target"), "--draft", str(folder),
                     "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "8",
                     "--backend", backend, "--prompt", "w1 w2 w3 w1 w2", "--json"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and result["identical"] is True
    spec = result["speculative"]
    assert spec["drafted_by"] == {str(folder): spec["drafted"]} and spec["drafted"] > 0
    assert len(spec["per_position_acceptance"]) == len(spec["position_drafted"]) >= 1


def test_the_dropdown_lists_a_compatible_dspark_folder(tmp_path, monkeypatch):
    """ui.draft_options offers a DSpark folder paired with the target, labelled with its family
    (checked against the target's weights), and refuses one built for another target, with the
    reason."""
    from types import SimpleNamespace
    from specdemo.interfaces import ui
    from specdemo.models import loading
    from test_learned_presets import save_target
    model = tiny_llama(seed=11, vocab_size=64, layers=2)
    save_target(model, tmp_path / "target")
    good = dspark.save_dspark(tiny_dspark(model, seed=2), tmp_path / "good")
    other = tiny_llama(seed=12, vocab_size=64, layers=2, hidden=48)
    bad = dspark.save_dspark(tiny_dspark(other, seed=2), tmp_path / "bad")
    monkeypatch.setattr(loading, "builtin_names", lambda: [])  # no built-in models to check
    monkeypatch.setattr(ui, "_VERDICTS", {})
    target_spec = str(tmp_path / "target")
    presets = [SimpleNamespace(target=target_spec, draft=DraftSpec.parse(str(d)),  # as Preset.draft
                               draft_is_learned=True,
                               draft_is_model=True, draft_kind="dspark") for d in (good, bad)]
    choices, refused = ui.draft_options(target_spec, presets)
    assert (f"{good} (DSpark)", str(good)) in choices
    assert [spec for spec, _ in refused] == [str(bad)]
    assert str(bad) not in [spec for _, spec in choices]


@pytest.mark.parametrize("key", list(dspark.DEFAULTS))
@pytest.mark.parametrize("how", ["absent", "null"])
def test_a_setting_left_to_its_default_is_said(target, tmp_path, key, how):
    """A config that leaves a setting of :data:`dspark.DEFAULTS` out (or null) loads with that
    default and a warning naming it and its value (a config without block_size drafted blocks
    of 8 without a word; ``"markov_rank": null`` failed with int()'s words); the drafter is the
    one its config with the default written in gives."""
    value = dspark.DEFAULTS[key]
    options = {"markov_rank": 256} if key == "markov_rank" else {}
    folder = _folder(target, tmp_path, **options)
    explicit = load_learned(str(_edit(folder, {key: value})), loaded(target))
    config = json.loads((folder / "config.json").read_text())
    if how == "absent":
        del config[key]
    else:
        config[key] = None
    (folder / "config.json").write_text(json.dumps(config))
    back = load_learned(str(folder), loaded(target))
    assert back.warnings == [f"{folder / 'config.json'} gives no {key}: this loader's default "
                             f"{key} {json.dumps(value)} is used, which may not be how it was "
                             "trained"]
    assert back.summary == explicit.summary and explicit.warnings == []
    context = PROMPT + [5]
    ours = _fed(back.model, target, context).propose(context, 5, SamplingParams(), None)
    theirs = _fed(explicit.model, target, context).propose(context, 5, SamplingParams(), None)
    assert ours.ids == theirs.ids and ours.confidence == theirs.confidence


def test_a_default_that_does_not_fit_the_weights_is_named_in_the_refusal(target, tmp_path):
    """``"markov_rank": null`` for weights of rank 8: refused because the weights do not fit,
    and the sentence says the rank was the default's (not "cannot load a tokenizer")."""
    folder = _edit(_folder(target, tmp_path), {"markov_rank": None})
    _refused(folder, target, "markov_head.markov_w1.weight (32, 8) (expected (32, 256)), "
                             "markov_head.markov_w2.weight (32, 8) (expected (32, 256)); "
                             "config.json gives no markov_rank, so markov_rank 256 was assumed")


@pytest.mark.parametrize("spec, verifier, warned", [
    ("builtin:smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", False),  # what train-draft saves
    ("tiny-llama", "tiny-llama", False),
    ("/models/tiny-llama", "tiny-llama", False),  # a local target is recorded by its folder name
    ("builtin:smollm2-135m", "Qwen/Qwen3-8B", True),
])
def test_the_verifier_a_dspark_folder_records_is_matched_as_an_eagle3_heads_is(
        target, tmp_path, spec, verifier, warned):
    """A DSpark drafter trained by train-draft for builtin:smollm2-135m records its hub id and
    was then warned about as trained for another model; the EAGLE-3 head of the same command
    was not. Both families now share one rule."""
    from specdemo.core.drafters import folders
    folder = _folder(target, tmp_path, speculators_config={"verifier": {"name_or_path": verifier}})
    model = LoadedModel(spec, target, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")
    words = (f"the DSpark drafter was trained for {verifier}, not {spec}; expect low acceptance "
             "unless they are the same model")
    assert load_learned(str(folder), model).warnings == ([words] if warned else [])
    head = folders.verifier_warning("the head", verifier, model)
    assert head == (words.replace("the DSpark drafter", "the head") if warned else None)
