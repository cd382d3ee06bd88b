"""scripts/device_check.py's summary (no model: hand-made records) and that the check's code
imports no gradio (the GPU machine has none). The whole check on the CPU is
``scripts/device_check.sh --cpu-dry-run`` (minutes, the real model)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "scripts" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def race(device, drafter, prompt, speedup, projected, dtype="bfloat16"):
    return {"kind": "race", "device": device, "backend": "transformers", "drafter": drafter,
            "dtype": dtype, "prompt": prompt, "speedup": speedup,
            "plain_tokens_per_s": 100.0, "speculative_tokens_per_s": 100.0 * speedup,
            "mean_acceptance_length": 2.5, "identical": True,
            "projected_speedup_free_verification": projected}


def test_each_gpu_race_stands_beside_the_cpus_projection(check):
    records = [race("cuda", "eagle3 k=4", "chat", 2.0, 2.3),
               race("cuda", "ngram k=4", "chat", 1.1, 1.2),
               race("cpu", "eagle3 k=4", "chat", 0.9, 1.5, dtype="float32"),
               {"kind": "race", "device": "cuda", "drafter": "self k=4", "prompt": "chat",
                "error": "RuntimeError: boom"}]
    rows = check.projection_rows(records)
    assert [(r["drafter"], r["cpu_projection"], r["gap"], r["beyond_20_percent"]) for r in rows] == [
        ("eagle3 k=4", 1.5, 0.3333, True), ("ngram k=4", None, None, None)]
    assert rows[0]["projected_speedup_free_verification"] == 2.3
    rehearsed = check.projection_rows(records, rehearsal=True)  # the dry run pairs CPU with CPU
    assert [r["drafter"] for r in rehearsed] == ["eagle3 k=4", "ngram k=4", "eagle3 k=4"]
    assert rehearsed[2]["gap"] == round(0.9 / 1.5 - 1, 4) and rehearsed[2]["beyond_20_percent"]


def test_the_summary_is_one_file_with_every_part(check, tmp_path, capsys):
    records = tmp_path / "records.jsonl"
    lines = [{"kind": "env", "commit": "abc", "gpu": "NVIDIA H100", "driver": "550.1",
              "torch": "2.14.1", "torch_cuda": "13.0", "transformers": "5.25.0"},
             race("cuda", "eagle3 k=4", "chat", 2.0, 2.3),
             {"kind": "plain", "device": "cuda", "engine": "transformers generate (static cache)",
              "dtype": "bfloat16", "prompt": "chat", "tokens_per_s": 250.0}]
    records.write_text("\n".join(json.dumps(r) for r in lines) + "\nnot json\n")
    junit = tmp_path / "tests.xml"
    junit.write_text('<testsuites><testsuite><testcase classname="t" name="a"/>'
                     '<testcase classname="t" name="b"><failure message="x"/></testcase>'
                     '<testcase classname="t" name="c"><skipped/></testcase>'
                     '</testsuite></testsuites>')
    costs = tmp_path / "costs.json"
    costs.write_text('{"forward_s": {"1": 0.004, "2": 0.0041}, "device": "cuda"}\n')
    out = tmp_path / "device_check.json"
    assert check.main(["summary", "--records", str(records), "--junit", str(junit), "--costs",
                       str(costs), "--steps", "env: ok", "races float32: ok", "--out",
                       str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["env"]["gpu"] == "NVIDIA H100" and result["mode"] == "accelerator"
    assert result["cuda_tests"] == {"passed": 1, "failed": 1, "errors": 0, "skipped": 1,
                                    "failures": ["t::b"]}
    assert [r["kind"] for r in result["records"]] == ["race", "plain"]
    assert result["costs"]["forward_s"] == {"1": 0.004, "2": 0.0041}
    assert result["steps"] == ["env: ok", "races float32: ok"]
    assert len(result["projection_vs_measured"]) == 1
    printed = capsys.readouterr().out
    assert "GPU NVIDIA H100, driver 550.1" in printed
    assert "cuda tests: 1 passed, 1 failed, 0 errors, 1 skipped" in printed
    assert "speedup 2.0, mean acceptance length 2.5, identical True, projection 2.3" in printed
    assert "costs: forward ms by width 1: 4.00, 2: 4.10" in printed


def test_prompts_and_drafters_are_picked_by_name(check):
    assert check._pick(check.DRAFTERS, "default,ngram") == ["default (eagle3+ngram, auto)",
                                                            "ngram k=4"]
    assert check._pick(check.PROMPTS, None) == ["chat", "code", "chinese", "copying"]
    with pytest.raises(SystemExit, match="unknown: \\['bogus'\\]"):
        check._pick(check.PROMPTS, "chat,bogus")


def test_the_check_imports_no_gradio():
    """Every module the check's steps import, with gradio made unimportable."""
    code = f"""
import sys
class NoGradio:
    def find_spec(self, name, path=None, target=None):
        if name == "gradio" or name.startswith("gradio."):
            raise ImportError("gradio is not installed on the GPU machine")
sys.meta_path.insert(0, NoGradio())
sys.path.insert(0, {str(ROOT)!r})
import specdemo.services.startup, specdemo.services.pipeline, specdemo.services.bench.reference
import specdemo.models.cuda_graph_backend, specdemo.interfaces.cli, specdemo.interfaces.costs_cli
import specdemo.core.tree, specdemo.services.bench.config
assert "gradio" not in sys.modules
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
