"""Hand-written learned-drafter folders on the real built-in model, through the command line:
an EAGLE-3 head in vLLM's speculators layout (and a DFlash drafter) load, stay lossless, and
broken variants are refused by ``check`` with the reason."""

import json

import pytest

from smollm_heads import write_dflash, write_eagle3_head
from specdemo.interfaces.cli import main

pytestmark = pytest.mark.slow  # loads the real built-in model
TARGET = "builtin:smollm2-135m"


def run_cli(capsys, *argv):
    status = main(list(argv))
    return status, capsys.readouterr().out


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_hand_written_drafter_is_lossless(capsys, tmp_path, kind):
    folder = (write_eagle3_head if kind == "eagle3" else write_dflash)(tmp_path / kind)
    status, out = run_cli(capsys, "compare", "--target", TARGET, "--draft", str(folder),
                          "--prompt", "Name three colours.", "--max-new-tokens", "24", "--json",
                          "--backend", "transformers")
    assert status == 0
    result = json.loads(out)
    assert result["identical"] is True
    assert result["speculative"]["drafted"] > 0
    assert result["speculative"]["extra_memory_bytes"] > 0


def test_check_accepts_the_head_and_names_what_it_reads(capsys, tmp_path):
    folder = write_eagle3_head(tmp_path / "head")
    status, out = run_cli(capsys, "check", "--target", TARGET, "--draft", str(folder), "--json")
    verdict = json.loads(out)
    assert status == 0 and verdict["status"] == "compatible", verdict
    assert "reading the inputs of target layers [2, 15, 27]" in verdict["reasons"][0]


@pytest.mark.parametrize("change, reason", [
    (dict(layer_ids=(2, 15, 31)), "the EAGLE-3 head reads hidden state(s) [31] but the target has "
                                  "only 30 layers"),
    (dict(with_d2t=False), "the draft vocabulary (8192 ids) is smaller than the target's (49152) "
                           "but the folder has no d2t map"),
])
def test_check_refuses_a_broken_head_with_the_reason(capsys, tmp_path, change, reason):
    folder = write_eagle3_head(tmp_path / "bad", **change)
    status, out = run_cli(capsys, "check", "--target", TARGET, "--draft", str(folder))
    assert status == 2
    assert "incompatible" in out and reason in out


def test_draft_mtp_is_refused_for_a_target_without_mtp_layers(capsys):
    status, out = run_cli(capsys, "check", "--target", TARGET, "--draft", "mtp")
    assert status == 2
    assert "has no multi-token prediction layers" in out
