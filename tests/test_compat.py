"""Compatibility verdicts from tokenizers built in-process, the CLI, and the real refusal
(Gemma 3 270M drafting for SmolLM2-135M)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specdemo.checks.compat import check_compatibility, check_specs, non_model_verdict

SPECIALS = ["<unk>", "<s>", "</s>", "<eot>"]
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]
TEMPLATE = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"


def make_tokenizer(words=WORDS, specials=SPECIALS, bos="<s>", eos="</s>", template=TEMPLATE,
                   extra_special=()) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer: ids 0..3 are specials, then ``words`` in order."""
    vocab = {tok: i for i, tok in enumerate(list(specials) + list(words))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token=bos,
                                  eos_token=eos, additional_special_tokens=list(extra_special) or None)
    tok.chat_template = template
    return tok


def test_identical_tokenizers_are_compatible():
    verdict = check_compatibility(make_tokenizer(), make_tokenizer())
    assert verdict.status == "compatible"
    assert verdict.exit_status == 0 and verdict.ok
    assert "same vocabulary: 14 tokens with identical token->id maps" in verdict.reasons[0]


def test_padded_embedding_rows_are_compatible():
    """Same tokenizer, target model padded to more rows (Qwen2.5-7B vs 0.5B): compatible."""
    from tiny import tiny_llama

    tok = make_tokenizer()
    target, draft = tiny_llama(vocab_size=64), tiny_llama(vocab_size=14)
    verdict = check_compatibility(tok, make_tokenizer(),
                                  target_rows=target.get_input_embeddings().num_embeddings,
                                  draft_rows=draft.get_input_embeddings().num_embeddings)
    assert verdict.status == "compatible"
    assert any("target pads its embeddings to 64 rows for 14 token ids" in r for r in verdict.reasons)


def test_too_few_embedding_rows_are_incompatible():
    verdict = check_compatibility(make_tokenizer(), make_tokenizer(), draft_rows=10)
    assert verdict.status == "incompatible"
    assert verdict.exit_status == 2
    assert any("draft model has 10 embedding rows but its tokenizer uses ids up to 13" in r
               for r in verdict.reasons)


def test_one_token_text_differing_is_incompatible_and_named():
    draft_words = [w if w != "cat" else "cow" for w in WORDS]
    verdict = check_compatibility(make_tokenizer(), make_tokenizer(words=draft_words))
    assert verdict.status == "incompatible"
    text = " ".join(verdict.reasons)
    assert "1 token id(s) mean different text: id 5 is 'cat' to the target but 'cow' to the draft" in text
    assert "draft vocabulary lacks 1 of the target's 14 tokens; first: 'cat'" in text


def test_different_eos_is_compatible_with_warnings_naming_both():
    verdict = check_compatibility(make_tokenizer(eos="</s>"), make_tokenizer(eos="<eot>"))
    assert verdict.status == "compatible with warnings"
    assert verdict.exit_status == 0
    assert any("EOS differs: target '</s>' (id 2), draft '<eot>' (id 3)" in r for r in verdict.reasons)


def test_different_bos_is_compatible_with_warnings_naming_both():
    verdict = check_compatibility(make_tokenizer(bos="<s>"), make_tokenizer(bos="<eot>"))
    assert verdict.status == "compatible with warnings"
    assert any("BOS differs: target '<s>' (id 1), draft '<eot>' (id 3)" in r for r in verdict.reasons)


def test_different_chat_template_is_a_warning():
    verdict = check_compatibility(make_tokenizer(), make_tokenizer(template="{{ messages }}"))
    assert verdict.status == "compatible with warnings"
    assert any("chat templates differ" in r for r in verdict.reasons)
    only = check_compatibility(make_tokenizer(), make_tokenizer(template=None))
    assert any("only the target has a chat template" in r for r in only.reasons)


def test_extra_special_token_in_target_only_is_a_warning():
    target = make_tokenizer(extra_special=["<think>"])
    verdict = check_compatibility(target, make_tokenizer())
    assert verdict.status == "compatible with warnings"
    assert any("draft lacks 1 of the target's special tokens: '<think>'" in r for r in verdict.reasons)


def test_disjoint_vocabularies_are_incompatible_with_the_missing_tokens_named():
    other = ["le", "chat", "assis", "sur", "tapis", "un", "chien", "couru", "loin", "parti"]
    verdict = check_compatibility(make_tokenizer(), make_tokenizer(words=other))
    assert verdict.status == "incompatible"
    text = " | ".join(verdict.reasons)
    assert "different tokenizers: target WordLevel tokenizer" in text and "with 14 tokens" in text
    assert ("draft vocabulary lacks 10 of the target's 14 tokens; "
            "first: 'the', 'cat', 'sat', 'on', 'mat', ...") in text


def test_missing_regular_tokens_are_incompatible_even_with_the_same_prefix():
    verdict = check_compatibility(make_tokenizer(), make_tokenizer(words=WORDS[:7]))
    assert verdict.status == "incompatible"
    assert any("lacks 3 of the target's 14 tokens; first: 'ran', 'far', 'away'" in r for r in verdict.reasons)


def test_extra_draft_tokens_are_a_warning():
    verdict = check_compatibility(make_tokenizer(), make_tokenizer(words=WORDS + ["extra"]))
    assert verdict.status == "compatible with warnings"
    assert any("draft has 1 tokens the target lacks (never accepted): 'extra'" in r for r in verdict.reasons)


@pytest.mark.parametrize("spec", ["none", "ngram", "self"])  # early-exit: test_early_exit_check.py
def test_non_model_drafters_are_always_compatible_without_loading(spec):
    verdict = check_specs("no/such-model-anywhere", spec)
    assert verdict.status == "compatible"
    assert verdict.reasons and verdict == non_model_verdict(spec)


# --- through models.load_tokenizer (specdemo.models.loading) -----------------------------------------

@pytest.fixture
def models_module():
    return pytest.importorskip("specdemo.models.loading", reason="specdemo.models.loading not written yet")


def test_verdict_is_recomputed_when_files_change(tmp_path, monkeypatch, models_module):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target, draft = tmp_path / "target", tmp_path / "draft"
    for folder in (target, draft):  # model folders: a config (check refuses a folder without)
        make_tokenizer().save_pretrained(folder)
        (folder / "config.json").write_text('{"model_type": "llama"}')
    assert check_specs(str(target), str(draft)).status == "compatible"
    make_tokenizer(words=[w.upper() for w in WORDS]).save_pretrained(draft)  # edit the draft in place
    assert check_specs(str(target), str(draft)).status == "incompatible"


@pytest.mark.slow
def test_real_refusal_gemma3_draft_for_smollm2_target(models_module):
    verdict = check_specs("builtin:smollm2-135m", "builtin:gemma3-270m")
    assert verdict.status == "incompatible"
    text = " | ".join(verdict.reasons)
    assert ("different tokenizers: target BPE tokenizer of 'builtin:smollm2-135m' with 49,152 tokens, "
            "draft BPE tokenizer of 'builtin:gemma3-270m' with 262,144 tokens") in text
    assert "draft vocabulary lacks" in text and "of the target's 49,152 tokens; first: " in text


@pytest.mark.slow
def test_check_command_exit_status_and_json(models_module, capsys):
    from specdemo.interfaces.cli import main

    status = main(["check", "--target", "builtin:smollm2-135m", "--draft", "builtin:gemma3-270m", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert status == 2
    assert out["status"] == "incompatible" and out["reasons"]
    assert main(["check", "--target", "builtin:smollm2-135m", "--draft", "builtin:smollm2-135m"]) == 0
    assert "target builtin:smollm2-135m, draft builtin:smollm2-135m: compatible" in \
        capsys.readouterr().out


def test_check_command_reports_unloadable_tokenizer(tmp_path, models_module, capsys):
    """Model folders (a config.json) that hold no tokenizer: exit status 1, the loader's words.
    Folders that are not models at all are refused as run refuses them, exit status 2
    (tests/test_check_not_a_model.py); a missing path at once (tests/test_inputs.py)."""
    from specdemo.interfaces.cli import main

    for name in ("empty", "bare"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"model_type": "llama"}')
    status = main(["check", "--target", str(tmp_path / "empty"), "--draft", str(tmp_path / "bare")])
    assert status == 1
    assert capsys.readouterr().out.startswith(f"error: could not load the tokenizer of {tmp_path / 'empty'}")


class _CountedId(int):
    """A token id that counts equality tests (list membership makes one per element)."""

    calls = 0

    def __eq__(self, other):
        _CountedId.calls += 1
        return int.__eq__(self, other)

    __hash__ = int.__hash__


class _StubTokenizer:
    """Just what ``check_compatibility`` reads: ``size`` tokens named ``<prefix><i>``, ids counted."""

    def __init__(self, prefix: str, size: int) -> None:
        self._vocab = {f"{prefix}{i}": _CountedId(i) for i in range(size)}
        self.added_tokens_decoder = {_CountedId(0): "<s>", _CountedId(1): "</s>"}
        self.all_special_ids = [_CountedId(0), _CountedId(1)]
        self.bos_token, self.bos_token_id, self.eos_token, self.eos_token_id = "<s>", 0, "</s>", 1
        self.chat_template = None

    def get_vocab(self) -> dict:
        return dict(self._vocab)


def _id_comparisons(size: int) -> int:
    _CountedId.calls = 0
    verdict = check_compatibility(_StubTokenizer("a", size), _StubTokenizer("b", size))
    assert verdict.status == "incompatible"
    return _CountedId.calls


def test_vocabulary_comparison_grows_linearly():
    """Issue 11 item 1: Gemma 3 (262k ids) against SmolLM2 never finished: ids were looked up in
    lists inside loops over the vocabulary. Four times the ids must cost about four times the id
    comparisons (a quadratic check costs sixteen times)."""
    small, large = _id_comparisons(500), _id_comparisons(2000)
    assert large <= 5 * max(small, 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma3-270m", "smollm2-135m"])
def test_quick_tokenizer_read_matches_the_full_class(models_module, name):
    """The compatibility check reads built-in tokenizers with transformers' generic class (3x
    faster for Gemma 3); what the verdict reads and how text encodes must not change."""
    from transformers import AutoTokenizer

    from specdemo.models import builtin
    folder = builtin._builtin_folder(builtin.BUILTINS[name])  # converted when it is not yet
    quick = builtin.read_tokenizer(folder, quick=True)
    full = AutoTokenizer.from_pretrained(folder)
    assert quick.get_vocab() == full.get_vocab()
    assert set(quick.added_tokens_decoder) == set(full.added_tokens_decoder)
    assert quick.all_special_ids == full.all_special_ids
    for which in ("bos", "eos"):
        assert getattr(quick, f"{which}_token") == getattr(full, f"{which}_token")
        assert getattr(quick, f"{which}_token_id") == getattr(full, f"{which}_token_id")
    assert quick.chat_template == full.chat_template
    text = "Hello 🦩 world,\n\tnaïve 日本語  <eos> x"
    assert quick.encode(text) == full.encode(text)
    assert quick.decode(full.encode(text)) == full.decode(full.encode(text))
