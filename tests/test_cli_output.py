"""Issue 12 item 4: presets recommend what runs here, check prints target and draft in the order
given, run and compare say which draft length they used."""

import json
from pathlib import Path

import pytest

from specdemo.checks import compat
from specdemo.services import presets
from specdemo.interfaces.cli import main
from specdemo.interfaces.decode_cli import draft_length_text, format_stats
from specdemo.core.stats import DecodeStats


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    """No hub model is cached (the hub presets all need downloads)."""
    import huggingface_hub.constants as constants
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def test_unreachable_hub_recommends_a_preset_that_runs_offline(empty_hub_cache, monkeypatch, capsys):
    import specdemo.models.loading as models
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout_s=5.0: False)
    assert main(["presets", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    chosen = next(p for p in out["presets"] if p["name"] == out["recommended"])
    assert chosen["to_download"] == [] and chosen["fits"] is True
    assert out["hub_unavailable"] == "the model hub (huggingface.co) is not reachable from this machine"
    assert out["reasons"][0].startswith(out["hub_unavailable"] + ": recommended among the presets "
                                        "whose models are on this machine already")
    assert {p["name"] for p in out["presets"] if p["usable_now"]} == {
        p["name"] for p in out["presets"] if not p["to_download"]}
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # a new user offline could not tell which presets run: two groups under a one-line legend
    assert sum(line.startswith("legend: ") for line in lines) == 1 and lines[1].startswith("legend: ")
    assert "'usable now': its models are on this machine" in lines[1] and "'hub': " in lines[1]
    here = lines.index(f"usable now ({sum(p['usable_now'] for p in out['presets'])}):")
    hub = lines.index(f"hub: not usable now, {out['hub_unavailable']} "
                      f"({sum(not p['usable_now'] for p in out['presets'])}):")
    for p in out["presets"]:
        row = next(i for i, line in enumerate(lines) if line[6:].startswith(p["name"] + " "))
        assert (here < row < hub) if p["usable_now"] else (row > hub), p["name"]
        # a new user met the early-exit preset's warning only in --json and on the page
        assert lines[row + 2] == f"       note: {p['note']}" if p["note"] else True, p["name"]


def test_reachable_hub_keeps_download_presets_in_the_running(empty_hub_cache, monkeypatch, capsys):
    import specdemo.models.loading as models
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout_s=5.0: True)
    assert main(["presets", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hub_unavailable"] is None
    assert not any("not reachable" in r for r in out["reasons"])
    assert presets.hub_unavailable() is None
    assert main(["presets"]) == 0
    text = capsys.readouterr().out
    assert "\nhub: downloads on first use (" in text and "not usable now" not in text


def test_check_prints_target_then_draft(monkeypatch, capsys):
    import specdemo.models.loading as models
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout_s=5.0: True)  # T/one, D/two
    monkeypatch.setattr(compat, "check_specs", lambda target, draft, **kw: compat.Verdict(
        "incompatible", [f"checked {target} with draft {draft}"]))
    assert main(["check", "--target", "T/one", "--draft", "D/two"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "target T/one, draft D/two: incompatible"
    assert out[1] == "  - checked T/one with draft D/two"


SAME_VOCABULARY = ("same vocabulary: 14 tokens with identical token->id maps, same BOS/EOS and "
                   "chat template")


@pytest.fixture
def tiny_folders(tmp_path):
    """A tiny target and a tiny draft model folder (random weights, one shared tokenizer)."""
    from test_compat import make_tokenizer
    from tiny import tiny_llama
    for name, seed, layers in (("target", 3, 4), ("draft", 4, 2)):
        tiny_llama(seed=seed, vocab_size=32, layers=layers).save_pretrained(tmp_path / name)
        make_tokenizer().save_pretrained(tmp_path / name)
    return str(tmp_path / "target"), str(tmp_path / "draft")


def test_check_says_what_it_reads_on_stderr_before_reading_it(tiny_folders, monkeypatch, capsys):
    """A user's report: ``check`` read both models in silence. It prints a start-up step line
    on stderr first (``startup.printed``, as run and compare do); stdout and --json unchanged."""
    from specdemo.services import startup
    target, draft = tiny_folders
    step = f"checking {draft} against {target}"
    real, during = compat.check_specs, []

    def spy(*args, **kwargs):  # what stderr said, and which step ran, when the read began
        during.append((capsys.readouterr().err, startup.STEPS.current().name))
        return real(*args, **kwargs)
    monkeypatch.setattr(compat, "check_specs", spy)
    capsys.readouterr()
    assert main(["check", "--target", target, "--draft", draft]) == 0
    out, err = capsys.readouterr()
    assert during[0][0].startswith(f"… {step} (about ") and during[0][1] == step
    assert err.startswith(f"✓ {step}: ") and err.endswith(" s\n")
    assert out.splitlines() == [f"target {target}, draft {draft}: compatible",
                                f"  - {SAME_VOCABULARY}"]
    assert main(["check", "--target", target, "--draft", draft, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"target": target, "draft": draft, "status": "compatible",
                               "reasons": [SAME_VOCABULARY]}
    assert len(out.splitlines()) == 1 and step in err


def test_check_step_line_also_for_a_refusal_and_a_draft_that_is_no_model(tiny_folders, tmp_path,
                                                                         capsys):
    target, _ = tiny_folders
    (tmp_path / "empty").mkdir()
    assert main(["check", "--target", str(tmp_path / "empty"), "--draft", "ngram"]) == 2
    out, err = capsys.readouterr()
    assert out.startswith(f"error: could not load {tmp_path / 'empty'}: ")  # as before
    assert err.splitlines()[0].startswith(f"… checking ngram against {tmp_path / 'empty'}")
    assert err.splitlines()[-1].startswith(f"✗ checking ngram against {tmp_path / 'empty'}: ")
    assert main(["check", "--target", target, "--draft", "early-exit:2", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["status"] == "compatible"
    assert err.startswith(f"… checking early-exit:2 against {target}")

def test_run_and_compare_say_the_policy_and_the_k_used():
    s = DecodeStats(new_tokens=20, ttft_s=0.1, elapsed_s=1.0)
    for k in (8, 3, 0, 0):
        s.record_round(k, min(k, 2))
    assert draft_length_text("auto", s) == "auto (k used: mean 2.8, range 0-8, over 4 rounds)"
    assert draft_length_text(4, DecodeStats()) == "4 (no verification round)"
    assert format_stats("speculative", s, "auto").splitlines()[-1] == (
        "    draft_length=auto (k used: mean 2.8, range 0-8, over 4 rounds)")
    assert "draft_length" not in format_stats("plain", DecodeStats(new_tokens=3))


def test_bench_loads_through_the_shared_path_without_a_draft_length(monkeypatch, capsys):
    """``bench`` has --draft-lengths, not --draft-length; loading (with its printed steps) must
    not need it."""
    from argparse import Namespace

    import specdemo.services.startup as startup
    from specdemo.interfaces.decode_cli import pipeline_from_args
    from test_race import FakeLoaded
    from tiny import tiny_llama
    loaded = FakeLoaded(tiny_llama(seed=0, layers=1))
    monkeypatch.setattr(startup, "load_model", lambda spec, *a, **k: loaded)
    args = Namespace(target="t", draft="ngram", device="cpu", dtype="auto", quantization=None,
                     trust_remote_code=False)
    assert pipeline_from_args(args).draft_spec == "ngram"


def test_torchao_optional_kernel_failures_are_not_shown(caplog):
    """Issue 20.12: torchao's warnings that its optional GPU kernels (_C_mxfp8, _C_cutlass_90a)
    failed to load do not reach the terminal; its other warnings still do."""
    import logging

    from specdemo.interfaces.cli import quiet_library_logs
    quiet_library_logs()
    quiet_library_logs()  # idempotent: one filter
    torchao = logging.getLogger("torchao")
    with caplog.at_level(logging.WARNING):
        torchao.warning("Failed to load /venv/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: "
                        "libcudart.so.12: cannot open shared object file")
        torchao.warning("Failed to load /venv/torchao/_C_cutlass_90a.abi3.so: undefined symbol")
        torchao.warning("Skipping import of cpp extensions due to incompatible torch version.")
    assert [r.getMessage() for r in caplog.records if r.name == "torchao"] == [
        "Skipping import of cpp extensions due to incompatible torch version."]
    assert len(torchao.filters) == 1


def test_gradios_pandas_warnings_are_not_printed_by_the_tests():
    """Issue 20.12: gradio 6's queue triggers two pandas 3 deprecation warnings on every event
    (gradio/queueing.py); pytest.ini filters exactly those. Run with pytest's ini filters active."""
    import warnings

    from gradio.queueing import Queue
    with warnings.catch_warnings(record=True) as caught:
        Queue._get_df([{"a": 1.0}, {"a": None}])  # gradio's own call
        warnings.warn("an unrelated deprecation", DeprecationWarning)
    assert [str(w.message) for w in caught] == ["an unrelated deprecation"]


def test_listing_presets_loads_no_weights(tmp_path):
    """``presets`` reads preset files and the machine's memory: it imports no transformers, opens
    no weights file and draws no "Loading weights" bar (a tester saw one)."""
    import os
    import subprocess
    import sys
    code = ("import sys, io, contextlib\n"
            "import safetensors.torch as st\n"
            "st.load_file = lambda *a, **k: sys.exit('a weights file was loaded')\n"
            "from specdemo.interfaces.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['presets']) == 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]" and "Loading weights" not in out.stderr


def test_check_draws_no_loading_weights_bar(tmp_path, monkeypatch, capsys):
    """A new user's report: ``check`` of a learned drafter loads the target and transformers drew
    a bare "Loading weights" bar on stderr. That bar is hidden wherever a model loads (the
    commands say what loads in their own step line); transformers' other bars still show."""
    import torch
    from transformers.utils import logging as hf_logging

    from specdemo.core.drafters import eagle_io
    from test_compat import make_tokenizer
    from tiny import tiny_eagle, tiny_llama
    monkeypatch.setattr(hf_logging, "_tqdm_hook", None)  # as in a fresh process
    target = tiny_llama(seed=3, vocab_size=32, layers=4)
    target.save_pretrained(tmp_path / "target")
    make_tokenizer().save_pretrained(tmp_path / "target")
    eagle_io.save_head(tiny_eagle(target, 20, seed=4), tmp_path / "head", dtype=torch.float32)
    capsys.readouterr()
    assert main(["check", "--target", str(tmp_path / "target"), "--draft",
                 str(tmp_path / "head")]) == 0
    out = capsys.readouterr()
    assert "compatible with warnings" in out.out and "EAGLE-3 head" in out.out
    assert "Loading weights" not in out.err
    for _ in hf_logging.tqdm(range(2), desc="another bar"):
        pass
    assert "another bar" in capsys.readouterr().err


def test_offline_a_preset_that_does_not_fit_suggests_only_presets_usable_now(
        empty_hub_cache, monkeypatch, capsys):
    """A new user offline: ``presets`` suggested "would fit: a smaller preset:
    smollm2-1.7b-360m ..., qwen2.5-1.5b-0.5b" for hub presets that do not fit, though those
    need the hub too. Offline, the suggestions are presets whose models are here."""
    import specdemo.models.loading as models
    from specdemo.models import hardware
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout_s=5.0: False)
    gib = 1024 ** 3  # a CPU with 6 GiB free: the built-in presets and the small hub ones fit
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo(
        "cpu", "a test CPU", 8 * gib, 6 * gib, 2, 8 * gib, 6 * gib))
    assert main(["presets", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    here = {p["name"] for p in out["presets"] if p["usable_now"]}
    hub = [p for p in out["presets"] if not p["usable_now"]]
    assert here and any(p["fits"] for p in hub)  # suggested before: fits, but needs the hub
    assert any(not p["fits"] for p in hub)
    for p in (p for p in hub if not p["fits"]):
        suggested = p["reason"].split("a smaller preset: ", 1)[1].split("; or ")[0]
        names = [s.split(" (")[0] for s in suggested.split("), ")]
        assert names and set(names) <= here, (p["name"], p["reason"])
        assert p["reason"].endswith(" (among the presets usable now: the hub is not)")
