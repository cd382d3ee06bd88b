"""Quantised targets: refusals with reasons, torchao int8/int4 on a tiny model, and what greedy
speculative decoding on a quantised target does (equal to plain where the kernel batches
row by row; otherwise the divergence is reported)."""

import pytest
import torch

from specdemo.models import fastpath, loading as models, quantize
from specdemo.core.drafters import make_drafter
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.models.loading import ModelLoadError, load_model
from specdemo.services.pipeline import first_divergence
from specdemo.core.policy import FixedDraftLength
from tiny import CharTokenizer, tiny_llama

torchao = pytest.importorskip("torchao")

TOK = CharTokenizer()
PROMPT = TOK.encode("the cat sat on the mat. the cat sat on the")


def test_refusals_say_why_and_what_to_use():
    assert quantize.unavailable_reason("int4", "cpu") is None
    assert quantize.unavailable_reason("int8", "cpu") is None
    assert quantize.unavailable_reason("int8", "cuda") is None
    assert "needs a CUDA GPU" in quantize.unavailable_reason("4bit", "cpu")
    assert "use int4 or int8 (torchao) on a CPU" in quantize.unavailable_reason("8bit", "mps")
    assert "CPU int4 kernel" in quantize.unavailable_reason("int4", "cuda")
    assert "no Apple MPS kernels" in quantize.unavailable_reason("int8", "mps")
    assert "unknown quantization '3bit'" in quantize.unavailable_reason("3bit", "cpu")
    assert models.quantization_unavailable(torch.device("cpu"), "int4") is None


def test_missing_torchao_is_explained(monkeypatch):
    monkeypatch.setattr(quantize, "_has", lambda name: name != "torchao")
    assert quantize.unavailable_reason("int4", "cpu") == (
        "int4 quantization needs the torchao package (pip install torchao)")


def _quantised(kind: str):
    model = tiny_llama(seed=1, vocab_size=32, layers=2, hidden=64)  # widths 64/128: int4 groups
    reference = tiny_llama(seed=1, vocab_size=32, layers=2, hidden=64)
    assert quantize.quantize_model(model, kind) == 2 * 7 + 1  # every linear, the head included
    return model, reference


@pytest.mark.parametrize("kind, min_cosine", [("int8", 0.999), ("int4", 0.98)])
def test_quantised_logits_stay_close_to_float32(kind, min_cosine):
    model, reference = _quantised(kind)
    assert type(model.lm_head.weight.data).__module__.startswith("torchao")
    assert fastpath.linear_modules(model) == []  # quantised layers are not the fast path's
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        got = model(ids).logits.float()[0]
        want = reference(ids).logits[0]
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    assert cosine.min() > min_cosine  # a broken quantisation gives noise (cosine ~0)


@pytest.mark.parametrize("kind, row_by_row", [("int4", True), ("int8", False)])
def test_which_quantised_linears_compute_each_row_alone(kind, row_by_row):
    """torchao's CPU int4 kernel gives each row of an n-row product bit-identical to that row
    alone (what one-token steps compute); int8 weight-only does not."""
    model, _ = _quantised(kind)
    layer = model.model.layers[0].mlp.down_proj
    torch.manual_seed(0)
    same = []
    with torch.inference_mode():
        for n in range(2, 9):
            x = torch.randn(1, n, layer.in_features, dtype=model.dtype)
            alone = torch.cat([layer(x[:, i:i + 1]) for i in range(n)], dim=1)
            same.append(torch.equal(layer(x), alone))
    assert same == [row_by_row] * 7


def test_int4_in_a_float32_model_keeps_greedy_speculative_equal_to_plain():
    """int4 layers compute each row alone and everything else is float32: speculative greedy
    output must equal plain greedy output, as for an unquantised float32 target."""
    model, _ = _quantised("int4")
    plain = generate(KVModel(model), PROMPT, TOK, max_new_tokens=40)
    for spec in ("ngram", "self"):
        for k in (2, 6):
            run = generate(KVModel(model), PROMPT, TOK, drafter=make_drafter(spec, model, 32),
                           policy=FixedDraftLength(k), max_new_tokens=40)
            assert run.token_ids == plain.token_ids
            assert run.stats.drafted > 0


@pytest.mark.parametrize("kind, dtype", [("int8", torch.float32), ("int4", torch.bfloat16)])
def test_greedy_speculative_on_a_quantised_target_reports_its_divergence(kind, dtype):
    """int8 weight-only batches rows together, and a bfloat16 model's attention batches
    differently from one-token steps: greedy speculative output may leave plain greedy's, and
    the comparison must say exactly where, agreeing with plain before that."""
    model, _ = _quantised(kind)
    model.model.to(dtype)  # embeddings, attention, norms (the int4 layers cast for themselves)
    plain = generate(KVModel(model), PROMPT, TOK, max_new_tokens=30)
    for spec in ("ngram", "self"):
        run = generate(KVModel(model), PROMPT, TOK, drafter=make_drafter(spec, model, 32),
                       policy=FixedDraftLength(6), max_new_tokens=30)
        where = first_divergence(plain.token_ids, run.token_ids)
        if where is None:
            assert run.token_ids == plain.token_ids
        else:
            assert run.token_ids[:where] == plain.token_ids[:where]
            assert run.token_ids[where] != plain.token_ids[where]
        assert run.stats.drafted > 0


def test_load_model_quantises_int4_and_refuses_bitsandbytes_on_cpu(tmp_path):
    from test_models import tiny_model, tiny_tokenizer  # hidden 32: int4 groups of 32
    tiny_model(tied=True).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    try:
        loaded = load_model(str(tmp_path), "cpu", "float32", quantization="int4")
        assert loaded.dtype == torch.float32 and loaded.quantization == "int4"
        model = loaded.model
        assert type(model.model.layers[0].mlp.up_proj.weight).__name__ == "Int4OpaqueTensor"
        assert type(model.lm_head.weight).__name__ == "Int4OpaqueTensor"  # untied, then quantised
        assert model.get_input_embeddings().weight.dtype == torch.float32  # the rest stays float32
        logits = loaded.model(torch.tensor([[1, 2, 3]])).logits
        assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
        with pytest.raises(ModelLoadError, match="4bit/8bit quantization needs a CUDA GPU"):
            load_model(str(tmp_path), "cpu", quantization="8bit")
    finally:
        models.clear_loaded()


def test_hardware_check_offers_int4_on_a_cpu_only():
    from specdemo.models.hardware import HardwareInfo, quantization_support
    cpu = HardwareInfo("cpu", "Fake CPU", 24 << 30, 20 << 30, 2, 24 << 30, 20 << 30)
    gpu = HardwareInfo("cuda", "Fake GPU", 8 << 30, 7 << 30, 8, 32 << 30, 30 << 30)
    assert quantization_support(cpu, "int4") == (
        True, "torchao int4 weight-only (CPU) available")
    ok, why = quantization_support(gpu, "int4")
    assert not ok and "CPU int4 kernel" in why
    ok, why = quantization_support(cpu, "4bit")
    assert not ok and "needs an NVIDIA GPU" in why
