"""The native target backend (specdemo/models/native/, native_forward.c) on tiny random
Llamas, against the same weights in transformers float32; the built-in model only in slow tests.

The C forward rounds weights to BF16 (and, with the ``dpbf16`` kernel, activations before each
multiply), so logits differ from float32 by that rounding. To check the forward itself (norms,
rotary embeddings, grouped attention, the cache, the repacked layout) the tests also run it on a
model whose float32 weights are BF16 values already: with the ``fma`` kernel only the order of
float32 sums differs from transformers'. Exact comparisons where the code promises them: a
verification forward against one-token steps, rollback against feeding once, one thread
against two.
"""

from __future__ import annotations

import json

import pytest
import torch

from specdemo.core import family_backends
from specdemo.models import backends
from specdemo.services import backend_choice
from specdemo.models import native as nb
from tiny import CharTokenizer, LoadedStandIn, bf16_valued, tiny_llama

try:
    nb.library()
    KERNELS = ["fma"] + (["dpbf16"] if nb.library().nf_has_dpbf16() else [])
    NO_LIBRARY = None
except nb.NativeError as exc:  # no C compiler on this machine: the refusal has its own test
    KERNELS, NO_LIBRARY = ["fma"], str(exc)

needs_library = pytest.mark.skipif(NO_LIBRARY is not None, reason=f"{NO_LIBRARY}")


_Loaded = LoadedStandIn  # what the backends read of a models.LoadedModel


def _hf(model, ids, layers=()):
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=bool(layers))
    if not layers:
        return out.logits[0]
    return out.logits[0], torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)


IDS = [5, 9, 1, 22, 7, 3, 30, 12, 4, 4, 18, 2, 27]


@pytest.fixture(scope="module")
def tiny():
    """A 3-layer random Llama, hidden 64, head_dim 16, with BF16-valued weights."""
    return bf16_valued(tiny_llama(seed=3, layers=3, hidden=64))


def test_repack_layout_known_values():
    w = torch.arange(6 * 64, dtype=torch.float32).view(6, 64)  # 6 rows: padded to 8
    packed = nb.repack(w, 4)
    assert packed.shape == (8 * 64,)
    block0 = packed[:4 * 64].view(2, 4, 32)  # chunk, row, column
    assert block0[0, 1].tolist() == w[1, :32].tolist()  # chunk 0 of row 1
    assert block0[1, 3].tolist() == w[3, 32:].tolist()  # chunk 1 of row 3
    block1 = packed[4 * 64:].view(2, 4, 32)
    assert block1[1, 1].tolist() == w[5, 32:].tolist()
    assert block1[:, 2:].abs().sum() == 0  # the two padding rows
    with pytest.raises(ValueError, match="multiple of 32"):
        nb.repack(torch.zeros(4, 48), 4)


@needs_library
def test_the_forward_is_transformers_own_on_bf16_valued_weights(tiny):
    """With weights that are BF16 values already and float32 activations (kernel fma), nothing is
    rounded: logits and hidden states equal transformers' up to the order of float32 sums."""
    nm = nb.NativeModel(tiny, kernel="fma")
    kv = nb.NativeKV(nm)
    kv.forward(IDS[:4])
    logits, feats = kv.forward_features(IDS[4:], len(IDS) - 4, (0, 1, 3))
    ref, ref_feats = _hf(tiny, IDS, (0, 1, 3))
    torch.testing.assert_close(logits, ref[4:], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(feats, ref_feats[4:], atol=2e-5, rtol=1e-4)
    assert feats.shape == (len(IDS) - 4, 3 * 64)
    assert kv.length == len(IDS) and kv.ids == IDS


@needs_library
@pytest.mark.parametrize("kernel", KERNELS)
def test_logits_match_float32_within_bf16_tolerance(kernel):
    model = tiny_llama(seed=4, layers=3, hidden=64)  # float32 weights, not BF16 values
    ours = nb.NativeKV(nb.NativeModel(model, kernel=kernel)).forward(IDS, len(IDS))
    ref = _hf(model, IDS)
    assert ours.shape == (len(IDS), 32) and ours.dtype == torch.float32
    # measured on this seed: max |diff| 0.0009 (fma) and 0.0016 (dpbf16) for logits up to 0.4
    assert (ours - ref).abs().max() < 0.01
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


@needs_library
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("threads", [1, 2])
def test_a_verification_forward_equals_one_token_steps_bit_for_bit(tiny, kernel, threads):
    """Every token's numbers are independent of the other tokens of its forward (the C file's
    header): a forward over 1..9 tokens gives each position exactly the logits one-token steps
    give it, which is what makes greedy speculative output equal plain output here."""
    nm = nb.NativeModel(tiny, kernel=kernel, threads=threads)
    kv = nb.NativeKV(nm)
    kv.forward(IDS[:3])
    steps = torch.cat([kv.forward([i]) for i in IDS[3:12]])
    for width in (2, 4, 5, 9):  # one, two and three register blocks of tokens
        kv.rollback(3)
        batch = kv.forward(IDS[3:3 + width], logits_to_keep=width)
        assert torch.equal(batch, steps[:width]), width


@needs_library
@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_the_16_lane_build_agrees_with_this_machines_build(tiny, monkeypatch, weights):
    """On x86 with AVX2 but not AVX-512 the fma kernel and the elementwise code run in 8-lane
    vectors (NF_V8; GCC kept 16-lane vectors in memory there); -DNF_NO_V8 builds the 16-lane code
    every other CPU runs. Both are transformers' forward (on the int8-rounded weights for int8)
    up to the order of float32 sums, and both give a verification forward the one-token steps'
    logits bit for bit (elsewhere the two builds are the same code)."""
    default = nb.NativeKV(nb.NativeModel(tiny, kernel="fma", weights=weights)).forward(IDS, len(IDS))
    default_path = nb.library_path()
    monkeypatch.setattr(nb.build, "_LIB", None)  # restored after the test: the default build again
    monkeypatch.setattr(nb.build, "_LIB_ERROR", None)
    monkeypatch.setenv(nb.CFLAGS_ENV, "-DNF_NO_V8")
    nm = nb.NativeModel(tiny, kernel="fma", weights=weights)
    assert nb.library_path() != default_path and nb.library_path().exists()  # its own build
    kv = nb.NativeKV(nm)
    wide = kv.forward(IDS, len(IDS))
    torch.testing.assert_close(wide, default, atol=2e-5, rtol=1e-4)
    ref = _hf(tiny if weights == "bf16" else _dequantised_int8(tiny), IDS)
    torch.testing.assert_close(wide, ref, atol=2e-5, rtol=1e-4)
    kv.rollback(3)
    steps = torch.cat([kv.forward([i]) for i in IDS[3:12]])
    kv.rollback(3)
    assert torch.equal(kv.forward(IDS[3:12], logits_to_keep=9), steps)


def _dequantised_int8(model):
    """A copy of ``model`` whose linear weights (the head too, not the embedding) are their
    per-row int8 roundings (absmax / 127, round to nearest), as float32."""
    import copy
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if p.dim() == 2 and "embed_tokens" not in name:
                scale = p.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127
                p.copy_(torch.round(p / scale).clamp(-127, 127) * scale)
    return out


@needs_library
def test_int8_weights_are_transformers_forward_over_the_rounded_weights():
    """native-int8: int8 weights with one scale a row, widened to float32 in the fma kernel;
    on the same token ids it gives transformers' logits for the dequantised weights up to the
    order of float32 sums, at about half the weight bytes of BF16."""
    model = tiny_llama(seed=4, layers=3, hidden=64)
    nm = nb.NativeModel(model, kernel="fma", weights="int8")
    ours = nb.NativeKV(nm).forward(IDS, len(IDS))
    torch.testing.assert_close(ours, _hf(_dequantised_int8(model), IDS), atol=2e-5, rtol=1e-4)
    assert (ours - _hf(model, IDS)).abs().max() > 1e-4  # the rounding is there (0.004 here)
    bf16 = nb.NativeModel(model, kernel="fma")
    scales = sum(t.numel() * 4 for t in nm.scales)
    assert nm.weight_bytes == (bf16.weight_bytes - 7 * 64 * 4) // 2 + 7 * 64 * 4 + scales
    assert len(nm.scales) == 4 * 3 + 1 and nm.scales[-1].numel() == 32  # vocab 32 rows
    with pytest.raises(ValueError, match="use bf16, int8, w8a8"):
        nb.NativeModel(model, weights="int4")


def _fake_quantised_activations(model):
    """``model`` (a :func:`_dequantised_int8` copy) with every linear's input rounded as
    native-w8a8 rounds it: per token and 32 values, s = max|x| / 127, x -> round(x * (127 /
    max|x|)) * s (to nearest even). Returns the hook handles."""
    def hook(_module, args):
        x = args[0]
        blocks = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
        amax = blocks.abs().amax(-1, keepdim=True)
        inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
        return ((torch.round(blocks * inv).clamp(-127, 127) * (amax / 127.0)).reshape(x.shape),)
    return [m.register_forward_pre_hook(hook) for m in model.modules()
            if isinstance(m, torch.nn.Linear)]


@needs_library
def test_w8a8_is_transformers_forward_over_rounded_weights_and_activations():
    """native-w8a8: native-int8's weights times int8 activations (one scale per 32 values),
    summed exactly per 32 products; on the same ids it gives transformers' logits for the
    dequantised weights with every linear's input rounded the same way, up to float32 rounding
    (which can move an activation across a rounding boundary: the tolerance is a few steps of
    1/127)."""
    model = tiny_llama(seed=4, layers=3, hidden=64)
    nm = nb.NativeModel(model, weights="w8a8")
    ours = nb.NativeKV(nm).forward(IDS, len(IDS))
    ref_model = _dequantised_int8(model)
    hooks = _fake_quantised_activations(ref_model)
    try:
        ref = _hf(ref_model, IDS)
    finally:
        for h in hooks:
            h.remove()
    torch.testing.assert_close(ours, ref, atol=2e-3, rtol=1e-3)
    int8 = nb.NativeKV(nb.NativeModel(model, weights="int8")).forward(IDS, len(IDS))
    assert (ours - int8).abs().max() > 1e-3  # the activation rounding is there
    assert nm.weight_bytes == nb.NativeModel(model, weights="int8").weight_bytes


def _w8a8_builds() -> list:
    """Extra compiler flags of the integer kernel's other paths this CPU can run: the portable C
    (what a CPU without AVX2 runs), and on a CPU with AVX512-VNNI the AVX2 path (built without
    AVX-512) and the VNNI path without its 512-bit registers' other uses."""
    flags = set(nb.build.cpu_flags().split())
    builds = [pytest.param("-DNF_NO_I8A_AVX2", id="portable")]
    if "avx512_vnni" in flags:
        builds.append(pytest.param("-DNF_NO_VNNI", id="avx2-on-avx512"))
        builds.append(pytest.param("-mno-avx512f", id="avx2-only"))
    return builds


@needs_library
@pytest.mark.parametrize("extra", _w8a8_builds())
def test_w8a8_every_kernel_path_gives_the_same_numbers(tiny, monkeypatch, extra):
    """The integer kernel's paths (AVX512-VNNI, AVX2, portable C) quantise the same way and sum
    each 32 products exactly in int32, then in the same float32 order: the same logits bit for
    bit, for one forward and for one-token steps."""
    default_kv = nb.NativeKV(nb.NativeModel(tiny, weights="w8a8"))
    default = default_kv.forward(IDS, len(IDS))
    default_kv.rollback(4)
    default_steps = torch.cat([default_kv.forward([i]) for i in IDS[4:9]])
    monkeypatch.setattr(nb.build, "_LIB", None)  # restored after the test: the default build again
    monkeypatch.setattr(nb.build, "_LIB_ERROR", None)
    monkeypatch.setenv(nb.CFLAGS_ENV, extra)
    kv = nb.NativeKV(nb.NativeModel(tiny, weights="w8a8"))
    assert torch.equal(kv.forward(IDS, len(IDS)), default)
    kv.rollback(4)
    assert torch.equal(torch.cat([kv.forward([i]) for i in IDS[4:9]]), default_steps)


@needs_library
@pytest.mark.parametrize("weights", ["int8", "w8a8"])
@pytest.mark.parametrize("threads", [1, 2])
def test_an_int8_verification_forward_equals_one_token_steps_bit_for_bit(threads, weights):
    kv = nb.NativeKV(nb.NativeModel(tiny_llama(seed=4, layers=3, hidden=64), weights=weights,
                                    threads=threads))
    kv.forward(IDS[:3])
    steps = torch.cat([kv.forward([i]) for i in IDS[3:12]])
    for width in (2, 4, 5, 9):
        kv.rollback(3)
        assert torch.equal(kv.forward(IDS[3:3 + width], logits_to_keep=width), steps[:width]), width


@needs_library
def test_one_thread_and_two_give_the_same_numbers(tiny):
    one = nb.NativeKV(nb.NativeModel(tiny, threads=1)).forward(IDS, len(IDS))
    two = nb.NativeKV(nb.NativeModel(tiny, threads=2)).forward(IDS, len(IDS))
    assert torch.equal(one, two)


@needs_library
@pytest.mark.parametrize("weights", ["bf16", "int8", "w8a8"])
def test_rollback_then_refeed_equals_feeding_once(tiny, weights):
    """Rollback by length on every weight format, and the hidden states a drafter reads: those of
    a verification forward are the one-token steps' bit for bit."""
    kv = nb.NativeKV(nb.NativeModel(tiny, weights=weights))
    kv.forward(IDS[:6])
    expected = kv.forward(IDS[6:10], logits_to_keep=4)
    kv.forward([8, 8, 8], logits_to_keep=3)  # rejected tokens
    kv.rollback(6)
    assert kv.length == 6 and kv.ids == IDS[:6]
    assert torch.equal(kv.forward(IDS[6:10], logits_to_keep=4), expected)
    kv.rollback(6)
    _, feats = kv.forward_features(IDS[6:10], 4, (0, 2, 3))
    kv.rollback(6)
    steps = torch.cat([kv.forward_features([i], 1, (0, 2, 3))[1] for i in IDS[6:10]])
    assert feats.shape == (4, 3 * 64) and torch.equal(feats, steps)
    kv.rollback(10)  # nothing to drop
    assert kv.length == 10
    kv.reset()
    assert kv.length == 0 and kv.ids == []


@needs_library
def test_the_cache_grows_past_its_first_capacity(tiny, monkeypatch):
    ids = [(7 * i) % 31 + 1 for i in range(40)]
    nm = nb.NativeModel(tiny)
    monkeypatch.setattr(nb.model, "MIN_CAPACITY", 16)
    kv = nb.NativeKV(nm, capacity=16)
    kv.forward(ids[:10])
    kv.forward(ids[10:30])  # 16 -> 32 positions, the first 10 copied
    assert kv.capacity == 32
    last = kv.forward(ids[30:], logits_to_keep=10)  # 32 -> 64
    assert kv.capacity == 64 and kv.length == 40
    fresh = nb.NativeKV(nm, capacity=64).forward(ids, logits_to_keep=10)
    assert torch.equal(last, fresh)


@needs_library
def test_head_dim_not_a_multiple_of_16_and_a_vocabulary_padded_to_whole_blocks():
    """head_dim 8 takes the scalar attention path; a 30-token vocabulary pads the output head
    to 32 rows, of which only 30 are returned."""
    model = bf16_valued(tiny_llama(seed=5, vocab_size=30, layers=2, hidden=32))
    kv = nb.NativeKV(nb.NativeModel(model, kernel="fma"))
    ids = [5, 9, 1, 22, 7, 3, 29, 12]
    ours = kv.forward(ids, logits_to_keep=8)
    assert ours.shape == (8, 30)
    torch.testing.assert_close(ours, _hf(model, ids), atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="outside 0..29"):
        kv.forward([30])
    assert kv.length == 8  # the refused forward left the cache as it was


@needs_library
@pytest.mark.parametrize("weights", ["bf16", "int8", "w8a8"])
def test_engine_greedy_speculative_equals_plain_on_the_native_backend(weights):
    from specdemo.core.drafters import NgramDrafter
    from specdemo.core.engine import generate
    from specdemo.core.policy import FixedDraftLength
    nm = nb.NativeModel(tiny_llama(seed=3, layers=3, hidden=64), weights=weights)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    tok = CharTokenizer()
    runs = {name: generate(nb.NativeKV(nm), prompt, tok, drafter=drafter,
                           policy=FixedDraftLength(4), max_new_tokens=40)
            for name, drafter in (("plain", None), ("ngram", NgramDrafter()))}
    assert runs["ngram"].stats.drafted > 0
    assert runs["ngram"].token_ids == runs["plain"].token_ids


@needs_library
def test_backend_selection_and_refusals(tiny, monkeypatch):
    loaded = _Loaded(tiny)
    try:
        chosen, choice = backend_choice.with_backend(loaded, "native")
        assert (chosen.backend, choice.reason) == ("native", "asked for")
        assert isinstance(backends.target_kv(chosen), nb.NativeKV)
        assert nb.native_model(loaded) is nb.native_model(loaded)  # built once per model
        assert {"native", "native-int8", "native-w8a8"} <= set(backends.candidate_backends(loaded)[0])
        chosen, choice = backend_choice.with_backend(loaded, "native-int8")
        assert (chosen.backend, choice.reason) == ("native-int8", "asked for")
        kv = backends.target_kv(chosen)
        assert kv.nmodel.weights == "int8" and kv.backend == "native-int8"
        assert kv.nmodel is not nb.native_model(loaded)  # the BF16 one is kept apart
        chosen, _ = backend_choice.with_backend(loaded, "native-w8a8")
        kv = backends.target_kv(chosen)
        assert kv.nmodel.weights == "w8a8" and kv.backend == "native-w8a8"
    finally:
        delattr(tiny, nb._ATTR)
        delattr(tiny, nb._ATTR + "_int8")
        delattr(tiny, nb._ATTR + "_w8a8")
    quantized = _Loaded(tiny)
    quantized.quantization = "int4"
    with pytest.raises(nb.NativeError, match="--quantization int4 is a transformers path"):
        backend_choice.with_backend(quantized, "native")
    tiny.config.model_type = "gemma"
    try:
        assert nb.unsupported_reason(tiny) == (
            "the native backend computes Llama-architecture targets; this one is 'gemma'")
    finally:
        tiny.config.model_type = "llama"
    odd = tiny_llama(seed=0, layers=1, hidden=48)
    assert "multiples of 32" in nb.unsupported_reason(odd)
    monkeypatch.setenv(nb.KERNEL_ENV, "avx9000")
    with pytest.raises(nb.NativeError, match="avx9000 is not a native kernel"):
        nb.default_kernel()


def test_without_a_c_compiler_the_backend_says_so_and_auto_leaves_it_out(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))  # no library built here yet
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(nb.build.shutil, "which", lambda name: None)
    monkeypatch.setattr(nb.build, "_LIB", None)
    monkeypatch.setattr(nb.build, "_LIB_ERROR", None)
    model = tiny_llama(seed=0, layers=1)
    loaded = _Loaded(model)
    reason = nb.unavailable_reason(loaded)
    assert reason.startswith("the native backend needs a C compiler")
    names, why = backends.candidate_backends(loaded)
    assert not set(family_backends("native")) & set(names)
    assert f"native not available: {reason}" in why
    with pytest.raises(nb.NativeError, match="needs a C compiler"):
        backend_choice.with_backend(loaded, "native")


@needs_library
def test_costs_on_the_native_backend_report_its_bytes(tiny, monkeypatch):
    from specdemo.services import costs
    nm = nb.NativeModel(tiny)
    setattr(tiny, nb._ATTR, nm)
    try:
        monkeypatch.setattr(costs, "measure_bandwidth_GBps", lambda *a, **k: 8.0)
        loaded = _Loaded(tiny, backend="native")
        loaded.load_s, loaded.source = 0.0, "t"
        report = costs.measure_costs(loaded, max_n=3, context=8, repeats=1, plain_tokens=4)
        # 3 layers of [q;k;v] (64+32+32), o (64), [gate;up] (256), down (64) rows of 64 or
        # 128 BF16 columns; the head (32 x 64 BF16); norms 7 x 64 float32
        per_layer = (128 * 64 + 64 * 64 + 256 * 64 + 64 * 128) * 2
        expected = 3 * per_layer + 32 * 64 * 2 + 7 * 64 * 4
        assert nm.weight_bytes == expected == report.weight_bytes
        assert report.backend == "native" and report.fast_path is None
        assert list(report.forward_s) == [1, 2, 3] and report.forward_ratio[1] == 1.0
        assert "BF16 weights (from float32)" in costs.format_report(report)
    finally:
        delattr(tiny, nb._ATTR)


@pytest.mark.slow
@needs_library
def test_builtin_model_on_the_native_backend_agrees_with_float32():
    from specdemo.core.kv import KVModel
    from specdemo.models.loading import load_model
    loaded = load_model("builtin:smollm2-135m", device="cpu", dtype="float32")
    ids = loaded.tokenizer("The capital of France is Paris. The capital of Germany is").input_ids
    ref = KVModel(loaded.model).forward(ids, len(ids))
    for kernel in KERNELS:
        ours = nb.NativeKV(nb.NativeModel(loaded.model, kernel=kernel)).forward(ids, len(ids))
        # measured (2-core AMD EPYC): max |diff| 0.20 (fma) and 0.24-0.36 (dpbf16) for logits
        # of magnitude ~20; argmax equal at every position
        assert (ours - ref).abs().mean() < 0.1, kernel
        assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9, kernel
    # int8 weights, and int8 activations too: measured mean |diff| 0.23 and 0.32 (max 1.4, 1.9),
    # argmax equal at all 12 positions
    for weights in ("int8", "w8a8"):
        ours = nb.NativeKV(nb.NativeModel(loaded.model, weights=weights)).forward(ids, len(ids))
        assert (ours - ref).abs().mean() < 0.5, weights
        assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9, weights


def test_a_cc_that_names_no_program_is_refused_not_replaced(monkeypatch, tmp_path):
    """CC set by the user names the compiler to use: when it is not found, say so (rather than
    quietly building with another one)."""
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(nb.build, "_LIB", None)
    monkeypatch.setattr(nb.build, "_LIB_ERROR", None)
    with pytest.raises(nb.NativeError, match=r"CC=/nonexistent/cc, which was not found; unset CC"):
        nb.library()


@needs_library
def test_an_unknown_kernel_leaves_native_out_of_auto_with_the_reason(monkeypatch):
    monkeypatch.setenv(nb.KERNEL_ENV, "bogus")
    loaded = _Loaded(tiny_llama(seed=0, layers=1))
    reason = nb.unavailable_reason(loaded)
    assert reason == f"{nb.KERNEL_ENV}=bogus is not a native kernel; use fma or dpbf16"
    names, why = backends.candidate_backends(loaded)
    assert not set(family_backends("native")) & set(names)
    assert f"native not available: {reason}" in why


@needs_library
def test_training_features_captured_on_native_match_transformers(tmp_path, monkeypatch):
    """``train-draft --capture-backend native``: the shards have the same layout, ids and
    prompt lengths as the float32 capture, and features and final hidden states equal it within
    the fma kernel's float32 summation order (BF16-valued weights), for answers of two lengths."""
    from specdemo.services.training import data
    model = bf16_valued(tiny_llama(seed=5, layers=3, hidden=64))
    loaded = _Loaded(model)
    answers = [{"ids": IDS, "n_prompt": 4}, {"ids": IDS[:7] + [11, 13], "n_prompt": 3}]
    layers = (1, 2, 3)
    ref = data.capture_features(loaded, answers, layers, tmp_path / "hf", shard_size=1)
    monkeypatch.setenv("SPECDEMO_NATIVE_KERNEL", "fma")
    got = data.capture_features(loaded, answers, layers, tmp_path / "nat", shard_size=1,
                                backend="native")
    assert [p.name for p in got] == [p.name for p in ref] == ["00000.pt", "00001.pt"]
    for a, b in zip(ref, got):
        (x,), (y,) = torch.load(a, weights_only=False), torch.load(b, weights_only=False)
        assert torch.equal(x["ids"], y["ids"]) and x["n_prompt"] == y["n_prompt"]
        assert x["features"].shape == y["features"].shape and y["features"].dtype == torch.float16
        torch.testing.assert_close(y["features"].float(), x["features"].float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(y["last"].float(), x["last"].float(), atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="capture backend 'gpu'"):
        data.capture_features(loaded, answers, layers, tmp_path / "x", backend="gpu")


@needs_library
def test_the_matmul_benchmark_script_still_compiles(tmp_path):
    """scripts/native_mm_bench.c includes native_forward.c and calls its matmul: a change of
    that signature must reach the script (it once did not)."""
    import shutil
    import subprocess
    from pathlib import Path
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    script = Path(__file__).resolve().parent.parent / "scripts" / "native_mm_bench.c"
    run = subprocess.run([cc, "-fsyntax-only", "-std=gnu11", str(script)], capture_output=True,
                         text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]


@needs_library
def test_backend_divergence_top1_agreement_counts_answer_positions():
    """scripts/backend_divergence.py's teacher-forced measure: a backend agrees with its own
    greedy answer at every position, and an answer with one token changed loses that position
    (and may lose the ones after it, whose context changed)."""
    import importlib.util
    from pathlib import Path
    from specdemo.core.engine import generate
    path = Path(__file__).resolve().parent.parent / "scripts" / "backend_divergence.py"
    spec = importlib.util.spec_from_file_location("backend_divergence", path)
    bd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bd)
    nm = nb.NativeModel(tiny_llama(seed=4, layers=3, hidden=64), weights="w8a8")
    prompt = IDS[:5]
    answer = generate(nb.NativeKV(nm), prompt, CharTokenizer(), max_new_tokens=12).token_ids
    assert bd.top1_agreement(nb.NativeKV(nm), prompt, answer) == (len(answer), len(answer))
    wrong = [answer[0] ^ 1] + answer[1:]
    agree, positions = bd.top1_agreement(nb.NativeKV(nm), prompt, wrong)
    assert positions == len(answer) and agree <= len(answer) - 1
    assert bd.top1_agreement(nb.NativeKV(nm), prompt, []) == (0, 0)


@needs_library
@pytest.mark.parametrize("weights", ["bf16", "w8a8"])
def test_a_batch_of_sequences_gives_each_the_logits_it_gets_alone(weights):
    """NativeBatch: three sequences of different lengths, prefilled in one forward with a
    mix of prompts and then stepped together (one slot left out of a step, one slot reused
    after a reset), give each token the logits a NativeKV of its sequence alone gives it."""
    nm = nb.NativeModel(tiny_llama(seed=4, layers=3, hidden=64), weights=weights, threads=2)
    seqs = [IDS[:5], IDS[2:9], IDS[7:10]]
    follow = [[18, 2, 27, 4], [9, 1, 22], [3, 30, 12, 4]]
    alone = []
    for seq, more in zip(seqs, follow):
        kv = nb.NativeKV(nm)
        first = kv.forward(seq)
        alone.append([first] + [kv.forward([t]) for t in more])
    batch = nb.NativeBatch(nm, slots=4, positions=16)
    out = batch.forward([(2, seqs[0]), (0, seqs[1]), (3, seqs[2])])
    for row, i in enumerate([0, 1, 2]):
        assert torch.equal(out[row], alone[i][0][0])
    slot_of, done = (2, 0, 3), [0, 0, 0]  # follow-up tokens fed so far per sequence
    for step in range(4):
        active = [0, 1, 2] if step != 1 else [0, 2]  # sequence 1 waits a step
        out = batch.forward([(slot_of[i], [follow[i][done[i]]]) for i in active])
        for row, i in enumerate(active):
            done[i] += 1
            assert torch.equal(out[row], alone[i][done[i]][0]), (step, i)
    assert done == [4, 3, 4]
    batch.reset(3)  # slot 3 again from position 0: the same numbers as a fresh sequence
    assert torch.equal(batch.forward([(3, seqs[0])])[0], alone[0][0][0])
    with pytest.raises(ValueError, match="it has 16"):
        batch.forward([(0, [1] * 9)])
    with pytest.raises(ValueError, match="once each"):
        batch.forward([(0, [1]), (0, [2])])
    assert batch.lengths == [10, 0, 9, 5]


@needs_library
def test_the_prefetch_setting_does_not_change_the_numbers(tiny):
    """Prefetching is a hint to the memory system: every setting gives the same logits."""
    lib = nb.library()
    before = (lib.nf_prefetch_min(), lib.nf_prefetch_distance())
    try:
        outs = []
        for narrowest, distance in ((6, 4096), (1, 4096), (1, 8192), (1, 0)):
            lib.nf_set_prefetch(narrowest, distance)
            assert (lib.nf_prefetch_min(), lib.nf_prefetch_distance()) == (narrowest, distance)
            kv = nb.NativeKV(nb.NativeModel(tiny, weights="w8a8"))
            outs.append(torch.cat([kv.forward(IDS, len(IDS)), kv.forward(IDS[:5], 5)]))
        assert all(torch.equal(o, outs[0]) for o in outs[1:])
    finally:
        lib.nf_set_prefetch(*before)


class _Others:
    """A stand-in for machine.OtherCpuUse: other processes used ``share`` of the CPU."""
    share_value = 0.0

    def share(self):
        return self.share_value


@needs_library
def test_the_prefetch_choice_is_measured_once_stored_and_asked_for_by_name(tiny, monkeypatch, tmp_path):
    from specdemo.core import machine
    lib = nb.library()
    before = (lib.nf_prefetch_min(), lib.nf_prefetch_distance())
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    monkeypatch.setattr(machine, "OtherCpuUse", _Others)
    nm = nb.NativeModel(tiny, weights="w8a8")
    try:
        first = nb.choose_prefetch(nm, repeats=2)
        assert first["prefetch"] in ("all", "wide")
        assert lib.nf_prefetch_min() == (1 if first["prefetch"] == "all" else 6)
        assert set(first["cost_s"]) == {"all", "wide"} and all(v > 0 for v in first["cost_s"].values())
        stored = json.loads((tmp_path / nb.PREFETCH_FILE).read_text())
        assert [e["prefetch"] for e in stored.values()] == [first["prefetch"]]
        # the stored choice is reused without measuring (a stored "all" is set even after "wide")
        key = next(iter(stored))
        stored[key]["prefetch"] = "all"
        (tmp_path / nb.PREFETCH_FILE).write_text(json.dumps(stored))
        lib.nf_set_prefetch(6, -1)
        again = nb.choose_prefetch(nm)
        assert again["reason"].startswith("measured earlier on this machine")
        assert lib.nf_prefetch_min() == 1
        # by name, and a name it does not know
        monkeypatch.setenv(nb.PREFETCH_ENV, "wide")
        assert nb.choose_prefetch(nm)["prefetch"] == "wide" and lib.nf_prefetch_min() == 6
        monkeypatch.setenv(nb.PREFETCH_ENV, "sometimes")
        with pytest.raises(nb.NativeError, match="not a prefetch setting"):
            nb.choose_prefetch(nm)
        # measured on a busy machine: used, not stored
        monkeypatch.setenv(nb.PREFETCH_ENV, "recalibrate")
        monkeypatch.setattr(_Others, "share_value", 0.9)
        busy = nb.choose_prefetch(nm, repeats=2)
        assert "not stored" in busy["reason"]
        assert json.loads((tmp_path / nb.PREFETCH_FILE).read_text())[key]["prefetch"] == "all"
    finally:
        lib.nf_set_prefetch(*before)


@needs_library
def test_the_w8a8_backend_chooses_its_prefetch_when_built(tiny, monkeypatch):
    monkeypatch.setenv(nb.PREFETCH_ENV, "all")
    lib = nb.library()
    before = (lib.nf_prefetch_min(), lib.nf_prefetch_distance())
    try:
        nm = nb.native_model(_Loaded(tiny_llama(seed=5, layers=2, hidden=64)), weights="w8a8")
        assert nm.prefetch["prefetch"] == "all" and lib.nf_prefetch_min() == 1
        assert nb.native_model(_Loaded(tiny_llama(seed=5, layers=2, hidden=64)), weights="int8").prefetch is None
    finally:
        lib.nf_set_prefetch(*before)


@needs_library
def test_costs_on_native_w8a8_say_which_blocks_prefetch(monkeypatch):
    from specdemo.services import costs
    monkeypatch.setenv(nb.PREFETCH_ENV, "wide")
    monkeypatch.setattr(costs, "measure_bandwidth_GBps", lambda *a, **k: 8.0)
    loaded = _Loaded(tiny_llama(seed=6, layers=2, hidden=64), backend="native-w8a8")
    loaded.load_s, loaded.source = 0.0, "t"
    report = costs.measure_costs(loaded, max_n=2, context=8, repeats=1, plain_tokens=4)
    assert report.native_prefetch["prefetch"] == "wide"
    assert f"native-w8a8 weight prefetch: {nb.PREFETCH_ENV}=wide" in costs.format_report(report)


@needs_library
def test_bench_records_the_prefetch_choice_of_native_w8a8(monkeypatch):
    from specdemo.services.bench.run import machine_info
    monkeypatch.setenv(nb.PREFETCH_ENV, "all")
    loaded = _Loaded(tiny_llama(seed=7, layers=2, hidden=64), backend="native-w8a8")
    info = machine_info(loaded)
    assert info["native_prefetch"]["prefetch"] == "all"
    assert "native_prefetch" not in machine_info(_Loaded(tiny_llama(seed=7, layers=2, hidden=64)))


@needs_library
@pytest.mark.parametrize("backend", ["native", "native-int8", "native-w8a8"])
def test_self_drafts_with_the_targets_own_forward(backend):
    """``--draft self`` on a native backend drafts through a second cache of the same C forward
    (``pipeline.self_draft_kv``), not the float32 transformers model: its greedy drafts are the
    target's own, so every one is accepted, and the output is plain's."""
    from specdemo.core.drafters import ModelDrafter
    from specdemo.core.engine import generate
    from specdemo.core.policy import FixedDraftLength
    from specdemo.services.pipeline import Pipeline
    loaded = _Loaded(tiny_llama(seed=6, layers=3, hidden=64), backend=backend)
    pipe = Pipeline(loaded, "self")
    drafter = pipe.new_drafter()
    assert isinstance(drafter, ModelDrafter) and isinstance(drafter.kv, nb.NativeKV)
    assert drafter.kv is not pipe.kv and drafter.kv.nmodel is pipe.kv.nmodel
    prompt, tok = [1, 2, 3, 4, 5, 6, 7], CharTokenizer()
    spec = generate(pipe.kv, prompt, tok, drafter=drafter, policy=FixedDraftLength(4),
                    max_new_tokens=30)
    plain = generate(pipe.kv, prompt, tok, max_new_tokens=30)
    assert spec.stats.drafted > 0 and spec.stats.accepted == spec.stats.drafted
    assert spec.token_ids == plain.token_ids


@needs_library
def test_reserve_sizes_the_cache_before_a_prefill_and_changes_no_number(tiny, monkeypatch):
    """A race reserves room for its prompt before the clock starts (``StaticCacheKV.reserve``):
    the prefill then does not grow the cache, and its logits are the same."""
    ids = [(7 * i) % 31 + 1 for i in range(40)]
    nm = nb.NativeModel(tiny)
    monkeypatch.setattr(nb.model, "MIN_CAPACITY", 16)
    grown = nb.NativeKV(nm, capacity=16).forward(ids, logits_to_keep=5)
    kv = nb.NativeKV(nm, capacity=16)
    assert kv.capacity == 16
    kv.reserve(len(ids) + 1)
    assert kv.capacity == 64
    before = kv.k_cache
    assert torch.equal(kv.forward(ids, logits_to_keep=5), grown)
    assert kv.k_cache is before  # no new allocation inside the forward


@needs_library
def test_training_features_captured_on_native_w8a8_are_the_int8_forwards(tmp_path):
    """``--capture-backend native-w8a8``: the features are those of the int8 forward (what a head
    reads where ``auto`` picks it): close to float32's within int8 rounding, and not the BF16 ones."""
    from specdemo.services.training import data
    model = bf16_valued(tiny_llama(seed=5, layers=3, hidden=64))
    loaded = _Loaded(model)
    answers = [{"ids": IDS, "n_prompt": 4}]
    layers = (1, 2, 3)
    ref, bf16, w8 = (torch.load(data.capture_features(loaded, answers, layers, tmp_path / name, shard_size=1,
                                                      backend=backend)[0], weights_only=False)[0]
                     for name, backend in (("hf", "transformers"), ("bf", "native"), ("w8", "native-w8a8")))
    kv = nb.NativeKV(nb.native_model(loaded, "w8a8"))
    _, direct = kv.forward_features(IDS, 1, layers + (3,))
    torch.testing.assert_close(w8["features"].float(), direct[:, :-64].half().float())
    err = (w8["features"].float() - ref["features"].float()).abs().max()
    assert 0 < err < 0.25 * ref["features"].float().abs().max()
    assert not torch.equal(w8["features"], bf16["features"])
