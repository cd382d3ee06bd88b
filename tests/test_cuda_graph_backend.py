"""The cuda-graphs target backend (specdemo/models/cuda_graph_backend.py) on tiny random Llamas.

On the CPU its forward runs eagerly through the same static buffers and per-width dispatch as on
a GPU (``run_eagerly`` stands in for the capture): the static cache, rollback by length, trees,
greedy identity with plain decoding, and that the forward traces as one graph (dynamo with
``fullgraph=True``: no host read of a tensor, no data-dependent branch, what a CUDA graph needs).
The capture itself runs under the ``cuda`` marker (scripts/device_check.sh).
"""

from __future__ import annotations

import pytest
import torch

from specdemo.core.drafters.eagle import Eagle3Drafter
from specdemo.core.drafters.ngram import NgramDrafter
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.core.policy import FixedDraftLength
from specdemo.core.tree import parse_shape
from specdemo.models import backends
from specdemo.models import cuda_graph_backend as cg
from tiny import CharTokenizer, LoadedStandIn, tiny_eagle, tiny_llama

CUDA = torch.cuda.is_available()
PROMPT = CharTokenizer().encode("speculative decoding, made visible")
IDS = [5, 9, 1, 22, 7, 3, 30, 12, 4, 4, 18, 2, 27]
SHAPE = parse_shape("0;1;2;0.0;0.1;1.0;0.0.0;0.0.1;0.0.0.0")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=3, hidden=64)


class Counting:
    """A capture that counts what it is asked to capture and replays eagerly."""

    def __init__(self) -> None:
        self.captured = 0

    def __call__(self, fn):
        self.captured += 1
        return cg.run_eagerly(fn)


def _kv(model, capture=None, capacity=cg.MIN_CAPACITY):
    return cg.CudaGraphKV(cg.StaticLlama(model), capacity=capacity, capture=capture)


def _hf(model, ids, layers=()):
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=bool(layers))
    if not layers:
        return out.logits[0]
    return out.logits[0], torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)


def test_its_forward_is_the_models_forward(target):
    kv = _kv(target)
    logits, feats = kv.forward_features(IDS, len(IDS), (0, 2, 3))
    ref_logits, ref_feats = _hf(target, IDS, (0, 2, 3))
    assert logits.shape == (len(IDS), 32) and feats.shape == (len(IDS), 3 * 64)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(feats, ref_feats, atol=1e-4, rtol=1e-4)
    step = kv.forward([11], 1)  # one more token over the cache
    torch.testing.assert_close(step, _hf(target, IDS + [11])[-1:], atol=1e-4, rtol=1e-4)
    assert kv.length == len(IDS) + 1 and kv.ids == IDS + [11]


def test_rollback_is_a_length_change(target):
    kv, fresh = _kv(target), _kv(target)
    kv.forward(IDS[:8])
    kv.forward(IDS[8:])
    kv.rollback(8)
    assert kv.length == 8 and kv.ids == IDS[:8]
    again = kv.forward([3, 3, 4], 3)
    fresh.forward(IDS[:8])
    assert torch.equal(again, fresh.forward([3, 3, 4], 3))  # the same widths: bit for bit


def test_one_capture_per_width_and_layers_and_none_past_the_widest(target):
    counting = Counting()
    kv = _kv(target, counting)
    kv.forward([1, 2, 3, 4, 5, 6, 7, 8], 1)  # width 8
    for _ in range(3):
        kv.forward([9], 1)  # width 1, three replays
        kv.forward([1, 2, 3, 4, 5], 5)  # width 5
        kv.rollback(kv.length - 3)
    assert counting.captured == 3 and kv.captures == 3
    kv.forward_features([4], 1, (0, 2))  # the same width, other outputs: a graph of its own
    assert counting.captured == 4
    kv.forward(list(range(1, 31)) * 2, 1)  # 60 tokens: past MAX_GRAPH_WIDTH, eagerly
    assert counting.captured == 4
    assert sorted(kv.widths) == [(1, (), False), (1, (0, 2), False), (5, (), False),
                                 (8, (), False)]


def test_replays_read_the_buffers_filled_for_them(target):
    """Each replay of one width gives the logits of its own tokens and positions."""
    kv, ref = _kv(target, Counting()), KVModel(target)
    kv.forward(IDS)
    ref.forward(IDS)
    for token in (4, 17, 9, 26):
        got, want = kv.forward([token], 1), ref.forward([token], 1)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert kv.captures == 2  # the prompt's width and width 1


def test_a_refused_capture_leaves_the_cache_running_eagerly(target, caplog):
    tries = []

    def refuse(fn):
        tries.append(fn)
        raise RuntimeError("operation not permitted when stream is capturing")
    kv, ref = _kv(target, refuse), KVModel(target)
    torch.testing.assert_close(kv.forward(IDS, 2), ref.forward(IDS, 2), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kv.forward([4], 1), ref.forward([4], 1), atol=1e-4, rtol=1e-4)
    assert kv.captures == 0 and len(tries) == 1  # no second try for the next width
    assert kv.capture_error == "RuntimeError: operation not permitted when stream is capturing"
    assert "runs its forwards eagerly" in caplog.text


def test_the_cache_grows_and_graphs_are_captured_again(target):
    counting = Counting()
    kv = _kv(target, counting, capacity=16)
    kv.forward(IDS)  # 13 positions
    kv.forward([1], 1)
    before = counting.captured
    assert kv.capacity == 16 and before == 2
    ref = KVModel(target)
    ref.forward(IDS + [1])
    # 14 + 3 positions: the cache doubles; the logits need the 14 cached keys copied over
    torch.testing.assert_close(kv.forward([2, 3, 4], 3), ref.forward([2, 3, 4], 3), atol=1e-4,
                               rtol=1e-4)
    assert kv.capacity == 32 and counting.captured == before + 1  # a new graph for the new cache
    kv.forward([5], 1)
    assert counting.captured == before + 2  # width 1 captured again too
    with pytest.raises(ValueError, match="exceed the model's context of 512"):
        kv.forward(list(range(1, 31)) * 17)


@pytest.mark.parametrize("drafter", ["ngram", "eagle3"])
def test_greedy_speculative_output_equals_plain_output(target, drafter):
    plain_ref = generate(KVModel(target), PROMPT, CharTokenizer(), max_new_tokens=40)
    plain = generate(_kv(target, Counting()), PROMPT, CharTokenizer(), max_new_tokens=40)
    make = (lambda: NgramDrafter()) if drafter == "ngram" else (  # noqa: E731
        lambda: Eagle3Drafter(tiny_eagle(target, 20, seed=1, layers=(0, 1, 2), scale=4.0), 32))
    spec = generate(_kv(target, Counting()), PROMPT, CharTokenizer(), drafter=make(),
                    policy=FixedDraftLength(4), max_new_tokens=40)
    assert plain.token_ids == plain_ref.token_ids
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > 0 and spec.stats.target_forwards <= plain.stats.target_forwards


def test_greedy_decoding_with_trees_equals_plain(target):
    plain = generate(_kv(target), PROMPT, CharTokenizer(), max_new_tokens=40)
    head = tiny_eagle(target, 20, seed=1, layers=(0, 1, 2), scale=4.0)
    spec = generate(_kv(target, Counting()), PROMPT, CharTokenizer(),
                    drafter=Eagle3Drafter(head, 32), policy=FixedDraftLength(4),
                    max_new_tokens=40, tree=SHAPE)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.tree == SHAPE.describe() and spec.stats.tree_rounds > 0


def test_a_tree_forward_equals_its_branch_fed_causally(target):
    kv, ref = _kv(target), _kv(target)
    kv.forward(IDS)
    ref.forward(IDS)
    # rows: 0 the last token's successor root, 1 and 2 its children, 3 a child of 1
    ids, depth, anc = [7, 8, 9, 10], [0, 1, 1, 2], [0b1, 0b11, 0b101, 0b1011]
    logits, _ = kv.forward_tree(ids, depth, anc)
    branch = ref.forward([7, 8, 10], 3)  # the branch 0 -> 1 -> 3, causally
    torch.testing.assert_close(logits[[0, 1, 3]], branch, atol=1e-4, rtol=1e-4)
    kv.keep_rows(len(IDS), [0, 1, 3])
    assert kv.length == len(IDS) + 3 and kv.ids == IDS + [7, 8, 10]
    torch.testing.assert_close(kv.forward([5], 1), ref.forward([5], 1), atol=1e-4, rtol=1e-4)


def test_the_forward_traces_as_one_graph(target):
    """What capturing needs, checked without a GPU: dynamo traces a whole forward with
    ``fullgraph=True`` (it raises on a graph break: a tensor read on the host, a branch on a
    value), and the traced forward gives the eager one's logits."""
    import torch._dynamo
    kv = _kv(target)
    kv.forward(IDS)
    width = cg._Width(1, kv.capacity, kv.device)
    width.ids.fill_(4)
    width.pos.fill_(len(IDS))
    width.slots.fill_(len(IDS))
    torch.le(kv.key_slots[None, :], width.pos[:, None], out=width.mask)
    torch._dynamo.reset()
    traced = torch.compile(lambda: kv._forward(width, (0, 2)), backend="eager", fullgraph=True)
    with torch.inference_mode():
        logits, feats = traced()
        eager_logits, eager_feats = kv._forward(width, (0, 2))
    assert torch.equal(logits, eager_logits) and torch.equal(feats, eager_feats)


def test_it_is_offered_only_on_cuda(target):
    loaded = LoadedStandIn(target)
    assert cg.unavailable_reason(loaded) == (
        "the cuda-graphs backend captures CUDA graphs; this target is on cpu")
    with pytest.raises(cg.CudaGraphError, match="captures CUDA graphs; this target is on cpu"):
        backends.with_backend(loaded, "cuda-graphs")
    loaded.quantization = "4bit"
    assert "is a transformers path" in cg.unavailable_reason(loaded)
    assert "cuda-graphs" in backends.TABLE and backends.TABLE["cuda-graphs"].family == "cuda-graphs"


def test_a_bfloat16_forward_stays_close_to_transformers(target):
    model = tiny_llama(seed=3, layers=3, hidden=64).to(torch.bfloat16)
    logits = _kv(model).forward(IDS, len(IDS))
    ref = _hf(model, IDS).float()
    assert logits.dtype == torch.float32
    assert (logits - ref).abs().max().item() < 0.05 * ref.abs().max().item()
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))


# --- CUDA (scripts/device_check.sh; skipped without a GPU) ----------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_captured_replays_equal_the_eager_forward():
    model = tiny_llama(seed=3, layers=3, hidden=64).to("cuda")
    kv = cg.CudaGraphKV(cg.StaticLlama(model))
    eager = cg.CudaGraphKV(cg.StaticLlama(model), capture=cg.run_eagerly)
    assert kv.capture is cg.capture_cuda
    for step in (IDS, [4], [9], [1, 2, 3, 4, 5], [6]):
        got, want = kv.forward(step, len(step)), eager.forward(step, len(step))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    kv.rollback(len(IDS) + 1)
    eager.rollback(len(IDS) + 1)
    torch.testing.assert_close(kv.forward([7], 1), eager.forward([7], 1), atol=1e-4, rtol=1e-4)
    assert kv.captures == 3  # widths 13, 1 and 5


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("drafter", ["ngram", "eagle3", "eagle3-tree"])
def test_cuda_graphs_greedy_speculative_equals_plain(drafter):
    model = tiny_llama(seed=3, layers=3, hidden=64).to("cuda")
    weights = cg.StaticLlama(model)
    plain = generate(cg.CudaGraphKV(weights), PROMPT, CharTokenizer(), max_new_tokens=40)
    assert plain.token_ids == generate(KVModel(model), PROMPT, CharTokenizer(),
                                       max_new_tokens=40).token_ids
    head = tiny_eagle(model, 20, seed=1, layers=(0, 1, 2), scale=4.0).to("cuda")
    drafters = {"ngram": NgramDrafter(), "eagle3": Eagle3Drafter(head, 32),
                "eagle3-tree": Eagle3Drafter(head, 32)}
    spec = generate(cg.CudaGraphKV(weights), PROMPT, CharTokenizer(), drafter=drafters[drafter],
                    policy=FixedDraftLength(4), max_new_tokens=40,
                    tree=SHAPE if drafter == "eagle3-tree" else None)
    assert spec.token_ids == plain.token_ids
