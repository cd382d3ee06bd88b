"""Greedy speculative decoding must equal plain greedy decoding, token for token (float32)."""

import pytest
import torch

from specdemo.core.drafters import ModelDrafter, make_drafter
from specdemo.core.engine import decode, generate
from specdemo.core.kv import KVModel
from specdemo.core.policy import AdaptiveDraftLength, FixedDraftLength
from specdemo.core.sampling import SamplingParams
from tiny import CharTokenizer, tiny_llama

TOK = CharTokenizer()
PROMPT = TOK.encode("the cat sat on the mat. the cat sat on the")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, layers=4)


def run(target, prompt=PROMPT, drafter=None, k=4, **kwargs):
    policy = FixedDraftLength(k) if isinstance(k, int) else AdaptiveDraftLength()
    kwargs.setdefault("max_new_tokens", 40)
    return generate(KVModel(target), prompt, TOK, drafter=drafter, policy=policy, **kwargs)


@pytest.mark.parametrize("spec", ["ngram", "self", "early-exit:1", "early-exit:3"])
@pytest.mark.parametrize("k", [1, 4, 8, "auto"])
def test_greedy_equals_plain_builtin_drafters(target, spec, k):
    plain = run(target)
    spec_run = run(target, drafter=make_drafter(spec, target, 32), k=k)
    assert spec_run.token_ids == plain.token_ids
    assert spec_run.text == plain.text


def test_self_draft_accepts_everything(target):
    result = run(target, drafter=make_drafter("self", target, 32), k=4, max_new_tokens=41)
    s = result.stats
    assert s.drafted == 32 and s.accepted == 32  # 1 token from prefill, then 8 rounds of 4 + bonus
    assert s.target_forwards == 8
    assert s.mean_acceptance_length == 5.0
    assert s.per_position_acceptance == [1.0, 1.0, 1.0, 1.0]
    assert sum(result.from_draft) == s.accepted


@pytest.mark.parametrize("draft_vocab", [32, 40])
def test_greedy_equals_plain_random_draft(target, draft_vocab):
    """A random draft accepts little; a padded (40-row) draft vocabulary still works."""
    draft = tiny_llama(seed=7, vocab_size=draft_vocab)
    plain = run(target)
    spec_run = run(target, drafter=ModelDrafter(draft, 32), k=4)
    assert spec_run.token_ids == plain.token_ids
    assert spec_run.stats.drafted > 0


def test_padded_target_vocabulary():
    """Target with 48 embedding rows (padded), draft with 32: same tokenizer, different widths."""
    target = tiny_llama(seed=3, vocab_size=48)
    # Like a trained model, never predict the padding rows (ids the tokenizer does not have).
    target.lm_head.register_forward_hook(lambda module, args, out: out.index_fill(-1, torch.arange(32, 48), -1e4))
    draft = tiny_llama(seed=3, vocab_size=32)
    plain = run(target)
    spec_run = run(target, drafter=ModelDrafter(draft, 48), k=3)
    assert spec_run.token_ids == plain.token_ids


def test_one_token_prompt(target):
    prompt = TOK.encode("a")
    for spec in ("ngram", "self"):
        assert run(target, prompt, make_drafter(spec, target, 32)).token_ids == run(target, prompt).token_ids


def test_empty_prompt_is_refused(target):
    with pytest.raises(ValueError, match="empty"):
        run(target, prompt=[])


def plain_tokens(target, n=30):
    return run(target, max_new_tokens=n).token_ids


def test_eos_inside_a_drafted_block(target):
    tokens = plain_tokens(target)
    # Make the token at index 5 the EOS (first occurrence), so it falls inside an 8-token block.
    index = next(i for i in range(5, 30) if tokens[i] not in tokens[:i])
    eos = frozenset({tokens[index]})
    plain = run(target, eos_token_ids=eos)
    spec_run = run(target, drafter=make_drafter("self", target, 32), k=8, eos_token_ids=eos)
    assert plain.token_ids == tokens[:index + 1]
    assert spec_run.token_ids == plain.token_ids
    assert spec_run.stats.finish_reason == plain.stats.finish_reason == "eos"
    # The 8-token block went past the EOS; the drafts after it were not refused, so not counted.
    assert spec_run.stats.drafted == spec_run.stats.accepted == index


def test_stop_string_inside_a_drafted_block(target):
    tokens = plain_tokens(target)
    text = TOK.decode(tokens)
    start = next(i for i in range(4, 20) if text.find(text[i:i + 2]) == i)
    stop = text[start:start + 2]
    plain = run(target, stop_strings=(stop,))
    spec_run = run(target, drafter=make_drafter("self", target, 32), k=8, stop_strings=(stop,))
    assert plain.text == text[:start]
    assert spec_run.text == plain.text
    assert spec_run.token_ids == plain.token_ids
    assert len(spec_run.token_ids) == start + 2  # nothing after the token completing the stop string
    assert spec_run.stats.finish_reason == "stop"


def test_max_new_tokens_inside_a_block(target):
    plain = run(target, max_new_tokens=6)
    spec_run = run(target, drafter=make_drafter("self", target, 32), k=8, max_new_tokens=6)
    assert spec_run.token_ids == plain.token_ids == plain_tokens(target)[:6]
    assert spec_run.stats.finish_reason == "length"
    assert spec_run.stats.drafted == 4  # 1 prefill token + 4 drafts + bonus: never past the budget


@pytest.mark.parametrize("end", ["eos", "stop", "length"])
@pytest.mark.parametrize("k", [2, 4, 8])
def test_self_draft_counts_no_refusal_after_a_stop_point(target, end, k):
    """Issue 11 item 4: ``self`` at T=0 reports acceptance_rate 1.0 however the run ends; drafts
    after EOS / a stop string / the budget were never refused (per position too)."""
    tokens = plain_tokens(target)
    index = next(i for i in range(2, 30) if tokens[i] not in tokens[:i])  # third token or later
    text = TOK.decode(tokens)
    kwargs = {"eos": {"eos_token_ids": frozenset({tokens[index]})},
              "stop": {"stop_strings": (text[index:index + 1],) if text[index] not in text[:index]
                       else (text[:index + 1],)},
              "length": {"max_new_tokens": index + 1}}[end]
    result = run(target, drafter=make_drafter("self", target, 32), k=k, **kwargs)
    s = result.stats
    assert result.token_ids == tokens[:index + 1]
    assert s.finish_reason == end
    assert s.drafted == s.accepted == sum(result.from_draft)
    if end != "length":  # the budget is never drafted past: its last token is a bonus token
        assert s.accepted == index  # every new token after the first was a draft
    assert s.acceptance_rate == 1.0
    assert all(rate == 1.0 for rate in s.per_position_acceptance)
    assert sum(s.position_accepted) == s.accepted
    assert s.draft_length_sum == s.drafted  # the last round's verified count is cut alike


def test_the_stats_name_the_drafter_or_none(target):
    """The why-line needs to know a lane without a drafter from one whose drafter proposed
    nothing: the engine says which drafter the decode had."""
    assert run(target, max_new_tokens=5).stats.drafter is None
    assert run(target, drafter=make_drafter("ngram", target, 32), max_new_tokens=5).stats.drafter \
        == make_drafter("ngram", target, 32).name


def test_repetition_penalty_changes_output_identically(target):
    plain = run(target)
    penalised = run(target, params=SamplingParams(repetition_penalty=1.8))
    assert penalised.token_ids != plain.token_ids
    for spec in ("ngram", "self"):
        spec_run = run(target, drafter=make_drafter(spec, target, 32),
                       params=SamplingParams(repetition_penalty=1.8))
        assert spec_run.token_ids == penalised.token_ids


def test_stream_deltas_join_to_final_text(target):
    tokens = plain_tokens(target, 40)
    text = TOK.decode(tokens)
    stop = text[20:23]
    for drafter in (None, make_drafter("self", target, 32)):
        events = list(decode(KVModel(target), PROMPT, TOK, drafter=drafter,
                             policy=FixedDraftLength(4), max_new_tokens=40, stop_strings=(stop,)))
        joined = "".join(e.text for e in events)
        assert joined == text[:text.find(stop)]
        assert events[-1].done and not any(e.done for e in events[:-1])
        assert sum(len(e.token_ids) for e in events) == events[-1].stats.new_tokens


def test_cancel_keeps_what_was_produced(target):
    import threading
    cancel = threading.Event()
    events = []
    for event in decode(KVModel(target), PROMPT, TOK, max_new_tokens=40, cancel=cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    assert events[-1].stats.finish_reason == "cancelled"
    assert events[-1].stats.new_tokens == 3
    assert [t for e in events for t in e.token_ids] == plain_tokens(target)[:3]


def test_host_argmax_equals_torch_first_maximum():
    """The engine reads greedy argmaxes through numpy on a CPU: the same ids as torch's argmax,
    the first of equal maxima included."""
    from specdemo.core.engine import _argmax_rows
    rows = torch.tensor([[0.1, 0.9, 0.9, -1.0], [2.0, 2.0, 2.0, 2.0], [-5.0, -4.0, -4.5, -4.0],
                         [0.0, float("-inf"), 3.0, 1.0]])
    assert _argmax_rows(rows) == rows.argmax(-1).tolist() == [1, 0, 1, 2]
    big = torch.randn(5, 49152)
    assert _argmax_rows(big) == big.argmax(-1).tolist()
