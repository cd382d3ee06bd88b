"""The real built-in model (SmolLM2-135M-Instruct from the PyPI wheel), through the command line."""

import json

import pytest

from specdemo.interfaces.cli import main
from specdemo.services.prompts import load_prompts

pytestmark = pytest.mark.slow  # every test loads the real built-in model

METRICS = {"new_tokens", "ttft_s", "tokens_per_s", "decode_tokens_per_s", "target_forwards",
           "drafted", "accepted", "acceptance_rate", "mean_acceptance_length",
           "per_position_acceptance", "draft_s", "verify_s", "extra_memory_bytes"}
COPY_PROMPT = load_prompts(["grounded"])["grounded"][0]


def run_cli(capsys, *argv):
    status = main(list(argv))
    out = capsys.readouterr().out
    return status, out


def test_run_json_has_every_metric(capsys):
    # float32 transformers: the answer's wording is checked, and the quantised backends that
    # auto may pick on some CPUs (native-w8a8) take another greedy path on this small model
    status, out = run_cli(capsys, "run", "--target", "builtin:smollm2-135m", "--prompt",
                          "What is the capital of France?", "--max-new-tokens", "12", "--json",
                          "--backend", "transformers")
    assert status == 0
    result = json.loads(out)
    assert METRICS | {"text", "token_ids"} <= set(result)
    assert result["new_tokens"] == len(result["token_ids"]) <= 12
    assert result["drafted"] == 0 and result["acceptance_rate"] is None
    assert "Paris" in result["text"]


@pytest.mark.parametrize("draft", ["ngram", "self", "early-exit:8"])
def test_compare_is_lossless_on_the_copy_prompt(capsys, draft):
    # float32 transformers: the reference for losslessness (auto, the default, may pick a
    # backend whose verification is not bit-identical to its one-token steps)
    status, out = run_cli(capsys, "compare", "--target", "builtin:smollm2-135m", "--draft", draft,
                          "--prompt", COPY_PROMPT, "--max-new-tokens", "40", "--json",
                          "--backend", "transformers")
    assert status == 0
    result = json.loads(out)
    assert result["identical"] is True and result["first_divergence"] is None
    spec = result["speculative"]
    assert spec["token_ids"] == result["plain"]["token_ids"]
    assert 0 < spec["accepted"] <= spec["drafted"]
    assert sum(spec["from_draft"]) == spec["accepted"]
    assert spec["mean_acceptance_length"] == (spec["new_tokens"] - 1) / spec["target_forwards"]
    if draft == "self":
        assert spec["acceptance_rate"] == 1.0
    if draft == "ngram":
        assert spec["extra_memory_bytes"] == 0
    else:
        assert spec["extra_memory_bytes"] > 0  # its own KV cache


def test_sampling_with_a_seed_is_reproducible(capsys):
    argv = ["run", "--target", "builtin:smollm2-135m", "--draft", "ngram", "--prompt", COPY_PROMPT,
            "--max-new-tokens", "16", "--temperature", "0.8", "--top-p", "0.9", "--seed", "3", "--json"]
    first = json.loads(run_cli(capsys, *argv)[1])
    second = json.loads(run_cli(capsys, *argv)[1])
    assert first["token_ids"] == second["token_ids"]


def test_stop_string_on_the_real_model(capsys):
    status, out = run_cli(capsys, "compare", "--target", "builtin:smollm2-135m", "--draft", "ngram",
                          "--prompt", COPY_PROMPT, "--max-new-tokens", "40", "--stop", "return",
                          "--json", "--backend", "transformers")
    result = json.loads(out)
    assert result["identical"] is True
    for side in ("plain", "speculative"):
        assert "return" not in result[side]["text"]
        assert result[side]["finish_reason"] == "stop"


def test_context_overflow_is_a_clear_error(capsys):
    """A max new tokens no prompt leaves room for is refused from the target's config before
    loading; one that only this prompt pushes past the context, after loading, before warm-up;
    each as one sentence and the --help line, exit status 2."""
    with pytest.raises(SystemExit) as exc:
        main(["run", "--target", "builtin:smollm2-135m", "--prompt", "hi", "--max-new-tokens",
              "100000"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "error: max new tokens must be a whole number from 1 to 8191 (builtin:smollm2-135m's "
        "context is 8192 tokens, the prompt included), got 100000\n"
        "(python -m specdemo run --help)\n")
    with pytest.raises(SystemExit) as exc:
        main(["run", "--target", "builtin:smollm2-135m", "--prompt", "hi " * 50,
              "--max-new-tokens", "8191"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "exceeds the model's context" in err and err.endswith("(python -m specdemo run --help)\n")


@pytest.mark.slow
def test_shipped_eagle3_head_is_checked_and_lossless():
    """The head trained for the built-in model loads offline, passes its checks and keeps greedy
    output identical to plain, alone and with prompt lookup stacked over it."""
    import json
    import subprocess
    import sys
    check = subprocess.run([sys.executable, "-m", "specdemo", "check", "--target",
                            "builtin:smollm2-135m", "--draft", "builtin:smollm2-135m-eagle3"],
                           capture_output=True, text=True, timeout=600)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "EAGLE-3 head" in check.stdout and "[2, 15, 27]" in check.stdout
    for draft in ("builtin:smollm2-135m-eagle3", "builtin:smollm2-135m-eagle3+ngram"):
        out = subprocess.run([sys.executable, "-m", "specdemo", "compare", "--draft", draft,
                              "--max-new-tokens", "24", "--draft-length", "4", "--json",
                              "--backend", "transformers",
                              "--prompt", "What is 12 + 30? Explain."],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["identical"] is True
        spec = result["speculative"]
        assert spec["drafted"] > 0 and sum(spec["drafted_by"].values()) == spec["drafted"]
