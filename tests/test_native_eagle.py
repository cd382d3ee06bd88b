"""The EAGLE-3 head step in C (native_forward.c's head mode, native.NativeEagleHead) on
tiny random heads, against ``Eagle3Head.step`` in torch; the drafter with it inside the engine
on the native backend; the greedy draw over a draft vocabulary.

As in test_native_backend.py: on heads whose float32 weights are BF16 values already and with
the ``fma`` kernel only the order of float32 sums differs from torch; exact comparisons where
the C code promises them (a T-position step against T one-position steps, rollback).
"""

from __future__ import annotations

import pytest
import torch

from specdemo.core.drafters.base import DraftSampler
from specdemo.core.drafters.eagle import Eagle3Drafter
from specdemo.core.drafters.vocab import expand_logits
from specdemo.core.engine import generate
from specdemo.core.policy import FixedDraftLength
from specdemo.core.sampling import SamplingParams
from specdemo.models import native as nb
from tiny import CharTokenizer, bf16_valued, tiny_eagle, tiny_llama

try:
    nb.library()
    KERNELS = ["fma"] + (["dpbf16"] if nb.library().nf_has_dpbf16() else [])
    NO_LIBRARY = None
except nb.NativeError as exc:  # no C compiler: test_native_backend.py tests the refusal
    KERNELS, NO_LIBRARY = ["fma"], str(exc)

needs_library = pytest.mark.skipif(NO_LIBRARY is not None, reason=f"{NO_LIBRARY}")

IDS = [3, 5, 7, 1, 2, 9, 30, 12]


@pytest.fixture(scope="module")
def target():
    return bf16_valued(tiny_llama(seed=3, layers=3, hidden=64))


def _head(target, seed=1, draft_vocab=20, norm_before_residual=False, norm_output=False):
    head = bf16_valued(tiny_eagle(target, draft_vocab, seed=seed))
    head.layers[0].norm_before_residual = head.norm_before_residual = norm_before_residual
    head.norm_output = norm_output
    return head


def _torch_steps(head, hidden, ids, splits):
    """Eagle3Head.step over consecutive pieces of ``splits`` positions with the torch cache."""
    outs, logits, past, start = [], [], None, 0
    with torch.inference_mode():
        for n in splits:
            pos = torch.arange(start, start + n)[None]
            out, lg, past = head.step(hidden[None, start:start + n],
                                      torch.tensor([ids[start:start + n]]), pos, past)
            outs.append(out[0])
            logits.append(lg[0])
            start += n
    return torch.cat(outs), torch.cat(logits)


def _native_steps(nh, hidden, ids, splits):
    outs, logits, start = [], [], 0
    for n in splits:
        out, lg = nh.step(hidden[start:start + n], ids[start:start + n], start, n)
        outs.append(out)
        logits.append(lg)
        start += n
    return torch.cat(outs), torch.cat(logits)


@needs_library
@pytest.mark.parametrize("norm_before_residual,norm_output", [(False, False), (True, False),
                                                             (False, True)])
def test_the_step_is_eagle3_heads_own_on_bf16_valued_weights(target, norm_before_residual,
                                                             norm_output):
    head = _head(target, norm_before_residual=norm_before_residual, norm_output=norm_output)
    torch.manual_seed(0)
    hidden = torch.randn(len(IDS), 64)
    ref_out, ref_logits = _torch_steps(head, hidden, IDS, [5, 1, 2])
    out, logits = _native_steps(nb.NativeEagleHead(head, kernel="fma"), hidden, IDS, [5, 1, 2])
    assert logits.shape == (len(IDS), 20) and out.shape == (len(IDS), 64)
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(logits, ref_logits, atol=2e-5, rtol=1e-4)


@needs_library
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_step_matches_a_float32_head_within_bf16_tolerance(kernel):
    target = tiny_llama(seed=3, layers=3, hidden=64)
    head = tiny_eagle(target, 20, seed=1)
    torch.manual_seed(0)
    hidden = torch.randn(len(IDS), 64)
    ref_out, ref_logits = _torch_steps(head, hidden, IDS, [6, 1, 1])
    out, logits = _native_steps(nb.NativeEagleHead(head, kernel=kernel), hidden, IDS, [6, 1, 1])
    assert (logits - ref_logits).abs().max() < 0.02 * ref_logits.abs().max()
    assert (out - ref_out).abs().max() < 0.02 * ref_out.abs().max()


@needs_library
def test_int8_head_weights_are_the_heads_step_over_the_rounded_weights(target):
    """weights="int8": the layer's and lm_head's matrices as int8 with one scale a row (fc stays
    in torch); the step is Eagle3Head.step over the dequantised weights up to the order of
    float32 sums. "w8a8" rounds the activations too: close, not equal."""
    import copy
    head = _head(target)
    rounded = copy.deepcopy(head)
    with torch.no_grad():
        for name, p in rounded.named_parameters():
            if p.dim() == 2 and not name.startswith("fc"):
                scale = p.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127
                p.copy_(torch.round(p / scale).clamp(-127, 127) * scale)
    torch.manual_seed(0)
    hidden = torch.randn(len(IDS), 64)
    ref_out, ref_logits = _torch_steps(rounded, hidden, IDS, [5, 1, 2])
    out, logits = _native_steps(nb.NativeEagleHead(head, weights="int8"), hidden, IDS, [5, 1, 2])
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(logits, ref_logits, atol=2e-5, rtol=1e-4)
    out8, logits8 = _native_steps(nb.NativeEagleHead(head, weights="w8a8"), hidden, IDS, [5, 1, 2])
    assert 0 < (logits8 - ref_logits).abs().max() < 0.05 * ref_logits.abs().max()
    assert nb.NativeEagleHead(head, weights="w8a8").weights is not nb.NativeEagleHead(head).weights
    with pytest.raises(ValueError, match="use bf16, int8, w8a8"):
        nb.NativeEagleHead(head, weights="int4")


@needs_library
@pytest.mark.parametrize("kernel,weights", [(k, "bf16") for k in KERNELS]
                         + [("fma", "int8"), ("fma", "w8a8")])
def test_a_t_position_step_equals_t_one_position_steps_bit_for_bit(target, kernel, weights):
    head = _head(target)
    torch.manual_seed(0)
    hidden = torch.randn(len(IDS), 64)
    out_all, logits_all = _native_steps(nb.NativeEagleHead(head, kernel=kernel, weights=weights),
                                        hidden, IDS, [len(IDS)])
    out_one, logits_one = _native_steps(nb.NativeEagleHead(head, kernel=kernel, weights=weights),
                                        hidden, IDS, [1] * len(IDS))
    assert torch.equal(out_all, out_one)
    assert torch.equal(logits_all, logits_one)
    # keep: the last positions' logits only, the same numbers
    nh = nb.NativeEagleHead(head, kernel=kernel, weights=weights)
    out, last2 = nh.step(hidden, IDS, 0, 2)
    assert torch.equal(last2, logits_all[-2:]) and torch.equal(out, out_all)


@needs_library
def test_rollback_then_restep_equals_stepping_once(target):
    head = _head(target)
    torch.manual_seed(0)
    hidden = torch.randn(len(IDS), 64)
    once = nb.NativeEagleHead(head, kernel="fma")
    ref_out, ref_logits = once.step(hidden, IDS, 0, len(IDS))
    nh = nb.NativeEagleHead(head, kernel="fma")
    nh.step(hidden[:5], IDS[:5], 0, 5)
    nh.step(torch.randn(2, 64), [11, 13], 5, 2)  # draft steps, then rejected
    assert nh.length == 7
    nh.rollback(5)
    assert nh.length == 5 and nh.cache_bytes == 2 * 4 * 2 * 16 * 5
    out, logits = nh.step(hidden[5:], IDS[5:], 5, 3)
    assert torch.equal(out, ref_out[5:]) and torch.equal(logits, ref_logits[5:])
    with pytest.raises(ValueError, match="beyond the cached length"):
        nh.step(hidden[:1], IDS[:1], 10, 1)
    with pytest.raises(ValueError, match="outside 0..31"):
        nh.step(hidden[:1], [32], 8, 1)
    assert nh.length == 8  # the refused steps left the cache as it was


@needs_library
def test_the_cache_grows_past_its_first_capacity(target, monkeypatch):
    monkeypatch.setattr(nb.model, "MIN_CAPACITY", 4)
    head = _head(target)
    torch.manual_seed(0)
    hidden = torch.randn(len(IDS), 64)
    ref_out, ref_logits = nb.NativeEagleHead(head, kernel="fma", capacity=64).step(
        hidden, IDS, 0, len(IDS))
    nh = nb.NativeEagleHead(head, kernel="fma", capacity=4)
    out, logits = _native_steps(nh, hidden, IDS, [3, 3, 2])
    assert nh.capacity == 8
    assert torch.equal(out, ref_out) and torch.equal(logits, ref_logits)


class _Recording(Eagle3Drafter):
    """An Eagle3Drafter that keeps every proposal it made."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.proposals = []

    def propose(self, context, k, params, generator):
        proposal = super().propose(context, k, params, generator)
        self.proposals.append(proposal.ids)
        return proposal


@needs_library
@pytest.mark.parametrize("draft_vocab", [None, 20])
def test_engine_greedy_with_the_native_head_equals_plain_and_the_torch_heads_proposals(
        target, draft_vocab):
    """On the native target: greedy speculative decoding with the C head step equals plain
    greedy decoding, and (BF16-valued weights, kernel fma) proposes what the torch head
    proposes, round by round."""
    nm = nb.NativeModel(target, kernel="fma")
    head = _head(target, draft_vocab=draft_vocab)
    prompt = CharTokenizer().encode("speculative decoding, made visible")
    plain = generate(nb.NativeKV(nm), prompt, CharTokenizer(), max_new_tokens=40)
    runs = {}
    for name, stepper in (("torch", None), ("native", nb.NativeEagleHead(head, kernel="fma"))):
        drafter = _Recording(head, 32, stepper=stepper)
        runs[name] = (drafter, generate(nb.NativeKV(nm), prompt, CharTokenizer(), drafter=drafter,
                                        policy=FixedDraftLength(4), max_new_tokens=40))
    drafter, spec = runs["native"]
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > 0 and spec.stats.extra_memory_bytes > 0
    assert drafter.proposals == runs["torch"][0].proposals
    assert spec.stats.accepted == runs["torch"][1].stats.accepted


class _Loaded:
    def __init__(self, model, backend):
        self.model, self.backend = model, backend


@needs_library
def test_head_stepper_is_installed_on_the_native_backend_only(target):
    from specdemo.core.drafters.combined import CombinedDrafter
    head = _head(target)
    torch_drafter = Eagle3Drafter(head, 32)
    nb.head_stepper(torch_drafter, _Loaded(target, "transformers"))
    assert torch_drafter.stepper is None
    native = Eagle3Drafter(head, 32)
    nb.head_stepper(native, _Loaded(target, "native"))
    assert isinstance(native.stepper, nb.NativeEagleHead)
    combined = CombinedDrafter(Eagle3Drafter(head, 32), name="eagle3+ngram")
    nb.head_stepper(combined, _Loaded(target, "native"))
    assert isinstance(combined.learned.stepper, nb.NativeEagleHead)
    # the weights are repacked once per head, embedding table and kernel
    assert combined.learned.stepper.weights is native.stepper.weights
    nb.head_stepper(None, _Loaded(target, "native"))  # plain decoding: nothing to do
    # the head follows the target's weight format
    w8a8 = Eagle3Drafter(head, 32)
    nb.head_stepper(w8a8, _Loaded(target, "native-w8a8"))
    assert w8a8.stepper.weights.weights == "w8a8" and native.stepper.weights.weights == "bf16"


def test_a_head_with_biases_keeps_the_torch_step(target):
    head = tiny_eagle(target, seed=1)
    head.config.attention_bias = True
    assert nb.head_unsupported_reason(head) == (
        "the native EAGLE-3 head step computes heads without biases; this one has biases")
    drafter = Eagle3Drafter(head, 32)
    nb.head_stepper(drafter, _Loaded(target, "native"))
    assert drafter.stepper is None
    head.config.attention_bias = False
    head.config.hidden_act = "gelu"
    assert "SiLU" in nb.head_unsupported_reason(head)


def test_greedy_draw_over_a_draft_vocabulary_equals_drawing_from_expanded_logits():
    ids = torch.tensor([0, 2, 5, 6, 9, 31])
    cases = [torch.tensor([0.1, 0.7, -1.0, 0.2, 0.3, 0.0]),
             torch.tensor([0.5, 0.1, 0.9, 0.9, 0.2, 0.9]),  # ties: the first maximum
             torch.full((6,), -3.0)]
    for logits in cases:
        fast, ref = DraftSampler([1, 2], SamplingParams(), None), DraftSampler([1, 2], SamplingParams(), None)
        token = fast.draw_subset(logits, ids, 32, increasing=True)
        assert torch.equal(token, ref.draw(expand_logits(logits, ids, 32)))
        mine, theirs = fast.proposal("x"), ref.proposal("x")
        assert mine.ids == theirs.ids and torch.equal(mine.probs, theirs.probs)
        assert mine.confidence == pytest.approx(theirs.confidence)
    assert DraftSampler([1], SamplingParams(), None).draw_subset(cases[1], ids, 32, True).item() == 5
    # with a repetition penalty the V logits are built (the penalty reads the context's ids)
    params = SamplingParams(repetition_penalty=1.5)
    fast, ref = DraftSampler([5], params, None), DraftSampler([5], params, None)
    assert torch.equal(fast.draw_subset(cases[1], ids, 32, True),
                       ref.draw(expand_logits(cases[1], ids, 32)))


@needs_library
def test_a_pipeline_on_the_native_backend_drafts_with_the_c_head_and_stays_lossless(target):
    from specdemo.services.backend_choice import with_backend
    from specdemo.models.learned import LoadedEagle3
    from specdemo.models.loading import LoadedModel
    from specdemo.services.pipeline import DecodeSettings, Pipeline
    loaded = LoadedModel("tiny-llama", target, CharTokenizer(), torch.device("cpu"), torch.float32,
                         0.0, "test")
    native, _ = with_backend(loaded, "native")
    draft = LoadedEagle3("tiny-eagle", _head(target, draft_vocab=20), {})
    assert Pipeline(loaded, "tiny-eagle", draft).new_drafter().stepper is None
    pipe = Pipeline(native, "tiny-eagle", draft)
    assert isinstance(pipe.new_drafter().stepper, nb.NativeEagleHead)
    prompt = CharTokenizer().encode("speculative decoding, made visible")
    settings = DecodeSettings(max_new_tokens=32, draft_length=3)
    spec, plain = pipe.run(prompt, settings, True), pipe.run(prompt, settings, False)
    assert spec.stats.drafted > 0
    assert spec.token_ids == plain.token_ids
