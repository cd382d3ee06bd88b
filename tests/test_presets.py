"""Presets: the shipped files validate, bad files fail naming file and key, a hub preset loads
from a local directory standing in for the hub (no network)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specdemo.services import presets as P

GOOD = """\
name = "{name}"
target = "Qwen/Qwen2.5-7B-Instruct"
draft = "Qwen/Qwen2.5-0.5B-Instruct"
draft_length = 5
dtype = "bfloat16"
quantization = "none"
memory_bytes = 17_578_253_056
target_params = 7_615_616_512
draft_params = 494_032_768
tasks = ["chat", "code"]
licence = "apache-2.0"
gated = false
devices = ["cuda", "mps"]
note = "test preset"
sources = ["https://huggingface.co/Qwen/Qwen2.5-7B-Instruct"]
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


# --- the shipped presets ----------------------------------------------------------------------

SHIPPED = sorted(p.stem for p in P.PRESETS_DIR.glob("*.toml"))


def test_shipped_presets_are_the_promised_set():
    assert SHIPPED == sorted([
        "smollm2-135m-ngram", "smollm2-135m-self", "smollm2-135m-early-exit", "smollm2-135m-int4-ngram",
        "qwen2.5-1.5b-0.5b", "qwen2.5-7b-0.5b", "qwen2.5-14b-4bit-0.5b", "qwen2.5-coder-7b-0.5b",
        "llama3.1-8b-3.2-1b", "smollm2-1.7b-135m", "smollm2-1.7b-360m", "gemma2-9b-2b",
        "qwen3-8b-0.6b", "llama3.1-8b-eagle3", "qwen3-4b-dflash", "gemma4-e2b-assistant",
        "smollm2-135m-eagle3", "smollm2-135m-eagle3-ngram", "gemma4-26b-a4b-dspark",
    ])


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_preset_validates(name):
    preset = P.load_preset(P.PRESETS_DIR / f"{name}.toml")
    assert preset.name == name
    assert preset.memory_bytes >= preset.weight_bytes() > 0
    assert all(s.startswith("https://") for s in preset.sources)
    if preset.draft_is_model:
        assert preset.draft_params > 0 and preset.target_params > preset.draft_params


@pytest.mark.parametrize("name", SHIPPED)
def test_memory_comment_arithmetic_adds_up(name):
    """Each file shows its memory sum in a comment block; the terms must add up to memory_bytes."""
    lines = (P.PRESETS_DIR / f"{name}.toml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# memory_bytes"))
    block = [line for line in lines[start:] if line.startswith("#   ") and "=" in line]
    numbers = [int(line.split("=")[-1].split("(")[0].replace(",", "")) for line in block]
    *terms, total = numbers
    assert block[-1].startswith("#   total")
    assert len(terms) >= 4
    assert sum(terms) == total == P.load_preset(P.PRESETS_DIR / f"{name}.toml").memory_bytes


def test_exactly_one_default_and_it_is_the_offline_trained_head_with_prompt_lookup():
    presets = P.list_presets()
    assert [p.name for p in presets if p.default] == ["smollm2-135m-eagle3-ngram"]
    default = P.default_preset()
    assert (default.target, default.draft) == ("builtin:smollm2-135m", "builtin:smollm2-135m-eagle3+ngram")


def test_builtin_presets_cover_ngram_self_early_exit_and_the_trained_head():
    builtin = {p.draft for p in P.list_presets() if p.target == "builtin:smollm2-135m"}
    assert builtin == {"ngram", "self", "early-exit:12", "builtin:smollm2-135m-eagle3",
                       "builtin:smollm2-135m-eagle3+ngram"}


def test_gated_presets_are_llama_and_gemma():
    assert sorted(p.name for p in P.list_presets() if p.gated) == [
        "gemma2-9b-2b", "llama3.1-8b-3.2-1b", "llama3.1-8b-eagle3"]


def test_learned_presets_declare_their_family():
    kinds = {p.name: p.draft_kind for p in P.list_presets() if p.draft_is_learned}
    assert kinds == {"llama3.1-8b-eagle3": "eagle3", "qwen3-4b-dflash": "dflash",
                     "gemma4-e2b-assistant": "gemma4-assistant", "smollm2-135m-eagle3": "eagle3",
                     "gemma4-26b-a4b-dspark": "dspark",
                     "smollm2-135m-eagle3-ngram": "eagle3"}
    assert P.get_preset("qwen2.5-7b-0.5b").draft_kind == "model"
    assert P.get_preset("smollm2-135m-ngram").draft_kind == ""


def test_quantized_presets_run_only_where_their_method_does():
    quantized = {p.name: (p.quantization, p.devices) for p in P.list_presets()
                 if p.quantization != "none"}
    assert quantized == {"qwen2.5-14b-4bit-0.5b": ("4bit", ("cuda",)),  # bitsandbytes
                         "smollm2-135m-int4-ngram": ("int4", ("cpu",))}  # torchao CPU kernel


def test_get_preset_by_name_and_unknown_name_lists_known():
    assert P.get_preset("qwen2.5-7b-0.5b").target == "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(P.PresetError, match="preset .* does not exist; valid presets: .*smollm2-135m-ngram"):
        P.get_preset("no-such-preset")


# --- bad files --------------------------------------------------------------------------------

BAD = [
    ("unknown key", lambda t: t + 'colour = "blue"\n', "colour", "unknown key"),
    ("missing field", lambda t: t.replace('note = "test preset"\n', ""), "note", "missing"),
    ("negative memory", lambda t: t.replace("17_578_253_056", "-1"), "memory_bytes", ">= 1"),
    ("zero draft length", lambda t: t.replace("draft_length = 5", "draft_length = 0"), "draft_length", "1..64"),
    ("huge draft length", lambda t: t.replace("draft_length = 5", "draft_length = 65"), "draft_length", "1..64"),
    ("string memory", lambda t: t.replace("17_578_253_056", '"17 GB"'), "memory_bytes", "integer"),
    ("unknown task", lambda t: t.replace('"chat", "code"', '"chat", "poetry"'), "tasks", "poetry"),
    ("unknown device", lambda t: t.replace('"cuda", "mps"', '"tpu"'), "devices", "tpu"),
    ("empty tasks", lambda t: t.replace('["chat", "code"]', "[]"), "tasks", "non-empty"),
    ("bad dtype", lambda t: t.replace('"bfloat16"', '"int3"'), "dtype", "int3"),
    ("bad quantization", lambda t: t.replace('quantization = "none"', 'quantization = "2bit"'), "quantization", "2bit"),
    ("4-bit off CUDA", lambda t: t.replace('quantization = "none"', 'quantization = "4bit"'), "devices", "cuda"),
    ("int4 off the CPU", lambda t: t.replace('quantization = "none"', 'quantization = "int4"'), "devices",
     "runs on ['cpu'] only"),
    ("gated not bool", lambda t: t.replace("gated = false", 'gated = "no"'), "gated", "true or false"),
    ("memory below weights", lambda t: t.replace("17_578_253_056", "1_000"), "memory_bytes", "weights"),
    ("negative params", lambda t: t.replace("7_615_616_512", "-7"), "target_params", ">= 0"),
    ("bad early exit", lambda t: t.replace('draft = "Qwen/Qwen2.5-0.5B-Instruct"', 'draft = "early-exit:x"')
     .replace("draft_params = 494_032_768\n", ""), "draft", "layer count"),
    ("draft params for ngram", lambda t: t.replace('draft = "Qwen/Qwen2.5-0.5B-Instruct"', 'draft = "ngram"'),
     "draft_params", "not a model"),
    ("name differs from file", lambda t: t.replace('name = "bad"', 'name = "other"'), "name", "file name"),
    ("unknown draft kind", lambda t: t + 'draft_kind = "medusa"\n', "draft_kind", "medusa"),
    ("kind for ngram", lambda t: t.replace('draft = "Qwen/Qwen2.5-0.5B-Instruct"', 'draft = "ngram"')
     .replace("draft_params = 494_032_768\n", "") + 'draft_kind = "eagle3"\n', "draft_kind", "no"),
    ("mtp kind for a hub id", lambda t: t + 'draft_kind = "mtp"\n', "draft_kind", "mtp"),
]


@pytest.mark.parametrize("label,mutate,key,words", BAD, ids=[b[0] for b in BAD])
def test_bad_file_error_names_file_and_key(tmp_path, label, mutate, key, words):
    path = write(tmp_path, "bad", mutate(GOOD.format(name="bad")))
    with pytest.raises(P.PresetError) as err:
        P.load_preset(path)
    message = str(err.value)
    assert str(path) in message
    assert f"key {key!r}" in message
    assert words in message


def test_good_template_is_valid(tmp_path):
    """The BAD cases mutate a file that is otherwise valid."""
    preset = P.load_preset(write(tmp_path, "bad", GOOD.format(name="bad")))
    assert preset.draft_length == 5 and preset.tasks == ("chat", "code")


def test_not_toml_names_the_file(tmp_path):
    path = write(tmp_path, "broken", "name = [unclosed\n")
    with pytest.raises(P.PresetError, match=re.escape(str(path)) + ".*not valid TOML"):
        P.load_preset(path)


def test_two_defaults_are_refused(tmp_path):
    for name in ("one", "two"):
        write(tmp_path, name, GOOD.format(name=name) + "default = true\n")
    with pytest.raises(P.PresetError, match="more than one preset says default = true: one, two"):
        P.list_presets(tmp_path)


def test_edits_are_seen_without_restart(tmp_path):
    path = write(tmp_path, "live", GOOD.format(name="live"))
    assert P.get_preset("live", tmp_path).draft_length == 5
    path.write_text(GOOD.format(name="live").replace("draft_length = 5", 'draft_length = "auto"'))
    assert P.get_preset("live", tmp_path).draft_length == "auto"


# --- hub models and the command ---------------------------------------------------------------

def test_hub_models_to_fetch_checks_the_cache_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    import huggingface_hub.constants as constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    local = P.Preset(name="x", target=str(tmp_path), draft="someone/not-cached", draft_length=4,
                     dtype="bfloat16", quantization="none", memory_bytes=1, tasks=("chat",),
                     licence="x", gated=False, devices=("cpu",), note="x", sources=("https://x",))
    assert P.hub_models_to_fetch(local) == ["someone/not-cached"]
    assert P.hub_models_to_fetch(P.default_preset()) == []


def test_a_presets_draft_is_parsed_once_when_it_is_made(tmp_path):
    """``Preset.draft`` is a ``DraftSpec`` (text given to the constructor is parsed there, a
    spec no form accepts refused), so callers read its kind without parsing it again."""
    from specdemo.core.draft_spec import DraftSpec, DraftSpecError
    for preset in P.list_presets():
        assert isinstance(preset.draft, DraftSpec)
        assert preset.draft_is_model == (preset.draft.is_model and preset.draft_kind != "mtp")
        assert json.loads(json.dumps(preset.to_dict()))["draft"] == preset.draft.text
    fields = dict(name="x", target="t", draft_length=4, dtype="bfloat16", quantization="none",
                  memory_bytes=1, tasks=("chat",), licence="x", gated=False, devices=("cpu",),
                  note="x", sources=("https://x",))
    assert P.Preset(draft=" early-exit:3 ", **fields).draft.layers == 3
    with pytest.raises(DraftSpecError, match="got 'early-exit:x'"):
        P.Preset(draft="early-exit:x", **fields)


def test_presets_command_json_lists_every_preset(capsys):
    from specdemo.interfaces.cli import main

    assert main(["presets", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(p["name"] for p in out["presets"]) == SHIPPED
    assert out["recommended"] in SHIPPED
    chosen = next(p for p in out["presets"] if p["name"] == out["recommended"])
    assert chosen["fits"] is True
    assert all(isinstance(p["reason"], str) and p["reason"] for p in out["presets"])


def test_presets_command_text_marks_fit_and_default(capsys):
    from specdemo.interfaces.cli import main

    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("this machine: ")
    assert re.search(r"fits smollm2-135m-eagle3-ngram .*\[default\]", out)
    assert "recommended: " in out


# --- a hub preset's loading path, with local directories standing in for the hub --------------

def _save_tiny_model(directory: Path, seed: int, vocab_rows: int, layers: int) -> None:
    """A random Llama + a WordLevel tokenizer saved like a hub snapshot (config, weights, tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tiny import tiny_llama

    words = [f"w{i}" for i in range(40)]
    vocab = {tok: i for i, tok in enumerate(["<unk>", "<s>", "</s>"] + words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>",
                                        bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(directory)
    model = tiny_llama(seed=seed, vocab_size=vocab_rows, layers=layers)
    model.config.eos_token_id = 2
    model.save_pretrained(directory)


def test_hub_preset_loads_from_local_directories_without_network(tmp_path, monkeypatch):
    models = pytest.importorskip("specdemo.models.loading", reason="specdemo.models.loading not written yet")
    from specdemo.checks.compat import check_specs

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target_dir, draft_dir, preset_dir = tmp_path / "target", tmp_path / "draft", tmp_path / "presets"
    preset_dir.mkdir()
    _save_tiny_model(target_dir, seed=0, vocab_rows=64, layers=3)  # padded: 43 tokens, 64 rows
    _save_tiny_model(draft_dir, seed=1, vocab_rows=48, layers=1)
    text = (GOOD.format(name="local-pair")
            .replace('"Qwen/Qwen2.5-7B-Instruct"', json.dumps(str(target_dir)))
            .replace('"Qwen/Qwen2.5-0.5B-Instruct"', json.dumps(str(draft_dir)))
            .replace('dtype = "bfloat16"', 'dtype = "float32"')
            .replace("target_params = 7_615_616_512", "target_params = 0")
            .replace("draft_params = 494_032_768", "draft_params = 0")
            .replace("17_578_253_056", "100_000_000")
            .replace('["cuda", "mps"]', '["cpu"]'))
    write(preset_dir, "local-pair", text)

    preset = P.get_preset("local-pair", preset_dir)
    assert P.hub_models_to_fetch(preset) == []
    assert check_specs(preset.target, preset.draft).status == "compatible"
    target = models.load_model(preset.target, device="cpu", dtype=preset.dtype)
    draft = models.load_model(preset.draft, device="cpu", dtype=preset.dtype)
    assert target.model.get_input_embeddings().num_embeddings == 64
    assert draft.model.get_input_embeddings().num_embeddings == 48
    assert target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()
    assert target.model.config.num_hidden_layers == 3 and draft.model.config.num_hidden_layers == 1
