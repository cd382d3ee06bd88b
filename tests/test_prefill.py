"""Chunked prefill (issue 11 item 3): Stop during a long prompt takes effect after one chunk, not
after the whole prefill; chunking changes no output and hands drafters every prompt feature."""

from __future__ import annotations

import threading

import pytest
import torch

from specdemo.core import kv as kv_module
from specdemo.core.drafters import ModelDrafter, make_drafter
from specdemo.core.drafters.base import Proposal
from specdemo.core.engine import decode, generate
from specdemo.core.kv import KVModel
from specdemo.core.policy import FixedDraftLength
from tiny import CharTokenizer, tiny_llama

TOK = CharTokenizer()
PROMPT = TOK.encode("the cat sat on the mat. the dog ran far away, so the cat sat alone. " * 3)
CHUNK = 16  # the prompt is ~200 tokens: 13 chunks


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, layers=4)


def chunked(monkeypatch, size: int = CHUNK) -> None:
    monkeypatch.setattr(kv_module, "PREFILL_CHUNK", size)


def calls(model) -> list[int]:
    """Token counts of every forward of ``model`` from now on (hooks: use a model of its own)."""
    seen: list[int] = []
    model.register_forward_hook(lambda module, args, kwargs, out: seen.append(
        kwargs["input_ids"].shape[1]), with_kwargs=True)
    return seen


@pytest.mark.parametrize("spec", [None, "ngram", "self", "early-exit:2", "model"])
def test_chunked_prefill_changes_no_token(target, monkeypatch, spec):
    def run():
        drafter = (ModelDrafter(tiny_llama(seed=7), 32) if spec == "model"
                   else make_drafter(spec, target, 32) if spec else None)
        return generate(KVModel(target), PROMPT, TOK, drafter=drafter, policy=FixedDraftLength(4),
                        max_new_tokens=30).token_ids
    whole = run()
    chunked(monkeypatch)
    assert run() == whole


def test_chunks_give_the_same_logits(monkeypatch):
    target = tiny_llama(seed=0, layers=4)  # a fresh model: hooks stay on it
    whole = KVModel(target).forward(PROMPT, logits_to_keep=20)
    chunked(monkeypatch)
    kv = KVModel(target)
    seen = calls(target)
    torch.testing.assert_close(kv.forward(PROMPT, logits_to_keep=20), whole, rtol=1e-5, atol=1e-5)
    assert len(seen) == len(PROMPT) // CHUNK and seen[-1] >= 20  # the last chunk has the 20 rows
    assert kv.length == len(PROMPT) == len(kv.ids)


class FeatureRecorder:
    """A drafter that reads hidden states and proposes nothing; keeps what it observed."""

    name = "recorder"
    feature_layers = (1, 3)
    extra_memory_bytes = 0

    def __init__(self) -> None:
        self.observed: list[torch.Tensor] = []

    def observe(self, features: torch.Tensor) -> None:
        self.observed.append(features)

    def propose(self, context, k, params, generator) -> Proposal:
        return Proposal([])

    def feedback(self, n_accepted: int) -> None:
        pass


def test_feature_drafters_get_every_prompt_position(target, monkeypatch):
    whole = FeatureRecorder()
    generate(KVModel(target), PROMPT, TOK, drafter=whole, max_new_tokens=2)
    chunked(monkeypatch)
    parts = FeatureRecorder()
    generate(KVModel(target), PROMPT, TOK, drafter=parts, max_new_tokens=2)
    assert parts.observed[0].shape == (len(PROMPT), 2 * target.config.hidden_size)
    torch.testing.assert_close(parts.observed[0], whole.observed[0], rtol=1e-5, atol=1e-5)


def test_stop_during_the_prefill_takes_effect_after_one_chunk(monkeypatch):
    chunked(monkeypatch)
    target = tiny_llama(seed=0, layers=4)
    cancel = threading.Event()
    seen = calls(target)
    target.register_forward_hook(lambda *args: cancel.set())  # Stop while chunk 1 computes
    events = list(decode(KVModel(target), PROMPT, TOK, max_new_tokens=20, cancel=cancel))
    assert len(seen) == 1  # not the other 12 chunks
    assert len(events) == 1 and events[0].done
    assert events[0].stats.finish_reason == "cancelled"
    assert events[0].token_ids == [] and events[0].text == ""


def test_stop_while_a_draft_model_catches_up_with_the_prompt(target, monkeypatch):
    """A draft model's first proposal feeds it the whole prompt: that stops after a chunk too."""
    chunked(monkeypatch)
    draft = tiny_llama(seed=7)
    cancel = threading.Event()
    seen = calls(draft)
    draft.register_forward_hook(lambda *args: cancel.set())
    events = list(decode(KVModel(target), PROMPT, TOK, drafter=ModelDrafter(draft, 32),
                         max_new_tokens=20, cancel=cancel))
    assert len(seen) == 1
    assert [e.stats.finish_reason for e in events] == [None, "cancelled"]
    assert sum(len(e.token_ids) for e in events) == 1  # the prefill's token is kept


# --- the race: warm-up, Stop, progress and an abandoned /race (issue 42 item 7) -------------

LONG = "the cat sat on the mat. the dog ran far away, so the cat sat alone. " * 3


class _Loaded:
    """What Pipeline needs from models.LoadedModel (tiny model, character tokenizer)."""

    def __init__(self, model) -> None:
        self.model, self.tokenizer, self.vocab_size = model, CharTokenizer(), 32
        self.eos_token_ids, self.device, self.spec = frozenset(), torch.device("cpu"), "tiny"


def race_of(model, cancel=None):
    """Plain then speculative (ngram) over ``model`` on LONG: ~200 prompt tokens, 13 chunks."""
    from specdemo.services.pipeline import DecodeSettings, Pipeline
    from specdemo.services.race import PLAIN, SPECULATIVE, Lane, Race
    loaded, messages = _Loaded(model), [{"role": "user", "content": LONG}]
    lanes = [Lane(PLAIN, False, lambda: Pipeline(loaded, "none"), messages),
             Lane(SPECULATIVE, True, lambda: Pipeline(loaded, "ngram"), messages)]
    return Race(lanes, DecodeSettings(max_new_tokens=6, draft_length=2), cancel=cancel)


def chunk_forwards(seen: list[int]) -> int:
    """Forwards of a full chunk (CHUNK tokens): the warm-up's widths are at most 8, rounds 3."""
    return sum(1 for n in seen if n == CHUNK)


def test_a_race_warms_a_long_prompt_over_two_chunks_not_a_whole_prefill(monkeypatch):
    from specdemo.services.race import DONE, PLAIN, RUNNING
    chunked(monkeypatch)
    target = tiny_llama(seed=0, layers=2)
    seen = calls(target)
    race = race_of(target)
    before_timed: list[int] = []
    target.register_forward_hook(lambda *args: before_timed.append(
        race.records[PLAIN].status != RUNNING and not race.records[PLAIN].steps))
    list(race.run(min_interval_s=0.0))
    assert all(r.status == DONE for r in race.records.values())
    warm = [n for n, before in zip(seen, before_timed) if before]
    prompt = race.records[PLAIN].steps[-1].stats.prompt_tokens
    assert prompt > 10 * CHUNK
    # one full chunk and the last piece's width per lane, instead of 13 chunks per lane
    assert chunk_forwards(warm) == 2
    assert chunk_forwards(seen) == 2 + 2 * (prompt // CHUNK)  # each timed lane: all its chunks


def test_stop_during_a_races_prefill_ends_it_after_one_chunk_and_skips_the_rest(monkeypatch):
    from specdemo.services.race import PLAIN, RUNNING, SKIPPED, SPECULATIVE, STOPPED
    chunked(monkeypatch)
    target = tiny_llama(seed=0, layers=2)
    seen = calls(target)
    cancel = threading.Event()
    race = race_of(target, cancel)
    timed: list[int] = []
    progress = []

    def stop_in_the_timed_prefill(module, args, kwargs, out):
        if race.records[PLAIN].status == RUNNING:
            timed.append(kwargs["input_ids"].shape[1])
            progress.append(race.snapshot().panes[PLAIN].prefill)
            cancel.set()  # Stop pressed while the first timed chunk computes
    target.register_forward_hook(stop_in_the_timed_prefill, with_kwargs=True)
    final = list(race.run(min_interval_s=0.0))[-1]
    assert timed == [CHUNK]  # the other chunks never ran
    assert final.panes[PLAIN].status == STOPPED and final.panes[SPECULATIVE].status == SKIPPED
    assert final.panes[PLAIN].prefill is None  # progress ends with the lane
    # while the first chunk computed, the pane showed the prefill starting: 0 of the prompt
    assert progress[0] is not None and progress[0].fed == 0 and progress[0].total > 10 * CHUNK
    assert chunk_forwards(seen) == 3  # two warm-up chunks, one timed


def test_stop_during_the_warm_up_skips_both_lanes_after_one_chunk(monkeypatch):
    from specdemo.services.race import PLAIN, SKIPPED, SPECULATIVE
    chunked(monkeypatch)
    target = tiny_llama(seed=0, layers=2)
    seen = calls(target)
    cancel = threading.Event()
    target.register_forward_hook(lambda *args: cancel.set())  # Stop at the first forward
    race = race_of(target, cancel)
    final = list(race.run(min_interval_s=0.0))[-1]
    assert len(seen) == 1
    assert final.panes[PLAIN].status == SKIPPED and final.panes[SPECULATIVE].status == SKIPPED


def test_prefill_progress_reports_every_chunk_of_a_long_input(monkeypatch):
    chunked(monkeypatch)
    reports = []
    with kv_module.prefill_progress(lambda fed, total: reports.append((fed, total))):
        KVModel(tiny_llama(seed=0, layers=2)).forward(PROMPT)
        KVModel(tiny_llama(seed=0, layers=2)).forward(PROMPT[:CHUNK])  # one chunk: no report
    n = len(PROMPT)
    starts = [start for start, _ in kv_module._chunks(n, 1, CHUNK)]
    assert len(starts) > 10 and reports == [(start, n) for start in starts] + [(n, n)]


def test_warm_prefix_meets_every_chunk_width():
    for n in (1, 16, 17, 32, 33, 200, 209):
        prefix = kv_module.warm_prefix(n, 16)
        widths = {e - s for s, e in kv_module._chunks(n, 1, 16)}
        assert {e - s for s, e in kv_module._chunks(prefix, 1, 16)} == widths
        assert prefix <= min(n, 32)


class _Job:
    def __init__(self, session_hash: str) -> None:
        self.session_hash, self.alive = session_hash, True


def _request(job: _Job):
    """A gr.Request stand-in whose app's queue holds ``job`` (what gradio marks not alive when
    the client's stream disconnects)."""
    from types import SimpleNamespace
    queue = SimpleNamespace(active_jobs=[None, [job]])
    app = SimpleNamespace(get_blocks=lambda: SimpleNamespace(_queue=queue))
    return SimpleNamespace(session_hash=job.session_hash, request=SimpleNamespace(app=app))


def test_an_abandoned_race_api_call_is_cancelled(monkeypatch):
    """The client goes away during the timed prefill: the /race handler sees its queued event
    not alive between snapshots and sets the race's Stop, so the prefill ends after the chunk
    in progress (the hook holds that chunk until the handler has reacted)."""
    from specdemo.interfaces import ui_race
    from specdemo.services.race import PLAIN, RUNNING
    chunked(monkeypatch)
    target = tiny_llama(seed=0, layers=2)
    job = _Job("tab-1")
    made = {}

    def new_race(prompt, system, preset, draft, settings, conv, request, backend=None,
                 endpoints=None):
        made["race"] = race_of(target, ui_race._session_cancel(request))
        return made["race"]
    monkeypatch.setattr(ui_race, "_new_race", new_race)
    timed: list[int] = []

    def client_leaves(module, args, kwargs, out):
        race = made["race"]
        if race.records[PLAIN].status == RUNNING:
            timed.append(kwargs["input_ids"].shape[1])
            job.alive = False
            race.cancel.wait(60)  # until the handler notices (bounded: a failure, not a hang)
    target.register_forward_hook(client_leaves, with_kwargs=True)
    result = ui_race.race_api("hi", max_new_tokens=6, draft="ngram", request=_request(job))
    assert made["race"].cancel.is_set()
    assert timed == [CHUNK]
    assert result["plain"]["status"] == "stopped" and result["speculative"]["status"] == "skipped"


def test_a_client_still_there_or_unknown_is_not_gone():
    job = _Job("tab-2")
    assert ui_race_gone(_request(job)) is False
    assert ui_race_gone(None) is False  # a direct call: no queue to read
    job.alive = False
    assert ui_race_gone(_request(job)) is True


def ui_race_gone(request) -> bool:
    from specdemo.interfaces.ui_race import client_gone
    return client_gone(request)()
