"""The learned-drafter presets (EAGLE-3, DFlash, DSpark, Gemma 4 assistant) through their real hub ids,
offline: tiny stand-ins are written into a temporary Hugging Face cache under those ids, then the
preset is checked, loaded and raced by the code paths a user's run takes (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdemo.services import presets as P
from specdemo.core.drafters import dflash, dspark, eagle_io
from specdemo.models.learned import load_learned
from specdemo.services.pipeline import DecodeSettings, Pipeline
from tiny import tiny_dflash, tiny_eagle, tiny_gemma4, tiny_gemma4_assistant, tiny_llama

ROWS = 64  # embedding rows of every stand-in target (its tokenizer has 43 tokens)


def save_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {tok: i for i, tok in enumerate(["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(40)])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)


def snapshot(cache: Path, repo_id: str) -> Path:
    """An empty snapshot folder of ``repo_id`` in a hub cache, with refs/main pointing at it."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    folder = repo / "snapshots" / commit
    folder.mkdir(parents=True)
    return folder


def save_target(model: torch.nn.Module, folder: Path) -> None:
    model.config.eos_token_id = 2
    model.save_pretrained(folder)
    save_tokenizer(folder)


def _qwen3(layers: int = 36):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=ROWS, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=2, pad_token_id=None)).eval()


def stand_in_eagle3(cache: Path, preset: P.Preset) -> None:
    """Llama target of 32 layers; a speculators-layout head reading [2, 16, 29] over 20 ids."""
    target = tiny_llama(seed=0, vocab_size=ROWS, layers=32)
    save_target(target, snapshot(cache, preset.target))
    head = tiny_eagle(target, 20, seed=1, layers=(2, 16, 29))
    head.verifier = {"name_or_path": preset.target, "architectures": ["LlamaForCausalLM"]}
    eagle_io.save_head(head, snapshot(cache, preset.draft), dtype=torch.float32)


def stand_in_dflash(cache: Path, preset: P.Preset) -> None:
    """Qwen3 target of 36 layers; a drafter in z-lab's layout reading [1, 9, 17, 25, 33]."""
    target = _qwen3()
    save_target(target, snapshot(cache, preset.target))
    model = tiny_dflash(target, layer_ids=(1, 9, 17, 25, 33), block_size=16, seed=2,
                        mask_token_id=ROWS - 1)
    folder = snapshot(cache, preset.draft)
    from safetensors.torch import save_file
    renames = {v: k for k, v in dflash.ZLAB_RENAMES.items()}
    save_file({renames.get(k, k): v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "model.safetensors"))
    cfg = model.config
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
        "dflash_config": {"mask_token_id": ROWS - 1, "target_layer_ids": [1, 9, 17, 25, 33]},
        "hidden_size": 32, "intermediate_size": cfg.intermediate_size, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_target_layers": 36,
        "max_position_embeddings": 512, "rope_theta": 10000.0, "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": True, "vocab_size": ROWS}))


def stand_in_gemma4(cache: Path, preset: P.Preset) -> None:
    """Gemma 4 text target (KV-shared layers); a Gemma 4 assistant."""
    target = tiny_gemma4(seed=3, vocab_size=ROWS)
    save_target(target, snapshot(cache, preset.target))
    tiny_gemma4_assistant(target, seed=4).save_pretrained(snapshot(cache, preset.draft))


def _gemma4_moe(layers: int = 30):
    """A Gemma 4 26B-A4B-shaped target: Gemma4ForConditionalGeneration (a one-layer vision
    tower), ``layers`` text layers five sliding to one full, keys as values on the full layers,
    a mixture-of-experts block beside each dense MLP, tied embeddings, logit soft-capping."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig
    torch.manual_seed(5)
    text = Gemma4TextConfig(
        vocab_size=ROWS, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, num_global_key_value_heads=1, head_dim=8,
        global_head_dim=16, attention_k_eq_v=True, enable_moe_block=True, num_experts=4,
        top_k_experts=2, moe_intermediate_size=16, max_position_embeddings=512, sliding_window=16,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * (layers // 6),
        num_kv_shared_layers=0, hidden_size_per_layer_input=0, final_logit_softcapping=30.0,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=2, pad_token_id=0)
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8}
    return Gemma4ForConditionalGeneration(Gemma4Config(
        text_config=text.to_dict(), vision_config=vision, audio_config=None)).eval()


def stand_in_dspark(cache: Path, preset: P.Preset) -> None:
    """Gemma 4 MoE target of 30 layers; a DSpark drafter in speculators' layout with the keys of
    makora-ai/gemma4-26b-a4b-dspark: five Qwen3-style layers, hidden states [3, 10, 18, 25, 28],
    block 7 with 6 speculative tokens and no sample_from_anchor key, mask token 4, a draft
    vocabulary (lm_head + d2t), a vanilla Markov head and a confidence head reading it, and a
    copy of the target's embeddings among the weights."""
    from safetensors.torch import load_file, save_file
    target = _gemma4_moe()
    save_target(target, snapshot(cache, preset.target))
    layer = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 5,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": ROWS,
             "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
             "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0}}
    config = dspark.new_config(layer, (3, 10, 18, 25, 28), block_size=7, mask_token_id=4,
                               draft_vocab_size=40, markov_rank=8, sample_from_anchor=False,
                               verifier=preset.target,
                               verifier_architectures=["Gemma4ForConditionalGeneration"])
    torch.manual_seed(6)
    model = dspark.DSparkModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if "markov" in name or "confidence" in name else 0.1)
        model.d2t.copy_(torch.arange(40) // 8)  # draft id i -> target id i + i // 8
    folder = dspark.save_dspark(model, snapshot(cache, preset.draft))
    del config["sample_from_anchor"]  # the published config predates the key
    (folder / "config.json").write_text(json.dumps(config))
    path = folder / "model.safetensors"
    state = {k: v for k, v in load_file(str(path)).items() if k != "t2d"}
    embed = target.get_input_embeddings().weight.detach().clone()
    save_file({**state, "embed_tokens.weight": embed}, str(path))


STAND_INS = {"llama3.1-8b-eagle3": stand_in_eagle3, "qwen3-4b-dflash": stand_in_dflash,
             "gemma4-e2b-assistant": stand_in_gemma4, "gemma4-26b-a4b-dspark": stand_in_dspark}


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants
    from specdemo.models import loading as models
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    yield cache
    models.clear_loaded()  # the stand-ins were loaded under real ids


def test_every_hub_learned_preset_has_a_stand_in():
    assert {p.name for p in P.list_presets()
            if p.draft_is_learned and not p.draft.startswith("builtin:")} == set(STAND_INS)


@pytest.mark.parametrize("name", sorted(STAND_INS))
def test_learned_preset_loads_from_the_cache_and_stays_lossless(offline_cache, name):
    from specdemo.checks.compat import check_specs
    from specdemo.models.loading import load_model
    preset = P.get_preset(name)
    STAND_INS[name](offline_cache, preset)
    assert P.hub_models_to_fetch(preset) == []
    verdict = check_specs(preset.target, preset.draft)
    assert verdict.status == "compatible", verdict.reasons
    target = load_model(preset.target, device="cpu", dtype="float32")
    draft = load_learned(preset.draft, target)
    assert draft.warnings == []
    if preset.draft_kind == "dspark":  # block 7, 6 speculative tokens: slot 0 is the anchor
        assert not draft.model.sample_from_anchor
    pipe = Pipeline(target, preset.draft, draft)
    ids = pipe.prompt_ids("w1 w2 w3 w1 w2 w3 w4")
    comparison = pipe.compare(ids, DecodeSettings(max_new_tokens=16,
                                                  draft_length=preset.draft_length))
    assert comparison.identical
    assert comparison.speculative.stats.drafted > 0


def test_dropdown_offers_the_learned_drafters_built_for_the_target(monkeypatch):
    """ui.draft_options lists learned drafters of presets for this target (labelled with their
    family) and shipped builtin: drafters, and no one else's; refusals keep their reason."""
    from specdemo.interfaces import ui
    from specdemo.checks.compat import COMPATIBLE, INCOMPATIBLE, Verdict
    checked = []

    def verdict(target, spec):
        checked.append(spec)
        if spec == "meta-llama/Llama-3.2-1B-Instruct":
            return Verdict(INCOMPATIBLE, ["not for this target"])
        return Verdict(COMPATIBLE, ["fine"])
    monkeypatch.setattr(ui, "_verdict", verdict)
    presets = P.list_presets()
    choices, refused = ui.draft_options("meta-llama/Llama-3.1-8B-Instruct", presets)
    head = "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"
    assert (f"{head} (EAGLE-3)", head) in choices
    assert refused == [("meta-llama/Llama-3.2-1B-Instruct", "not for this target")]
    assert not any("DFlash" in spec or "assistant" in spec for spec in checked)
    checked.clear()
    ui.draft_options("builtin:smollm2-135m", presets)
    # the preset's early-exit draft is checked too (its layer count against the target's)
    assert checked[:2] == ["early-exit:12", "builtin:smollm2-135m-eagle3"]
