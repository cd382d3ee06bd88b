"""Damaged or wrong learned-drafter folders (issue 20, items 1-2): a folder that cannot be read is
refused with one sentence naming the file and the fault (never a traceback, never a verdict about
tokenizers), and a folder that loads but can never draft (non-finite weights, repeated or
negative layer ids, a negative d2t) is refused at load time. EAGLE-3 in both layouts, DFlash in
both layouts, DSpark (speculators' layout), Gemma 4 assistants."""

from __future__ import annotations

import json
import re

import pytest
import torch

from specdemo.core.drafters import dflash, dspark, eagle_io
from specdemo.checks.compat import learned_verdict
from specdemo.models.learned import DrafterRefused, load_learned
from specdemo.models.loading import LoadedModel
from test_dflash import _zlab_folder
from tiny import (CharTokenizer, tiny_dflash, tiny_dspark, tiny_eagle, tiny_gemma4,
                  tiny_gemma4_assistant, tiny_llama)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=4)


def loaded(model, spec="tiny") -> LoadedModel:
    return LoadedModel(spec, model, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")


def _eagle(target, folder, layout="speculators", **head_kwargs):
    head = tiny_eagle(target, 20, seed=4)
    if head_kwargs:
        from specdemo.core.drafters.eagle import Eagle3Head
        fresh = Eagle3Head(head.config, 20, head.feature_layers, verifier=head.verifier, **head_kwargs)
        fresh.load_state_dict(head.state_dict(), strict=False)
        head = fresh
    eagle_io.save_head(head, folder, dtype=torch.float32)
    if layout == "safeailab":
        from safetensors.torch import load_file, save_file
        config = json.loads((folder / "config.json").read_text())
        state = {k.replace("layers.0.", "midlayer.", 1): v
                 for k, v in load_file(str(folder / "model.safetensors")).items()}
        save_file(state, str(folder / "model.safetensors"))
        flat = {**config["transformer_layer_config"], "architectures": ["LlamaForCausalLMEagle3"],
                "draft_vocab_size": 20, "eagle_config": {
                    "eagle_aux_hidden_state_layer_ids": config["eagle_aux_hidden_state_layer_ids"]}}
        (folder / "config.json").write_text(json.dumps(flat))
    return folder


def _dflash(target, folder, layout="transformers"):
    model = tiny_dflash(target, seed=4)
    dflash.save_assistant(model, folder)
    if layout == "z-lab":
        _zlab_folder(model, folder)
    return folder


def _builders(target):
    return {"eagle3-speculators": lambda f: _eagle(target, f),
            "eagle3-safeailab": lambda f: _eagle(target, f, "safeailab"),
            "dflash-transformers": lambda f: _dflash(target, f),
            "dflash-z-lab": lambda f: _dflash(target, f, "z-lab"),
            "dspark": lambda f: dspark.save_dspark(tiny_dspark(target, seed=4), f)}


KINDS = ["eagle3-speculators", "eagle3-safeailab", "dflash-transformers", "dflash-z-lab", "dspark"]


def _weights(folder):
    return next(folder.glob("*.safetensors"))


def _cut_in_half(folder):
    path = _weights(folder)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    return path.name, "cannot be read: it is cut short, damaged or not a weight file"


def _not_weights(folder):
    _weights(folder).write_text("hello")
    return _weights(folder).name, "cannot be read: it is cut short, damaged or not a weight file"


def _no_weights(folder):
    _weights(folder).unlink()
    return str(folder), "has no weights (model.safetensors or pytorch_model.bin)"


def _not_json(folder):
    (folder / "config.json").write_text("{this is not json")
    return "config.json", "is not valid JSON"


def _set_size(config, key, value):
    section = config.get("transformer_layer_config", config)
    section[key] = value
    where = "transformer_layer_config." if "transformer_layer_config" in config else ""
    return where + key, value


def _hidden_as_text(folder):
    config = json.loads((folder / "config.json").read_text())
    key, _ = _set_size(config, "hidden_size", "32")
    (folder / "config.json").write_text(json.dumps(config))
    return "config.json", f"\"{key}\" must be a whole number of at least 1, got \"32\""


def _heads_as_list(folder):
    config = json.loads((folder / "config.json").read_text())
    key, _ = _set_size(config, "num_attention_heads", [4])
    (folder / "config.json").write_text(json.dumps(config))
    return "config.json", f"\"{key}\" must be a whole number of at least 1, got [4]"


DAMAGE = {"cut in half": _cut_in_half, "not a weight file": _not_weights,
          "no weights": _no_weights, "config not JSON": _not_json,
          "hidden_size as text": _hidden_as_text, "heads as a list": _heads_as_list}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("kind", KINDS)
def test_an_unreadable_folder_is_refused_naming_the_file(target, tmp_path, kind, damage):
    folder = _builders(target)[kind](tmp_path / "drafter")
    name, words = DAMAGE[damage](folder)
    with pytest.raises(DrafterRefused) as refused:
        load_learned(str(folder), loaded(target))
    message = str(refused.value)
    assert name in message and words in message, message
    assert "\n" not in message and "Traceback" not in message
    verdict = learned_verdict("tiny", str(folder), load_target=lambda spec: loaded(target))
    assert verdict.status == "incompatible" and verdict.exit_status == 2
    assert any(words in reason for reason in verdict.reasons)


def test_draft_vocab_size_as_text_is_named(target, tmp_path):
    folder = _eagle(target, tmp_path / "head")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "draft_vocab_size": "lots"}))
    with pytest.raises(DrafterRefused, match=re.escape(
            f"{folder / 'config.json'}: \"draft_vocab_size\" must be a whole number of at least 1, "
            "got \"lots\"")):
        load_learned(str(folder), loaded(target))


def test_a_config_that_is_not_an_object_is_named(target, tmp_path):
    folder = _eagle(target, tmp_path / "head")
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(DrafterRefused, match=re.escape(
            f"{folder / 'config.json'} holds a JSON list, not an object of settings")):
        load_learned(str(folder), loaded(target))


@pytest.mark.parametrize("kind", KINDS)
def test_non_finite_weights_are_refused_naming_the_tensor(target, tmp_path, kind):
    from safetensors.torch import load_file, save_file
    folder = _builders(target)[kind](tmp_path / "drafter")
    path = _weights(folder)
    state = load_file(str(path))
    name = next(k for k, v in state.items() if v.is_floating_point() and v.dim() == 2)
    state[name][0, 0] = float("nan")
    save_file(state, str(path))
    with pytest.raises(DrafterRefused, match=re.escape(name) + r".* NaN or infinite values"):
        load_learned(str(folder), loaded(target))


@pytest.mark.parametrize("ids, words", [
    ([1, 1, 1], "reads hidden state(s) [1] more than once ([1, 1, 1])"),
    ([-1, 2, 3], "names negative target layer ids [-1]: layer ids count from 0"),
    ([0, 2, 9], "reads hidden state(s) [9] but the target has only 4 layers"),
])
def test_eagle3_layer_ids_that_can_never_work_are_refused(target, tmp_path, ids, words):
    folder = _eagle(target, tmp_path / "head")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": ids}))
    with pytest.raises(DrafterRefused, match=re.escape(words)):
        load_learned(str(folder), loaded(target))


@pytest.mark.parametrize("ids, words", [
    ([1, 1], "reads target layer(s) [1] more than once ([1, 1])"),
    ([-2, 3], "names negative target layer ids [-2]: layer ids count from 0"),
])
def test_dflash_layer_ids_that_can_never_work_are_refused(target, tmp_path, ids, words):
    folder = dflash.save_assistant(tiny_dflash(target, layer_ids=ids, seed=4), tmp_path / "d")
    with pytest.raises(DrafterRefused, match=re.escape(words)):
        load_learned(str(folder), loaded(target))


def test_a_negative_d2t_entry_is_called_negative(target, tmp_path):
    from safetensors.torch import load_file, save_file
    folder = _eagle(target, tmp_path / "head")
    state = load_file(str(folder / "model.safetensors"))
    state["d2t"][0] = -5  # draft id 0 -> target id -5
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(DrafterRefused, match=re.escape(
            "d2t maps draft ids to negative target ids (down to -5): the map is corrupt")):
        load_learned(str(folder), loaded(target))


@pytest.mark.parametrize("kind, extra", [("eagle3-speculators", "layers.0.self_attn.q_norm.weight"),
                                         ("eagle3-safeailab", "extra_head.weight"),
                                         ("dflash-z-lab", "layers.0.mlp_conv.base_kernel")])
def test_a_weight_the_model_would_not_use_is_refused_by_name(target, tmp_path, kind, extra):
    from safetensors.torch import load_file, save_file
    folder = _builders(target)[kind](tmp_path / "drafter")
    path = _weights(folder)
    state = load_file(str(path))
    save_file({**state, extra: torch.ones(8)}, str(path))
    with pytest.raises(DrafterRefused, match=re.escape(extra) + " would not be used by"):
        load_learned(str(folder), loaded(target))


def test_a_head_of_two_draft_layers_is_refused_not_cut_to_one(target, tmp_path):
    from safetensors.torch import load_file, save_file
    folder = _eagle(target, tmp_path / "head")
    state = load_file(str(folder / "model.safetensors"))
    state.update({k.replace("layers.0.", "layers.1.", 1): v.clone()
                  for k, v in state.items() if k.startswith("layers.0.")})
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(DrafterRefused, match=re.escape(
            "the head has 2 draft layers (layers.0 to layers.1); this loader runs EAGLE-3 heads "
            "of one draft layer")):
        load_learned(str(folder), loaded(target))


def test_a_layer_count_the_weights_lack_is_refused(target, tmp_path):
    folder = _eagle(target, tmp_path / "head")
    config = json.loads((folder / "config.json").read_text())
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1  # what save_head writes
    config["transformer_layer_config"]["num_hidden_layers"] = 32
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(DrafterRefused, match="num_hidden_layers is 32 but the weights hold 1"):
        load_learned(str(folder), loaded(target))


@pytest.mark.parametrize("damage", ["cut in half", "hidden_size as text", "config not JSON"])
def test_a_damaged_gemma4_assistant_is_refused_naming_the_file(tmp_path, damage):
    target = tiny_gemma4(seed=1)
    folder = tmp_path / "assistant"
    tiny_gemma4_assistant(target, seed=2).save_pretrained(folder)
    if damage == "hidden_size as text":
        config = json.loads((folder / "config.json").read_text())
        config["backbone_hidden_size"] = "32"
        (folder / "config.json").write_text(json.dumps(config))
        name, words = "config.json", "\"backbone_hidden_size\" must be a whole number"
    else:
        name, words = DAMAGE[damage](folder)
    with pytest.raises(DrafterRefused) as refused:
        load_learned(str(folder), loaded(target, "tiny-gemma4"))
    assert name in str(refused.value) and words in str(refused.value), str(refused.value)


def test_the_page_and_race_show_the_refusal_as_it_is(target, tmp_path):
    """The page and /race word errors through race.describe_error: a refusal is shown as its
    sentence, not prefixed with a Python class name."""
    from specdemo.services.race import describe_error
    folder = _eagle(target, tmp_path / "head")
    _cut_in_half(folder)
    with pytest.raises(DrafterRefused) as refused:
        load_learned(str(folder), loaded(target))
    assert describe_error(refused.value) == str(refused.value)
    assert str(refused.value).startswith(f"draft {folder} cannot serve target tiny: ")


# --- through the command line, with a real (tiny) model folder as the target --------------------

@pytest.fixture(scope="module")
def target_folder(tmp_path_factory, target):
    from test_compat import make_tokenizer
    folder = tmp_path_factory.mktemp("target")
    target.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("command", ["check", "run", "compare"])
def test_cli_refuses_a_damaged_head_with_status_2(target, target_folder, tmp_path, capsys, command):
    from specdemo.interfaces.cli import main
    folder = _eagle(target, tmp_path / "head")
    name, words = _cut_in_half(folder)
    argv = [command, "--target", str(target_folder), "--draft", str(folder)]
    if command == "check":
        status = main(argv)
    else:
        with pytest.raises(SystemExit) as exited:
            main(argv + ["--prompt", "the cat", "--max-new-tokens", "4", "--dtype", "float32"])
        status = exited.value.code
    out, err = capsys.readouterr()
    assert status == 2
    text = out + err
    assert name in text and words in text, text
    assert "Traceback" not in text and "tokenizer" not in text


def test_check_refuses_a_draft_model_folder_with_a_size_as_text(target_folder, tmp_path, capsys):
    import shutil

    from specdemo.interfaces.cli import main
    draft = tmp_path / "draft"
    shutil.copytree(target_folder, draft)
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "hidden_size": "32"}))
    assert main(["check", "--target", str(target_folder), "--draft", str(draft)]) == 2
    assert capsys.readouterr().out.strip() == (
        f"error: could not load {draft}: {draft / 'config.json'}: \"hidden_size\" must be a whole "
        "number of at least 1, got \"32\"")


def test_check_refuses_a_draft_model_folder_with_damaged_weights(target_folder, tmp_path, capsys):
    """A draft *model* folder (not a learned drafter) whose weights are cut short: check said
    'compatible' from its tokenizer; it must refuse as run does."""
    import shutil

    from specdemo.interfaces.cli import main
    draft = tmp_path / "draft"
    shutil.copytree(target_folder, draft)
    _cut_in_half(draft)
    assert main(["check", "--target", str(target_folder), "--draft", str(draft)]) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"error: could not load {draft}: {draft / 'model.safetensors'} cannot be "
                          "read: it is cut short"), out
