"""``python -m specdemo costs``: the JSON shape, the byte count and the guarded ratios."""

import json

import pytest
import torch

import specdemo
from specdemo.services import costs
from specdemo.models import loading as models
from specdemo.interfaces.cli import main
from specdemo.models.loading import LoadedModel
from tiny import CharTokenizer, tiny_llama

KEYS = {"target", "device", "dtype", "quantization", "threads", "clock", "context", "forward_s",
        "forward_ratio", "weight_bytes", "bandwidth_GBps", "bound_tokens_per_s",
        "plain_tokens_per_s", "plain_vs_bound", "load_average", "fast_path", "stock_forward_s",
        "stock_forward_ratio", "notes", "backend", "backend_choice", "backends", "llama_bench", "omp_wait",
        "native_prefetch"}


def _loaded(model) -> LoadedModel:
    return LoadedModel("tiny", model, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0,
                       "test")


def _untied_bytes(model) -> int:
    """Every parameter except the input embedding (a forward reads only its token rows)."""
    return 4 * sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)


def test_weight_bytes_skip_the_input_embedding_unless_it_is_the_head():
    model = tiny_llama(seed=0, vocab_size=32, layers=2, hidden=32)
    assert costs.weight_bytes_per_forward(model) == _untied_bytes(model)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied: the head reads all of it once
    params = {id(p): p for p in model.parameters()}.values()
    assert costs.weight_bytes_per_forward(model) == 4 * sum(p.numel() for p in params)


def test_costs_json_shape_on_a_tiny_model(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))  # auto stores its choice there
    monkeypatch.setenv("SPECDEMO_INT8_COMPILE", "0")  # auto measures the int8 backend: eager here
    model = tiny_llama(seed=0, layers=2)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: _loaded(model))
    monkeypatch.setattr(costs, "measure_bandwidth_GBps", lambda *a, **k: 8.0)
    assert main(["costs", "--target", "tiny", "--max-n", "4", "--context", "8",
                 "--repeats", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == KEYS
    assert list(out["forward_s"]) == ["1", "2", "3", "4"]  # JSON object keys are strings
    assert all(s > 0 for s in out["forward_s"].values())
    assert out["forward_ratio"]["1"] == 1.0
    assert out["forward_ratio"]["3"] == pytest.approx(out["forward_s"]["3"] / out["forward_s"]["1"])
    assert out["backends"]["transformers"]["weight_bytes"] == _untied_bytes(model)
    if "int8" in out["backends"]:  # a candidate only where the native backends are not
        assert out["backends"]["int8"]["weight_bytes"] == model._specdemo_int8.weight_bytes
    assert out["weight_bytes"] == out["backends"][out["backend"]]["weight_bytes"]
    assert out["bandwidth_GBps"] == 8.0
    assert out["bound_tokens_per_s"] == pytest.approx(8e9 / out["weight_bytes"])
    assert out["plain_vs_bound"] == pytest.approx(out["plain_tokens_per_s"] / out["bound_tokens_per_s"])
    assert (out["context"], out["dtype"], out["quantization"]) == (8, "float32", None)
    assert out["threads"] == torch.get_num_threads()
    assert out["omp_wait"] == specdemo.OMP_WAIT  # how this process's OpenMP threads wait, and why
    assert out["fast_path"] is None  # not loaded through load_model: nothing was patched
    assert out["stock_forward_s"] is None and out["stock_forward_ratio"] is None
    # auto: a float32 Llama without a GGUF file has the transformers backend, and the native
    # ones where a C compiler is found (else torch's int8), each measured once; the report is
    # the one auto chose
    from specdemo.core import family_backends
    from specdemo.models.native import unavailable_reason
    names = ["transformers"] + (["int8"] if unavailable_reason(_loaded(model))
                                else list(family_backends("native")))
    assert out["backend"] in names
    assert sorted(out["backends"]) == sorted(names)
    assert out["backends"][out["backend"]]["forward_s"] == out["forward_s"]
    assert out["backend_choice"]["backend"] == out["backend"]
    assert out["backend_choice"]["reason"].startswith("measured: ")
    assert out["llama_bench"] is None


def test_before_after_alternates_stock_and_fast_kernels(monkeypatch, tmp_path):
    from specdemo.models import fastpath
    from specdemo.core.kv import KVModel
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    model = tiny_llama(seed=0, layers=2, hidden=64)
    with pytest.raises(ValueError, match="fast path is not applied"):
        costs.forward_s_before_after(KVModel(model), 3, 8, 1, 1)
    fastpath.speed_up(model, rows=(1, 2, 4), min_weight_bytes=0)
    before, after = costs.forward_s_before_after(KVModel(model), 3, 8, 1, 2)
    assert sorted(before) == sorted(after) == [1, 2, 3]
    assert fastpath.fastpath_info(model).applied  # left with the fast path on
    report = costs.measure_costs(_loaded(model), max_n=3, context=8, repeats=1, plain_tokens=3,
                                 before_after_rounds=1)
    assert report.stock_forward_ratio[1] == 1.0 and set(report.stock_forward_s) == {1, 2, 3}
    assert "| 2 |" in costs.format_report(report) and "before: forward_s" in costs.format_report(report)


def test_costs_table_and_refusals(monkeypatch, capsys):
    report = costs.CostReport("t", "cpu", "float32", None, 2, "wall", 16, {1: 0.01, 2: 0.012},
                              {1: 1.0, 2: 1.2}, 1000, 7.5, 7.5e6, None, None, 0.5)
    text = costs.format_report(report)
    assert "| 2 | 12.0 | 1.20 |" in text and "plain_tokens_per_s n/a" in text
    assert main(["costs", "--max-n", "0"]) == 2
    assert "--max-n and --context must be >= 1" in capsys.readouterr().err

    def refuse(*a, **k):
        raise models.ModelLoadError("int4 uses torchao's CPU int4 kernel; on cuda use 4bit")
    monkeypatch.setattr(models, "load_model", refuse)
    assert main(["costs", "--quantization", "int4", "--device", "cpu"]) == 2
    assert "int4 uses torchao's CPU int4 kernel" in capsys.readouterr().err


def test_bandwidth_is_positive_and_finite():
    gbps = costs.measure_bandwidth_GBps("cpu", nbytes=8 << 20, repeats=2)
    assert 0 < gbps < 1e4


def test_llama_bench_ratio_is_the_chosen_backends(monkeypatch, capsys, tmp_path):
    """ours_over_llama_bench compares llama-bench with the backend auto chose (the one run,
    compare and the app use), not with another one that happened to be measured."""
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    monkeypatch.setenv("SPECDEMO_INT8_COMPILE", "0")
    model = tiny_llama(seed=0, layers=2)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: _loaded(model))
    monkeypatch.setattr(costs, "measure_bandwidth_GBps", lambda *a, **k: 8.0)
    monkeypatch.setattr(costs, "run_llama_bench",
                        lambda path, threads: {"command": "llama-bench (stub)", "tg_tokens_per_s": 50.0})
    assert main(["costs", "--target", "tiny", "--max-n", "2", "--context", "8", "--repeats", "1",
                 "--llama-bench", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    lb = out["llama_bench"]
    assert lb["ours_backend"] == out["backend"]
    assert lb["ours_over_llama_bench"] == pytest.approx(out["plain_tokens_per_s"] / 50.0)
    assert set(lb["by_backend"]) == set(out["backends"])
    assert lb["by_backend"][out["backend"]] == pytest.approx(lb["ours_over_llama_bench"])
