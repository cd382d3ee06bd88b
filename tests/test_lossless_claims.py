"""Issue 20 item 5 / issue 21 item 10: in a reduced precision greedy speculative output can
differ from plain greedy; the page, ``compare`` (text and JSON) and ``/race`` say so before the
race, with the reason, and offer float32 for an exact check. Tiny models in bfloat16 on the CPU."""

import json

import pytest
import torch

from specdemo.interfaces import cli
from specdemo.services.pipeline import (REDUCED_PRECISION_REASON, DecodeSettings, Pipeline,
                               lossless_expectation)
from specdemo.services.race import PLAIN, SPECULATIVE, Lane, Race, RaceSnapshot
from specdemo.interfaces.ui_format import verdict_html
from test_learned_presets import save_target
from test_warmup import Loaded
from tiny import tiny_llama

WHY = "batched verification in a reduced precision can differ from one-token steps"


def test_expectation_per_dtype_and_quantisation():
    assert lossless_expectation(torch.float32) == (True, None)
    assert lossless_expectation("float32") == (True, None)
    for dtype in (torch.bfloat16, "float16"):
        expected, why = lossless_expectation(dtype)
        name = str(dtype).replace("torch.", "")
        assert expected is False
        assert why == f"the target runs in {name}: {REDUCED_PRECISION_REASON}" and WHY in why
    expected, why = lossless_expectation(torch.float32, "int4")
    assert expected is False and why.startswith("the target runs with int4 weights") and WHY in why
    assert lossless_expectation(torch.float32, "none") == (True, None)


def test_a_target_on_llama_cpp_kernels_is_not_expected_to_be_exact():
    from types import SimpleNamespace
    from specdemo.services.pipeline import GGML_REASON, target_lossless_expectation
    for backend in ("ggml", "ggml-bf16"):
        target = SimpleNamespace(dtype=torch.float32, quantization=None, backend=backend)
        expected, why = target_lossless_expectation(target)
        assert expected is False and why == (f"the target runs on llama.cpp's kernels (backend "
                                             f"{backend}): {GGML_REASON}")
    for backend in ("transformers", "int8", "native"):  # int8, native: exact by construction
        # (their own tests)
        target = SimpleNamespace(dtype=torch.float32, quantization=None, backend=backend)
        assert target_lossless_expectation(target) == (True, None)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-target")
    save_target(tiny_llama(seed=11, vocab_size=64, layers=2), path)
    return path


def compare(folder, dtype, capsys):
    code = cli.main(["compare", "--target", str(folder), "--draft", "ngram", "--dtype", dtype,
                     "--device", "cpu", "--max-new-tokens", "8", "--prompt", "w1 w2 w3 w1 w2",
                     "--json", "--backend", "transformers"])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def test_compare_says_before_the_race_that_bfloat16_may_differ(folder, capsys, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    code, result, err = compare(folder, "bfloat16", capsys)
    assert code == 0
    assert result["lossless_expected"] is False
    assert result["lossless_note"] == f"the target runs in bfloat16: {REDUCED_PRECISION_REASON}"
    notice = [line for line in err.splitlines() if line.startswith("note: ")]
    assert len(notice) == 1 and WHY in notice[0] and "--dtype float32" in notice[0]
    # said before the timed runs: the notice comes before the warm-up steps in stderr
    assert err.index("note: ") < err.index("warming up")


def test_compare_in_float32_expects_identical_outputs_and_says_nothing(folder, capsys, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    code, result, err = compare(folder, "float32", capsys)
    assert code == 0 and result["lossless_expected"] is True and result["lossless_note"] is None
    assert "note: " not in err and result["identical"] is True


def test_compare_text_output_names_float32(folder, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    assert cli.main(["compare", "--target", str(folder), "--draft", "ngram", "--dtype", "bfloat16",
                     "--device", "cpu", "--max-new-tokens", "6", "--prompt", "w1 w2 w1",
                     "--backend", "transformers"]) == 0
    out = capsys.readouterr().out
    line = [x for x in out.splitlines() if x.startswith("lossless expected: ")]
    assert line == [f"lossless expected: no (the target runs in bfloat16: {REDUCED_PRECISION_REASON}"
                    "; --dtype float32 for an exact check)"]


def race(model, temperature=0.0):
    messages = [{"role": "user", "content": "the cat sat on the mat. the cat"}]
    loaded = Loaded(model)
    plain, spec = Pipeline(loaded, "none"), Pipeline(loaded, "self")
    r = Race([Lane(PLAIN, False, lambda: plain, messages),
              Lane(SPECULATIVE, True, lambda: spec, messages)],
             DecodeSettings(max_new_tokens=12, draft_length=3, temperature=temperature))
    return r, list(r.run(min_interval_s=0.0))


def test_the_page_badge_says_why_in_bfloat16_before_and_after(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    r, snaps = race(tiny_llama(seed=12, layers=2).to(torch.bfloat16))
    final = snaps[-1]
    assert r.lossless_expected is False and final.lossless_note == r.lossless_note
    assert final.lossless_note == f"the target runs in bfloat16: {REDUCED_PRECISION_REASON}"
    badge = verdict_html(final, 0.0)
    assert WHY in badge and "float32" in badge
    if final.identical:
        assert 'data-lossless-expected="false"' in badge and "not guaranteed" in badge
    else:
        assert "Reason: the target runs in bfloat16" in badge
    # Before the outputs are compared (a lane still running), the chip says so up front.
    running = RaceSnapshot(final.panes, SPECULATIVE, lossless_note=final.lossless_note)
    early = verdict_html(running, 0.0)
    assert 'class="sd-chip sd-precision"' in early and WHY in early and "--dtype float32" in early
    # Sampling (temperature > 0) makes no lossless claim token for token: no precision chip.
    assert "sd-precision" not in verdict_html(running, 0.7)


def test_the_page_badge_in_float32_makes_no_reduced_precision_claim(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    r, snaps = race(tiny_llama(seed=12, layers=2))
    final = snaps[-1]
    assert r.lossless_expected is True and final.lossless_note is None and final.identical
    badge = verdict_html(final, 0.0)
    assert "lossless: identical output (12 tokens)</span>" in badge
    assert "reduced precision" not in badge and "sd-precision" not in badge


def test_preset_line_warns_before_a_race_in_a_reduced_precision():
    from specdemo.interfaces.ui import precision_line
    assert precision_line("float32", None, "cpu") == ""
    assert precision_line("auto", None, "cpu") == ""  # auto is float32 on a CPU
    line = precision_line("bfloat16", None, "cpu")
    assert "the target runs in bfloat16" in line and WHY in line and "float32" in line
    assert "int4 weights" in precision_line("float32", "int4", "cpu")
