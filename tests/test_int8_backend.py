"""The int8 target backend (specdemo/models/compiled_backend.py) on tiny random Llamas, against
the same weights in transformers float32; the built-in model only in slow tests.

Tolerances: weights and activations are rounded to int8 (per output channel, per row), so the
logits of a random float32 tiny Llama move by ~2% of their range; the bounds below were
measured on these seeds with a margin (see each test). Exact comparisons where the arithmetic is
exact: the integer matrix product, a row against the same row in a batch, a rollback against the
same feed done once.
"""

from __future__ import annotations

import pytest
import torch

from specdemo.models import compiled_backend as cb
from specdemo.models import backends
from specdemo.services import backend_choice
from tiny import CharTokenizer, LoadedStandIn, tiny_llama


@pytest.fixture(autouse=True)
def eager(monkeypatch):
    """Eager layer steps (compiling takes 10-20 s per graph here); the compiled step has its
    own slow tests."""
    monkeypatch.setenv(cb.COMPILE_ENV, "0")


_Loaded = LoadedStandIn  # what the backends read of a models.LoadedModel


@pytest.fixture(scope="module")
def tiny():
    """(transformers model, Int8Model) of one 3-layer random Llama, hidden 64."""
    model = tiny_llama(seed=3, layers=3, hidden=64)
    return model, cb.Int8Model(model)


def _hf(model, ids, layers=()):
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=bool(layers))
    if not layers:
        return out.logits[0]
    return out.logits[0], torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)


IDS = [5, 9, 1, 22, 7, 3, 30, 12, 4, 4, 18, 2, 27]


def test_quantize_rows_known_values():
    q, scale = cb.quantize_rows(torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]]))
    assert q.dtype == torch.int8
    assert q.tolist() == [[64, -127, 32], [0, 0, 0]]  # 63.5 rounds to even, 31.75 to 32
    assert scale.tolist() == pytest.approx([2 / 127, 1.0])


def test_compiling_uses_a_kernel_inductor_can_compile(monkeypatch):
    monkeypatch.setenv(cb.COMPILE_ENV, "1")
    monkeypatch.delenv(cb.KERNEL_ENV, raising=False)
    assert cb.default_kernel() == "int_mm"
    monkeypatch.setenv(cb.KERNEL_ENV, "onednn")  # refused: inductor needs frozen weights for it
    assert cb.default_kernel() == "int_mm"
    monkeypatch.setenv(cb.COMPILE_ENV, "0")
    assert cb.default_kernel() == ("onednn" if cb.onednn_available() and cb.onednn_exact() else "int_mm")


def test_without_vnni_the_int8_backend_uses_int_mm(monkeypatch):
    """oneDNN's u8 x s8 kernel sums pairs in saturating 16 bits on x86 without VNNI (seen on an
    AVX2 AMD EPYC): the default there is int_mm, even when oneDNN is asked for."""
    import platform
    monkeypatch.delenv(cb.COMPILE_ENV, raising=False)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    from specdemo.core import machine
    monkeypatch.setattr(machine, "cpu_flags", lambda: "fpu sse2 avx2 fma")
    assert not cb.onednn_exact()
    monkeypatch.setenv(cb.KERNEL_ENV, "onednn")
    assert cb.default_kernel() == "int_mm"
    monkeypatch.setattr(machine, "cpu_flags", lambda: "fpu avx2 avx512f avx512_vnni")
    assert cb.onednn_exact()
    assert cb.default_kernel() == ("onednn" if cb.onednn_available() else "int_mm")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert cb.onednn_exact()


NO_VNNI = "oneDNN's int8 sums saturate on x86 without VNNI (onednn_exact); the backend uses int_mm here"


def test_smoothing_factors_known_values():
    x_amax = torch.tensor([4.0, 1.0, 0.0])
    w = torch.tensor([[1.0, -4.0, 2.0], [0.5, 1.0, 1.0]])  # column maxima 1, 4, 2
    s = cb.smoothing(x_amax, w)
    assert s.tolist() == pytest.approx([2.0, 0.5, 1.0])  # sqrt(4/1), sqrt(1/4), zero channel: 1
    x = torch.tensor([[4.0, -1.0, 0.0]])
    torch.testing.assert_close((x / s) @ (w * s).t(), x @ w.t())


@pytest.mark.parametrize("kernel", ["int_mm", "onednn", "fbgemm"])
def test_int8_linear_is_the_integer_product_and_rows_do_not_depend_on_the_batch(kernel):
    if kernel == "fbgemm" and "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("this torch build has no fbgemm")
    if kernel == "onednn" and not cb.onednn_available():
        pytest.skip("this torch build has no oneDNN int8 linear")
    if kernel == "onednn" and not cb.onednn_exact():
        pytest.skip(NO_VNNI)
    torch.manual_seed(0)
    w, x = torch.randn(48, 40), torch.randn(5, 40)
    x[:, 3] *= 20  # an outlier channel: the pinned range must still be each row's own
    lin = cb.Int8Linear(w[:16], w[16:], kernel=kernel)  # two matrices fused along the outputs
    y = lin(x)
    q, sw = cb.quantize_rows(w)
    sx = x.abs().amax(-1, keepdim=True) / 127
    xq = torch.round(x / sx).clamp(-127, 127)
    expected = (xq.double() @ q.double().t()) * sx.double() * sw.double()
    if kernel != "fbgemm":
        torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)
    else:  # uint8 codes with a zero point over [-127, 127]: steps of 254/255, not 1
        torch.testing.assert_close(y.double(), expected, rtol=0,
                                   atol=0.02 * expected.abs().max().item())
    for i in range(5):
        assert torch.equal(lin(x[i:i + 1])[0], y[i])  # exact: integer sums, per-row scales
    assert lin.nbytes == 48 * 40 + 48 * 4
    torch.testing.assert_close(y, x @ w.t(), atol=0.05 * (x @ w.t()).abs().max().item(), rtol=0)


def test_logits_match_float32_within_int8_tolerance(tiny):
    model, q = tiny
    kv = cb.Int8KV(q)
    ours = kv.forward(IDS, logits_to_keep=len(IDS))
    ref = _hf(model, IDS)
    assert ours.shape == (len(IDS), 32) and ours.dtype == torch.float32
    # measured on this seed: max |diff| 0.0065 (0.0070 without smoothing) for logits up to 0.41
    # in magnitude; argmax equal
    # at 13 of 13 positions
    assert (ours - ref).abs().max() < 0.02
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9
    assert kv.length == len(IDS) and kv.ids == IDS


def test_without_rounding_the_forward_is_transformers_own(tiny, monkeypatch):
    """The forward itself (norms, rotary, attention, cache, and the smoothing factors folded into
    norms, up and down) equals transformers' to float precision when the int8 rounding is taken
    out: what is left is the quantisation."""
    model, _ = tiny

    class FloatLinear:
        def __init__(self, *weights):
            self.w, self.nbytes = torch.cat([w.detach() for w in weights]), 0

        def __call__(self, x):
            return x @ self.w.t()

    monkeypatch.setattr(cb, "Int8Linear", FloatLinear)
    kv = cb.Int8KV(cb.Int8Model(model))
    kv.forward(IDS[:4])
    ours = kv.forward(IDS[4:], logits_to_keep=len(IDS) - 4)
    torch.testing.assert_close(ours, _hf(model, IDS)[4:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["int_mm", "onednn"])
def test_a_verification_forward_equals_one_token_steps_bit_for_bit(tiny, kernel, monkeypatch):
    """With the int_mm and oneDNN kernels every row's products are exact integers scaled
    elementwise, and attention is computed per query: a forward over k + 1 tokens gives each
    position exactly the logits one-token steps give it (what makes speculative output equal
    plain output here)."""
    if kernel == "onednn" and not cb.onednn_available():
        pytest.skip("this torch build has no oneDNN int8 linear")
    if kernel == "onednn" and not cb.onednn_exact():
        pytest.skip(NO_VNNI)
    monkeypatch.setenv(cb.KERNEL_ENV, kernel)
    q = cb.Int8Model(tiny[0])
    assert q.head.kernel == kernel
    kv = cb.Int8KV(q)
    kv.forward(IDS[:5])
    batch = kv.forward(IDS[5:], logits_to_keep=len(IDS) - 5)
    kv.rollback(5)
    steps = torch.cat([kv.forward([i]) for i in IDS[5:]])
    assert torch.equal(batch, steps)


def test_incremental_forwards_match_one_forward(tiny):
    model, q = tiny
    once = cb.Int8KV(q).forward(IDS, logits_to_keep=len(IDS))
    kv = cb.Int8KV(q)
    parts = [kv.forward(IDS[:6], logits_to_keep=6), kv.forward(IDS[6:7]),
             kv.forward(IDS[7:], logits_to_keep=len(IDS) - 7)]
    # Attention sums over other key counts, and fbgemm's float epilogue differs in the last bits
    # between batch sizes (measured 1.9e-6 on a 128-wide linear); such a difference can move one
    # activation across a rounding boundary of the next layer's int8 quantisation, which moves
    # the logits by a quantisation step: measured up to 0.0053 here (logits up to 0.41)
    torch.testing.assert_close(torch.cat(parts), once, atol=0.02, rtol=0)
    assert torch.equal(torch.cat(parts).argmax(-1), once.argmax(-1))


def test_rollback_then_refeed_equals_feeding_once(tiny):
    model, q = tiny
    kv = cb.Int8KV(q)
    kv.forward(IDS[:6])
    expected = kv.forward(IDS[6:10], logits_to_keep=4)
    kv.forward([8, 8, 8], logits_to_keep=3)  # rejected tokens
    kv.rollback(6)
    assert kv.length == 6 and kv.ids == IDS[:6]
    assert torch.equal(kv.forward(IDS[6:10], logits_to_keep=4), expected)
    kv.rollback(10)  # nothing to drop
    assert kv.length == 10


def test_the_cache_grows_past_its_first_capacity(tiny, monkeypatch):
    model, q = tiny
    ids = [(7 * i) % 31 + 1 for i in range(40)]
    monkeypatch.setattr(cb, "MIN_CAPACITY", 16)
    kv = cb.Int8KV(q, capacity=16)
    kv.forward(ids[:10])
    kv.forward(ids[10:30])  # 16 -> 32 positions, the first 10 copied
    assert kv.capacity == 32
    last = kv.forward(ids[30:], logits_to_keep=10)  # 32 -> 64
    assert kv.capacity == 64 and kv.length == 40
    fresh = cb.Int8KV(q, capacity=64).forward(ids, logits_to_keep=10)
    torch.testing.assert_close(last, fresh, atol=0.02, rtol=0)  # as in the test above


def test_hidden_states_have_the_right_shape_and_match_transformers(tiny):
    model, q = tiny
    layers = (0, 1, 3)  # embeddings, input of layer 1, output after the final norm
    kv = cb.Int8KV(q)
    kv.forward(IDS[:5])
    logits, feats = kv.forward_features(IDS[5:], 2, layers)
    _, ref_feats = _hf(model, IDS, layers)
    assert logits.shape == (2, 32) and feats.shape == (len(IDS) - 5, 3 * 64)
    torch.testing.assert_close(feats[:, :64], ref_feats[5:, :64], atol=0, rtol=0)  # a lookup
    # measured on this seed: max |diff| 0.0004 (layer 1 input, values up to 0.06) and 0.033
    # (after the final norm, values up to 3.0)
    assert (feats[:, 64:128] - ref_feats[5:, 64:128]).abs().max() < 0.002
    assert (feats[:, 128:] - ref_feats[5:, 128:]).abs().max() < 0.1
    same = cb.Int8KV(q)
    same.forward(IDS[:5])
    assert torch.equal(logits, same.forward(IDS[5:], logits_to_keep=2))  # the same forward
    with pytest.raises(ValueError, match=r"hidden state\(s\) \[4\] do not exist"):
        kv.forward_features([1], 1, (4,))


def test_engine_greedy_speculative_equals_plain_on_the_int8_backend(tiny):
    from specdemo.core.drafters import NgramDrafter
    from specdemo.core.engine import generate
    from specdemo.core.policy import FixedDraftLength
    model, q = tiny
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    tok = CharTokenizer()
    runs = {name: generate(cb.Int8KV(q), prompt, tok, drafter=drafter,
                           policy=FixedDraftLength(4), max_new_tokens=40)
            for name, drafter in (("plain", None), ("ngram", NgramDrafter()))}
    assert runs["ngram"].stats.drafted > 0
    assert runs["ngram"].token_ids == runs["plain"].token_ids


def test_backend_selection_and_refusals(tiny):
    model, q = tiny
    loaded = _Loaded(model)
    setattr(model, cb._ATTR, q)  # as int8_model() leaves it
    try:
        chosen, choice = backend_choice.with_backend(loaded, "int8")
        assert (chosen.backend, choice.reason) == ("int8", "asked for")
        assert isinstance(backends.target_kv(chosen), cb.Int8KV)
        assert cb.int8_model(loaded) is q  # built once per model
    finally:
        delattr(model, cb._ATTR)
    quantized = _Loaded(model)
    quantized.quantization = "int4"
    with pytest.raises(cb.Int8Error, match="--quantization int4 is a transformers path"):
        backend_choice.with_backend(quantized, "int8")
    half = tiny_llama(seed=0, layers=1).to(torch.bfloat16)
    with pytest.raises(cb.Int8Error, match="quantises float32 weights; this target is torch.bfloat16"):
        cb.int8_model(_Loaded(half))
    model.config.model_type = "gemma"
    try:
        assert cb.unsupported_reason(model) == (
            "the int8 backend computes Llama-architecture targets; this one is 'gemma'")
    finally:
        model.config.model_type = "llama"


def test_costs_on_the_int8_backend_report_its_bytes(tiny, monkeypatch):
    from specdemo.services import costs
    model, q = tiny
    setattr(model, cb._ATTR, q)
    try:
        monkeypatch.setattr(costs, "measure_bandwidth_GBps", lambda *a, **k: 8.0)
        loaded = _Loaded(model, backend="int8")
        loaded.load_s, loaded.source = 0.0, "t"
        report = costs.measure_costs(loaded, max_n=3, context=8, repeats=1, plain_tokens=4)
        # 3 layers of [q;k;v] (64+32+32), o (64), [gate;up] (256), down (64) rows of 64 or 128
        # int8 columns plus a float32 scale per row; the head (32 x 64); norms 7 x 64 float32
        per_layer = 128 * 64 + 64 * 64 + 256 * 64 + 64 * 128 + (128 + 64 + 256 + 64) * 4
        expected = 3 * per_layer + 32 * 64 + 32 * 4 + 7 * 64 * 4
        assert q.weight_bytes == expected == report.weight_bytes
        assert report.backend == "int8" and report.fast_path is None
        assert list(report.forward_s) == [1, 2, 3] and report.forward_ratio[1] == 1.0
    finally:
        delattr(model, cb._ATTR)


@pytest.mark.slow
def test_the_compiled_step_equals_the_eager_one_and_decodes_the_same(tiny, monkeypatch):
    from specdemo.core.drafters import NgramDrafter
    from specdemo.core.engine import generate
    from specdemo.core.policy import FixedDraftLength
    model, _ = tiny
    monkeypatch.setenv(cb.KERNEL_ENV, "int_mm")
    q = cb.Int8Model(model)
    eager = cb.Int8KV(q)
    eager.forward(IDS[:6])
    expected = eager.forward(IDS[6:10], logits_to_keep=4)
    monkeypatch.setenv(cb.COMPILE_ENV, "1")
    kv = cb.Int8KV(q)
    kv.forward(IDS[:6])  # 6 <= COMPILE_MAX_WIDTH: compiled
    torch.testing.assert_close(kv.forward(IDS[6:10], logits_to_keep=4), expected,
                               atol=1e-4, rtol=0)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    tok = CharTokenizer()
    plain = generate(cb.Int8KV(q), prompt, tok, max_new_tokens=30)
    spec = generate(cb.Int8KV(q), prompt, tok, drafter=NgramDrafter(),
                    policy=FixedDraftLength(4), max_new_tokens=30)
    assert spec.stats.drafted > 0 and spec.token_ids == plain.token_ids


@pytest.mark.slow
def test_builtin_model_on_the_int8_backend_agrees_with_float32():
    from specdemo.models.loading import load_model
    from specdemo.core.kv import KVModel
    loaded = load_model("builtin:smollm2-135m", "cpu", "float32")
    kv = backends.target_kv(backend_choice.with_backend(loaded, "int8")[0])
    ids = loaded.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    ours = kv.forward(ids, logits_to_keep=len(ids))
    ref = KVModel(loaded.model).forward(ids, logits_to_keep=len(ids))
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.75
