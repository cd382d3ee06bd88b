"""The CPU fast path: every kernel computes what transformers' own forward computes, and greedy
decoding through it (plain and speculative) gives the unpatched model's tokens."""

import pytest
import torch
import torch.nn.functional as F

from specdemo.models import fastpath
from specdemo.core.drafters import make_drafter
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.core.machine import OtherCpuUse
from specdemo.core.policy import FixedDraftLength
from tiny import CharTokenizer, tiny_llama

TOK = CharTokenizer()
PROMPT = TOK.encode("the cat sat on the mat. the cat sat on the")


def _kernels():
    """Kernels that can run here (packed needs oneDNN)."""
    packable = fastpath.pack_weight(torch.zeros(4, 4)) is not None
    return [k for k in fastpath.KERNELS if k != "packed" or packable]


@pytest.mark.parametrize("shape", [(128, 32), (64, 48), (96, 32), (16, 32)])
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_blocked_linear_equals_linear(shape, rows):
    """64-row blocks (128 rows), one block (<= 64 rows), fallback (96 rows: 64 does not divide)."""
    torch.manual_seed(0)
    weight, bias = torch.randn(shape), torch.randn(shape[0])
    x = torch.randn(1, rows, shape[1])
    got = fastpath.blocked_linear(x, weight, bias)
    assert got.shape == (1, rows, shape[0])
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def _logits_by_width(model, widths=range(1, 9)):
    """Logits of a forward over n = 1..8 new tokens after a 12-token context, per n."""
    kv = KVModel(model)
    out = {}
    for n in widths:
        kv.reset()
        kv.forward(PROMPT[:12])
        out[n] = kv.forward(PROMPT[12:12 + n], logits_to_keep=n)
    return out


@pytest.mark.parametrize("kernel", _kernels())
def test_each_kernel_gives_the_unpatched_logits_for_1_to_8_rows(kernel):
    model = tiny_llama(seed=2, layers=2, hidden=64)
    stock = _logits_by_width(model)
    info = fastpath.speed_up(model, force=kernel)
    assert info.applied and info.linears == 2 * 7 + 1  # q k v o gate up down per layer + head
    assert all(info.kernels[n] == kernel for n in range(1, 17))
    fast = _logits_by_width(model)
    for n in range(1, 9):
        torch.testing.assert_close(fast[n], stock[n], rtol=1e-5, atol=1e-5)
        assert torch.equal(fast[n].argmax(-1), stock[n].argmax(-1))
    fastpath.restore(model)
    assert all(torch.equal(a, b) for a, b in zip(_logits_by_width(model).values(), stock.values()))


@pytest.mark.parametrize("kernel", _kernels())
def test_greedy_plain_and_speculative_through_the_fast_path_equal_unpatched_plain(kernel):
    model = tiny_llama(seed=0, layers=4)
    plain = generate(KVModel(model), PROMPT, TOK, max_new_tokens=40)
    fastpath.speed_up(model, force=kernel)
    fast_plain = generate(KVModel(model), PROMPT, TOK, max_new_tokens=40)
    assert fast_plain.token_ids == plain.token_ids
    for spec in ("ngram", "self"):
        run = generate(KVModel(model), PROMPT, TOK, drafter=make_drafter(spec, model, 32),
                       policy=FixedDraftLength(7), max_new_tokens=40)
        assert run.token_ids == plain.token_ids
        assert run.stats.drafted > 0


def other_processes_use(monkeypatch, share: float) -> None:
    """Other processes' share of the CPU during every calibration, as OtherCpuUse reports it."""
    monkeypatch.setattr(OtherCpuUse, "share", lambda self: share)


def test_calibration_picks_a_kernel_per_row_count_and_is_reused(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    other_processes_use(monkeypatch, 0.05)  # quiet, whoever else shares this machine now
    model = tiny_llama(seed=1, layers=2, hidden=64)
    info = fastpath.speed_up(model, rows=(1, 2, 4), min_weight_bytes=0)
    assert info.applied and not info.cached and info.calibrate_s > 0
    assert info.reason == "" and info.other_cpu_share == 0.05
    assert sorted(info.kernels) == [1, 2, 3, 4]
    assert info.kernels[3] == info.kernels[2]  # rows between timed counts use the one below
    assert set(info.timings_s) == set(_kernels())
    assert all(sorted(t) == [1, 2, 4] and min(t.values()) > 0 for t in info.timings_s.values())
    for n in (1, 2, 4):  # the choice is linear unless another kernel was >= 10% faster
        chosen = info.kernels[n]
        assert chosen == "linear" or (
            info.timings_s[chosen][n] < fastpath.MARGIN * info.timings_s["linear"][n])
    assert info.extra_memory_bytes == 0 or "packed" in info.kernels.values()
    assert fastpath.fastpath_info(model) is info
    again = fastpath.speed_up(tiny_llama(seed=5, layers=2, hidden=64), rows=(1, 2, 4),
                              min_weight_bytes=0)  # same shapes, other weights: same choice
    assert again.cached and again.kernels == info.kernels and again.calibrate_s == 0.0
    assert again.other_cpu_share is None  # nothing measured: the cache answered
    assert (tmp_path / fastpath.CACHE_FILE).is_file()
    other = fastpath.speed_up(tiny_llama(seed=1, layers=3, hidden=64), rows=(1, 2, 4),
                              min_weight_bytes=0)
    assert not other.cached  # another model shape is calibrated afresh
    monkeypatch.setenv("SPECDEMO_FASTPATH", "recalibrate")
    assert not fastpath.speed_up(model, rows=(1, 2, 4), min_weight_bytes=0).cached


@pytest.mark.skipif(fastpath.pack_weight(torch.randn(8, 8)) is None, reason="oneDNN cannot pack here")
def test_a_stored_packed_choice_packs_each_weight_on_its_first_use(monkeypatch, tmp_path):
    """A load that finds the packed kernel in the stored choice packs nothing (a target that
    another backend runs never holds the second copy); a forward of a row count that uses it
    packs each weight once, counts its bytes, and computes what F.linear computes."""
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    other_processes_use(monkeypatch, 0.05)
    monkeypatch.setattr(fastpath, "_pick", lambda seconds: "packed")  # what a calibration chose
    first = fastpath.speed_up(tiny_llama(seed=1, layers=2, hidden=64), rows=(1, 2, 4),
                              min_weight_bytes=0)
    assert not first.cached and set(first.kernels.values()) == {"packed"}
    model = tiny_llama(seed=3, layers=2, hidden=64)
    info = fastpath.speed_up(model, rows=(1, 2, 4), min_weight_bytes=0)
    linears = fastpath.linear_modules(model)
    assert info.cached and info.extra_memory_bytes == 0
    assert not any(hasattr(m, "_specdemo_packed") for m in linears)
    m = linears[0]
    x = torch.randn(1, 2, m.in_features)
    torch.testing.assert_close(m(x), F.linear(x, m.weight, m.bias), rtol=1e-4, atol=1e-5)
    assert hasattr(m, "_specdemo_packed") and not hasattr(linears[1], "_specdemo_packed")
    assert info.extra_memory_bytes == m.weight.numel() * m.weight.element_size()
    m(x)  # packed once
    assert info.extra_memory_bytes == m.weight.numel() * m.weight.element_size()
    fastpath.restore(model)
    assert not any(hasattr(m, "_specdemo_packed") for m in linears)


def test_a_weight_oneDNN_cannot_pack_runs_F_linear(monkeypatch):
    model = tiny_llama(seed=1, layers=2, hidden=64)
    monkeypatch.setattr(fastpath, "pack_weight", lambda weight: None)
    fastpath.install(model, fastpath.FastPathInfo(True, kernels={1: "packed", 2: "packed"}))
    m = fastpath.linear_modules(model)[0]
    x = torch.randn(1, 2, m.in_features)
    assert torch.equal(m(x), F.linear(x, m.weight, m.bias))
    assert not hasattr(m, "_specdemo_packed") and fastpath.fastpath_info(model).extra_memory_bytes == 0


def test_left_alone_when_disabled_or_small(monkeypatch):
    model = tiny_llama(seed=1)
    info = fastpath.speed_up(model)
    assert not info.applied and "too small" in info.reason
    monkeypatch.setenv("SPECDEMO_FASTPATH", "0")
    info = fastpath.speed_up(model, force="blocked")
    assert not info.applied and info.reason == "SPECDEMO_FASTPATH=0"
    assert not any("forward" in m.__dict__ for m in model.modules())
    with pytest.raises(ValueError, match="unknown kernel"):
        monkeypatch.delenv("SPECDEMO_FASTPATH")
        fastpath.speed_up(model, force="magic")


def test_a_calibration_on_a_busy_machine_keeps_linear_and_is_not_stored(monkeypatch, tmp_path,
                                                                         caplog):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    monkeypatch.setattr(fastpath, "_pick", lambda seconds: "blocked")  # what a quiet run chose
    other_processes_use(monkeypatch, 0.43)
    model = tiny_llama(seed=1, layers=2, hidden=64)
    with caplog.at_level("WARNING", logger="specdemo.models.fastpath"):
        info = fastpath.speed_up(model, rows=(1, 2, 4), min_weight_bytes=0)
    note = "machine busy during calibration (others used 43% of the CPU): kept F.linear, not stored"
    assert info.applied and not info.cached and info.reason == note
    assert info.other_cpu_share == 0.43
    assert info.kernels == {1: "linear", 2: "linear", 3: "linear", 4: "linear"}
    assert sorted(info.timings_s["linear"]) == [1, 2, 4]  # what was measured stays inspectable
    assert info.extra_memory_bytes == 0  # no packed copies kept for kernels never used
    assert not (tmp_path / fastpath.CACHE_FILE).exists()
    assert note in caplog.text
    # The next load, on a quiet machine, calibrates again and stores what it chose.
    other_processes_use(monkeypatch, 0.1)
    quiet = fastpath.speed_up(tiny_llama(seed=1, layers=2, hidden=64), rows=(1, 2, 4),
                              min_weight_bytes=0)
    assert not quiet.cached and quiet.reason == ""
    assert set(quiet.kernels.values()) == {"blocked"}
    assert (tmp_path / fastpath.CACHE_FILE).is_file()
    assert fastpath.speed_up(model, rows=(1, 2, 4), min_weight_bytes=0).kernels == quiet.kernels
