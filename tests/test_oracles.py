"""Our learned drafters against the reference implementations (issue 19, issue 20 item 3b): each
reference writes its folder with its own ``save_pretrained`` (tiny random weights, float32), our
loader reads it, and the same inputs give the same logits (to ~1e-5). Every option a reference
reads either changes our forward exactly as it does, or the folder is refused naming the option.

Oracles: vLLM's ``speculators`` 0.9.0 (``Eagle3DraftModel``, ``DSparkDraftModel``) and z-lab's
``dflash`` 0.1.0 (``DFlashDraftModel``), installed with ``pip install --no-deps -r requirements-oracles.txt``;
the tests skip, saying so, when they are not installed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from oracles import speculators_dspark, speculators_eagle3, zlab_dflash
from specdemo.core.drafters import dspark, eagle_io
from specdemo.core.drafters.eagle import Eagle3Drafter
from specdemo.models.learned import DrafterRefused, load_learned
from specdemo.core.kv import KVModel
from specdemo.models.loading import LoadedModel
from specdemo.core.sampling import SamplingParams
from tiny import CharTokenizer, tiny_llama

SHIPPED = Path(__file__).resolve().parents[1] / "specdemo" / "builtin_drafters" / "smollm2-135m-eagle3"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _randomise(model: torch.nn.Module) -> None:
    """Every weight random (norm weights around 1), so that no option is hidden by a default."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if p.dim() == 1 else 0.3 * torch.randn_like(p))


# --- EAGLE-3: speculators' Eagle3DraftModel -------------------------------------------------------

def _speculators_head(folder: Path, layers: int = 1, hidden_act: str = "silu", **options):
    """A tiny Eagle3DraftModel (hidden 32, vocabulary 40, draft vocabulary 24, feature layers
    [0, 2, 3]) saved by speculators into ``folder``; returns the model."""
    from transformers import LlamaConfig
    eagle3 = speculators_eagle3()
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    layer = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                        max_position_embeddings=256, hidden_act=hidden_act)
    layer._attn_implementation = "eager"  # dense masks on the CPU
    config = eagle3.Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=24, eagle_aux_hidden_state_layer_ids=[0, 2, 3],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])),
        **options)
    model = eagle3.Eagle3DraftModel(config).eval()
    _randomise(model)
    model.save_pretrained(folder)
    return model


def _reference_logits(model, features, ids, steps):
    """speculators' training-time-test forward; the draft logits of each step (1, T, Vd)."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda mod, args, out: seen.append(out.detach()))
    try:
        with torch.no_grad():
            model(hidden_states=features, input_ids=ids, document_ids=torch.zeros_like(ids),
                  position_ids=torch.arange(ids.shape[1])[None], ttt_steps=steps)
    finally:
        hook.remove()
    return seen


EAGLE3_OPTIONS = {"plain": {}, "norm_before_fc": {"norm_before_fc": True},
                  "fc_norm": {"fc_norm": True}, "norm_output": {"norm_output": True},
                  "norm_before_residual": {"norm_before_residual": True},
                  "hidden_act gelu": {"hidden_act": "gelu_pytorch_tanh"},
                  "hidden_act relu": {"hidden_act": "relu"}}


@pytest.mark.parametrize("option", list(EAGLE3_OPTIONS))
def test_eagle3_forward_equals_speculators(tmp_path, option):
    reference = _speculators_head(tmp_path / "head", **EAGLE3_OPTIONS[option])
    head, info = eagle_io.load_head(tmp_path / "head")
    assert info["layout"] == "speculators"
    t, steps = 7, 3
    g = torch.Generator().manual_seed(1)
    features = torch.randn(1, t, 96, generator=g)
    ids = torch.randint(0, 40, (1, t), generator=g)  # the reference pairs features[t] with ids[t]
    expected = _reference_logits(reference, features, ids, steps)
    ours_ids = torch.cat([torch.zeros(1, 1, dtype=torch.long), ids,
                          torch.zeros(1, steps, dtype=torch.long)], dim=1)  # ours: ids[t + 1]
    with torch.no_grad():
        ours = head.ttt_forward(features, ours_ids, steps)
    assert len(ours) == len(expected) == steps
    for step, (a, b) in enumerate(zip(ours, expected)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5, msg=f"{option}, step {step}")


@pytest.mark.parametrize("option", ["norm_output", "fc_norm", "norm_before_fc"])
def test_eagle3_drafting_chain_follows_the_same_forward(tmp_path, option):
    """The engine's drafter (KV-cached steps) drafts what the unrolled forward predicts: its k
    greedy drafts are the argmaxes of steps 0..k-1 at the last anchor, fed its own drafts."""
    _speculators_head(tmp_path / "head", **EAGLE3_OPTIONS[option])
    head, _ = eagle_io.load_head(tmp_path / "head")
    target = tiny_llama(seed=3, vocab_size=40, layers=4)
    head.embed_tokens = None  # read the target's embeddings, as the engine does without its own
    head.attach(target.get_input_embeddings())
    context = [3, 17, 5, 29, 11, 8, 21]
    _, feats = KVModel(target).forward_features(context[:-1], 1, head.feature_layers)
    drafter = Eagle3Drafter(head, 40)
    drafter.observe(feats)
    k = 3
    drafts = drafter.propose(context, k, SamplingParams(), None).ids
    ids = torch.tensor([context + drafts[:k - 1]])
    with torch.no_grad():
        steps = head.ttt_forward(feats[None], ids, k)
    assert drafts == [int(head.draft_ids()[s[0, -1].argmax()]) for s in steps]


def test_eagle3_with_two_draft_layers_is_refused_naming_it(tmp_path):
    _speculators_head(tmp_path / "head", layers=2)
    with pytest.raises(eagle_io.Eagle3FormatError, match=re.escape(
            "the head has 2 draft layers (layers.0 to layers.1); this loader runs EAGLE-3 heads "
            "of one draft layer")):
        eagle_io.load_head(tmp_path / "head")


def test_shipped_head_loads_in_speculators_with_no_missing_or_unexpected_keys():
    """vLLM's speculators builds the layers the config names and loads the file into them; the
    shipped head must fit exactly (it said 32 layers and had 1). The verifier's own weights are
    the hub's and are not read here (no hub on these machines)."""
    from safetensors.torch import load_file
    eagle3 = speculators_eagle3()
    config = eagle3.Eagle3SpeculatorConfig.from_pretrained(SHIPPED)
    assert config.transformer_layer_config.num_hidden_layers == 1
    assert config.speculators_config.verifier.name_or_path == HUB_ID
    config.transformer_layer_config._attn_implementation = "eager"
    model = eagle3.Eagle3DraftModel(config)
    state = load_file(str(SHIPPED / "model.safetensors"))
    result = model.load_state_dict(state, strict=False)
    optional = set(eagle3.Eagle3DraftModel._keys_to_ignore_on_load_missing)
    assert [k for k in result.missing_keys if k not in optional] == []
    assert result.unexpected_keys == []


def test_save_head_writes_what_speculators_reads(tmp_path):
    """A head we save (the layout train-draft writes) is read by speculators with the layer count
    it has and every option as we set it."""
    from safetensors.torch import load_file
    eagle3 = speculators_eagle3()
    _speculators_head(tmp_path / "ref", norm_output=True, fc_norm=True)
    head, _ = eagle_io.load_head(tmp_path / "ref")
    eagle_io.save_head(head, tmp_path / "ours", dtype=torch.float32)
    config = eagle3.Eagle3SpeculatorConfig.from_pretrained(tmp_path / "ours")
    assert (config.transformer_layer_config.num_hidden_layers, config.norm_output, config.fc_norm,
            config.norm_before_fc) == (1, True, True, False)
    model = eagle3.Eagle3DraftModel(config)
    result = model.load_state_dict(load_file(str(tmp_path / "ours" / "model.safetensors")), strict=False)
    optional = set(eagle3.Eagle3DraftModel._keys_to_ignore_on_load_missing)
    assert [k for k in result.missing_keys if k not in optional] == [] and result.unexpected_keys == []


# --- DFlash: z-lab's DFlashDraftModel ---------------------------------------------------------------

def _zlab_drafter(folder: Path, config_extra: dict | None = None, dflash_extra: dict | None = None):
    """A tiny z-lab DFlashDraftModel (2 layers, block 5, mask token 39, the outputs of target
    layers 0 and 3) saved by z-lab's save_pretrained into ``folder``; returns the model."""
    from transformers import Qwen3Config
    zlab = zlab_dflash()
    config = Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=512, rope_theta=10000.0, **(config_extra or {}))
    config.dflash_config = {"mask_token_id": 39, "target_layer_ids": [0, 3], **(dflash_extra or {})}
    config.block_size, config.num_target_layers = 5, 4
    config.architectures = ["DFlashDraftModel"]
    model = zlab.DFlashDraftModel(config).eval()
    _randomise(model)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def dflash_target():
    model = tiny_llama(seed=3, vocab_size=40, layers=4)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # logits of a useful size
    return model


DFLASH_OPTIONS = {"plain": {}, "input_embedding_scale": {"input_embedding_scale": 2.5},
                  "output_multiplier": {"output_multiplier": 0.5},
                  "final_logit_softcapping": {"final_logit_softcapping": 3.0}}


@pytest.mark.parametrize("option", list(DFLASH_OPTIONS))
def test_dflash_block_logits_equal_zlab(tmp_path, dflash_target, option):
    zlab = zlab_dflash()
    reference = _zlab_drafter(tmp_path / "d", dflash_extra=DFLASH_OPTIONS[option])
    target = LoadedModel("tiny", dflash_target, CharTokenizer(40), torch.device("cpu"),
                         torch.float32, 0.0, "test")
    loaded = load_learned(str(tmp_path / "d"), target)
    assert loaded.info["layout"] == "z-lab"
    drafter = loaded.new_drafter(dflash_target, 40, "dflash")
    context = [3, 17, 5, 29, 11, 8, 21, 30, 2]
    _, feats = KVModel(dflash_target).forward_features(context[:-1], 1, drafter.feature_layers)
    drafter.observe(feats)
    ours = drafter._block_logits(context, 4)  # (4, V)
    scale = float(DFLASH_OPTIONS[option].get("input_embedding_scale", 1.0))
    block = torch.tensor([[context[-1]] + [39] * 4])
    with torch.no_grad():
        noise = zlab._raw_input_embeddings(dflash_target, block, scale)
        hidden = reference(position_ids=torch.arange(len(context) - 1 + 5)[None],
                           noise_embedding=noise, target_hidden=feats[None])
        expected = reference.compute_logits(hidden[:, 1:], dflash_target.lm_head)[0]
    assert ours.shape == expected.shape == (4, 40)
    torch.testing.assert_close(ours, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("config_extra, dflash_extra, words", [
    (dict(layer_types=["sliding_attention", "full_attention"], sliding_window=4), {},
     "layer_types makes layers [0] sliding-window layers"),
    (dict(is_causal=True), {}, "is_causal / causal or attention_bias"),
])
def test_dflash_options_we_do_not_run_are_refused_naming_them(tmp_path, dflash_target,
                                                              config_extra, dflash_extra, words):
    _zlab_drafter(tmp_path / "d", config_extra, dflash_extra)
    if "is_causal" in config_extra:  # z-lab reads it from the config; make sure it was saved
        assert json.loads((tmp_path / "d" / "config.json").read_text())["is_causal"] is True
    target = LoadedModel("tiny", dflash_target, CharTokenizer(40), torch.device("cpu"),
                         torch.float32, 0.0, "test")
    with pytest.raises(DrafterRefused, match=re.escape(words)):
        load_learned(str(tmp_path / "d"), target)


# --- DSpark: speculators' DSparkDraftModel ---------------------------------------------------------

def _speculators_dspark(folder: Path, target, draft_vocab: int = 40, **options):
    """A tiny speculators DSparkDraftModel (2 layers, hidden 32, vocabulary 40, block 5, mask
    token 39, Markov rank 6, target hidden states 1 and 4) with random weights, saved by
    speculators into ``folder``; returns the model with the target's embeddings and head in the
    places speculators reloads them from the verifier."""
    from transformers import Qwen3Config
    core = speculators_dspark()
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.dspark import DSparkSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    layer = Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                        max_position_embeddings=512, rope_theta=10000.0)
    layer._attn_implementation = "eager"  # dense masks on the CPU
    config = DSparkSpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=draft_vocab, block_size=5,
        aux_hidden_state_layer_ids=[1, 4], mask_token_id=39,
        speculators_config=SpeculatorsConfig(
            algorithm="dspark", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=5)],
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])),
        **{"markov_rank": 6, **options})
    model = core.DSparkDraftModel(config).eval()
    _randomise(model)
    if draft_vocab < 40:  # the draft vocabulary: even ids, then odd ones
        ids = torch.tensor(sorted([*range(0, 40, 2), *range(1, 40, 2)][:draft_vocab]))
        t2d = torch.zeros(40, dtype=torch.bool)
        t2d[ids] = True
        model.load_vocab_mappings(t2d, ids - torch.arange(draft_vocab))
    model.save_pretrained(folder)
    with torch.no_grad():  # what load_verifier_weights reads from the verifier
        model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        head = target.lm_head.weight if draft_vocab == 40 else model.lm_head.weight
        model.lm_head.weight.copy_(head)
        model.verifier_lm_head.weight.copy_(head)
        model.verifier_norm.weight.fill_(1.0)
    return model


def _dspark_reference(model, monkeypatch, features, ids, anchor):
    """speculators' training forward over ``ids`` with one anchor block at position ``anchor``
    (the draft tokens after it teacher-forced): the block's Markov-biased logits (B, Vd) and
    confidence logits (B,) or None, caught where the forward hands them to its loss."""
    core = speculators_dspark()
    seen = {}

    def catch(logits, targets, confidence_logits, *args, **kwargs):
        seen["logits"], seen["confidence"] = logits[0], confidence_logits
        return torch.zeros(()), {}

    monkeypatch.setattr(core, "compute_metrics", catch)
    t = ids.shape[1]
    loss_mask = torch.zeros(1, t)
    loss_mask[0, anchor] = 1  # the only anchor speculators can choose
    with torch.no_grad():
        model(hidden_states=features, input_ids=ids, loss_mask=loss_mask,
              verifier_last_hidden_states=torch.zeros(1, t, 32),
              document_ids=torch.zeros(1, t, dtype=torch.long), max_anchors=1)
    confidence = seen["confidence"]
    return seen["logits"], None if confidence is None else confidence[0]


DSPARK_OPTIONS = {"plain": {}, "gated": {"markov_head_type": "gated"},
                  "rnn": {"markov_head_type": "rnn"},
                  "sample_from_anchor false": {"sample_from_anchor": False},
                  "confidence without markov": {"confidence_head_with_markov": False},
                  "no confidence head": {"enable_confidence_head": False},
                  "no markov head": {"markov_rank": 0, "confidence_head_with_markov": False},
                  "draft vocabulary": {"draft_vocab": 24}}


@pytest.mark.parametrize("option", list(DSPARK_OPTIONS))
def test_dspark_block_logits_and_confidence_equal_speculators(tmp_path, dflash_target, monkeypatch,
                                                              option):
    """Tensor layout: speculators 0.9.0's DSpark ``save_pretrained`` (``fc``, ``hidden_norm``,
    ``layers.*``, ``norm``, ``markov_head.markov_w1/w2`` [+ ``gate_proj`` / ``joint_proj``],
    ``confidence_head.proj``, with a draft vocabulary ``lm_head``, ``d2t``, ``t2d``). Our
    drafter's chain, fed its own drafts, against speculators' forward teacher-forced with the
    same tokens: logits and confidences to 1e-5 in float32."""
    reference = _speculators_dspark(tmp_path / "d", dflash_target, **DSPARK_OPTIONS[option])
    target = LoadedModel("tiny", dflash_target, CharTokenizer(40), torch.device("cpu"),
                         torch.float32, 0.0, "test")
    loaded = load_learned(str(tmp_path / "d"), target)
    assert loaded.info["layout"] == "speculators"
    drafter = loaded.new_drafter(dflash_target, 40, "dspark")
    drafter.min_survival = 0.0
    context = [3, 17, 5, 29, 11, 8, 21, 30, 2]
    _, feats = KVModel(dflash_target).forward_features(context[:-1], 1, drafter.feature_layers)
    drafter.observe(feats)
    ids = drafter._ids.tolist() if drafter._ids is not None else list(range(40))
    rows, confidence = drafter._chain(context, 5, lambda l: torch.tensor([ids[int(l.argmax())]]))
    drafts = [ids[int(r.argmax())] for r in rows]
    first = 0 if reference.config.sample_from_anchor else 1
    tokens = torch.tensor([context + drafts + [0] * first])  # the anchor's block fits inside
    features = torch.cat([feats, torch.zeros(tokens.shape[1] - feats.shape[0], feats.shape[1])])
    logits, conf = _dspark_reference(reference, monkeypatch, features[None], tokens,
                                     len(context) - 1)
    assert len(rows) == 5 - first
    torch.testing.assert_close(torch.stack(rows), logits[first:], atol=1e-5, rtol=1e-5)
    if conf is None:
        assert loaded.model.confidence_head is None and confidence == []
    else:
        torch.testing.assert_close(torch.stack(confidence), conf[first:].sigmoid(), atol=1e-5,
                                   rtol=0)


def test_save_dspark_writes_what_speculators_reads(tmp_path, dflash_target):
    """A DSpark folder we save (the layout train-draft writes) loads into speculators'
    DSparkDraftModel with every option as we set it and no missing or unexpected tensors."""
    from safetensors.torch import load_file
    core = speculators_dspark()
    from speculators.models.dspark import DSparkSpeculatorConfig
    _speculators_dspark(tmp_path / "ref", dflash_target, draft_vocab=24, markov_head_type="rnn",
                        sample_from_anchor=False)
    model, _ = dspark.load_dspark(tmp_path / "ref")
    dspark.save_dspark(model, tmp_path / "ours")
    config = DSparkSpeculatorConfig.from_pretrained(tmp_path / "ours")
    assert (config.markov_head_type, config.sample_from_anchor, config.markov_rank,
            config.draft_vocab_size, config.aux_hidden_state_layer_ids) == ("rnn", False, 6, 24, [1, 4])
    config.transformer_layer_config._attn_implementation = "eager"
    theirs = core.DSparkDraftModel(config)
    saved = load_file(str(tmp_path / "ours" / "model.safetensors"))
    result = theirs.load_state_dict(saved, strict=False)
    optional = set(theirs._keys_to_ignore_on_load_missing)
    assert [k for k in result.missing_keys if k not in optional] == []
    assert result.unexpected_keys == []
    mine = load_file(str(tmp_path / "ref" / "model.safetensors"))
    assert sorted(saved) == sorted(mine)
    assert all(torch.equal(saved[k], mine[k]) for k in saved)


# --- shipped files carry no machine paths -------------------------------------------------------

def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


ABSOLUTE = re.compile(r"(^|[\s\"'(=])(/(root|home|tmp|work|Users|var|opt|mnt)\b|~/|[A-Za-z]:\\)")


def test_no_shipped_drafter_file_holds_a_machine_path():
    root = SHIPPED.parent
    files = [p for p in root.rglob("*") if p.suffix in (".json", ".md", ".txt", ".csv")]
    assert {p.name for p in files} >= {"config.json", "recipe.json", "train.json", "report.json",
                                       "report.md"}
    for path in files:
        text = path.read_text()
        found = [s for s in _strings(json.loads(text))] if path.suffix == ".json" else [text]
        bad = [s[:80] for s in found if ABSOLUTE.search(s) or s.startswith("/")]
        assert bad == [], f"{path.name} holds machine paths: {bad}"
    verifier = json.loads((SHIPPED / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": HUB_ID, "architectures": ["LlamaForCausalLM"]}
