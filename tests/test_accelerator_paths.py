"""The GPU and Apple-silicon paths (issue 21), reproduced on the CPU: bfloat16 targets with
learned drafters, seeded sampling with a generator per device, host-device transfers per round,
accelerate-hooked (offloaded) targets, the Mac's bfloat16 rule, train-draft's placement.

Tests marked ``cuda`` run the same paths on a CUDA GPU when one is present (scripts/device_check.sh)
and are skipped elsewhere."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

from specdemo.core import clock
from specdemo.core.drafters.dflash import DFlashDrafter
from specdemo.core.drafters.dspark import DSparkDrafter
from specdemo.core.drafters.draft_model import ModelDrafter, early_exit_view
from specdemo.core.drafters.eagle import Eagle3Drafter
from specdemo.models.learned import load_learned, target_dtype
from specdemo.core.drafters.mtp import Gemma4AssistantDrafter, NativeMtpDrafter
from specdemo.core.drafters.ngram import NgramDrafter
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.models.loading import LoadedModel
from specdemo.core.policy import FixedDraftLength
from specdemo.core.sampling import Generators, SamplingParams, generator_for
from tiny import (CharTokenizer, tiny_dflash, tiny_dspark, tiny_eagle, tiny_gemma4,
                  tiny_gemma4_assistant, tiny_llama, tiny_mtp_target)

PROMPT = CharTokenizer().encode("speculative decoding, made visible")
DRAFTERS = ["ngram", "early-exit:1", "eagle3", "dflash", "dspark", "gemma4-assistant", "mtp"]
CUDA = torch.cuda.is_available()


def loaded(model, dtype=torch.float32, spec="tiny", device="cpu") -> LoadedModel:
    return LoadedModel(spec, model, CharTokenizer(), torch.device(device), dtype, 0.0, "test")


@functools.lru_cache(maxsize=2)
def _drafters(device="cpu", dtype=torch.float32):
    """name -> (target, fresh drafter factory) for every drafter family, on ``device`` (the
    models are built once per device; each factory call makes a fresh drafter)."""
    llama = tiny_llama(seed=1, layers=3).to(device, dtype)
    eagle = tiny_eagle(llama, draft_vocab=20, scale=4.0).to(device, dtype)
    dflash = tiny_dflash(llama, block_size=4).to(device, dtype)
    dspark = tiny_dspark(llama, block_size=4, feature_layers=(1, 3)).to(device, dtype)
    gemma = tiny_gemma4(seed=1).to(device, dtype)
    assistant = tiny_gemma4_assistant(gemma, seed=3).to(device, dtype)
    glm, mtp = tiny_mtp_target(seed=2)
    glm, mtp = glm.to(device, dtype), mtp.to(device, dtype)
    early = early_exit_view(llama, 1)
    return {
        "ngram": (llama, lambda: NgramDrafter()),
        "early-exit:1": (llama, lambda: ModelDrafter(early, 32, name="early-exit:1", shares_weights=True)),
        "eagle3": (llama, lambda: Eagle3Drafter(eagle, 32)),
        "dflash": (llama, lambda: DFlashDrafter(dflash, llama, 32)),
        "dspark": (llama, lambda: DSparkDrafter(dspark, llama, 32)),
        "gemma4-assistant": (gemma, lambda: Gemma4AssistantDrafter(assistant, gemma, 32)),
        "mtp": (glm, lambda: NativeMtpDrafter(mtp, glm, 32)),
    }


# --- 1. learned drafters load in the target's dtype ----------------------------------------------

def test_a_bfloat16_gemma4_assistant_serves_a_bfloat16_target(tmp_path):
    """Crashed with ``expected m1 and m2 to have the same dtype (BFloat16 != float)``: the
    assistant loaded in float32 whatever the target."""
    gemma = tiny_gemma4(seed=1)
    tiny_gemma4_assistant(gemma, seed=3).save_pretrained(tmp_path / "assistant")  # float32 files
    gemma = gemma.to(torch.bfloat16)
    back = load_learned(str(tmp_path / "assistant"), loaded(gemma, torch.bfloat16))
    assert {p.dtype for p in back.model.parameters()} == {torch.bfloat16}
    kv = KVModel(gemma)
    out = generate(kv, PROMPT, CharTokenizer(), drafter=back.new_drafter(gemma, 32, "assistant"),
                   policy=FixedDraftLength(3), max_new_tokens=12)
    assert out.stats.new_tokens == 12 and out.stats.drafted > 0


def test_a_float32_assistant_asked_for_still_serves_a_bfloat16_target(tmp_path):
    gemma = tiny_gemma4(seed=1)
    tiny_gemma4_assistant(gemma, seed=3).save_pretrained(tmp_path / "assistant")
    gemma = gemma.to(torch.bfloat16)
    back = load_learned(str(tmp_path / "assistant"), loaded(gemma, torch.bfloat16), torch.float32)
    assert {p.dtype for p in back.model.parameters()} == {torch.float32}
    out = generate(KVModel(gemma), PROMPT, CharTokenizer(),
                   drafter=back.new_drafter(gemma, 32, "assistant"), max_new_tokens=8)
    assert out.stats.new_tokens == 8


def test_learned_drafters_default_to_the_targets_dtype():
    assert target_dtype(loaded(tiny_llama(), torch.bfloat16)) == torch.bfloat16
    assert target_dtype(loaded(tiny_llama(), torch.float16)) == torch.float16
    assert target_dtype(loaded(tiny_llama(), torch.float32)) == torch.float32
    assert target_dtype(object()) == torch.float32  # no dtype known: float32


def test_the_builtin_eagle3_head_loads_in_a_bfloat16_targets_dtype():
    from specdemo.models.learned import BUILTIN_DIR, eagle_io
    folder = BUILTIN_DIR / "smollm2-135m-eagle3"
    if not (folder / "config.json").is_file():
        pytest.skip("the built-in drafter's files are not in this checkout")
    head, _ = eagle_io.load_head(folder, 30, target_dtype(loaded(tiny_llama(), torch.bfloat16)))
    assert {p.dtype for p in head.parameters()} == {torch.bfloat16}


# --- 2. seeded sampling: one generator per device ------------------------------------------------

def test_a_generator_on_another_device_is_refused_with_a_sentence():
    cpu = torch.Generator(device="cpu")
    assert generator_for(cpu, torch.device("cpu")) is cpu
    assert generator_for(None, torch.device("cuda", 0)) is None
    with pytest.raises(ValueError, match="a random generator on cpu cannot sample a tensor on cuda:0"):
        generator_for(cpu, torch.device("cuda", 0))


def test_generators_make_one_seeded_generator_per_device(monkeypatch):
    """A CUDA generator cannot be built without CUDA: record what ``torch.Generator`` is asked."""
    made = []

    class Recorder:
        def __init__(self, device):
            self.device = torch.device(device)
            made.append(self.device)

        def manual_seed(self, seed):
            self.seed = seed
            return self

    gens = Generators(7)
    cpu = gens.on("cpu")
    monkeypatch.setattr(torch, "Generator", Recorder)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cuda = gens.on("cuda")
    assert gens.on(torch.device("cuda", 0)) is cuda and gens.on("cpu") is cpu
    assert made == [torch.device("cuda", 0)] and cuda.seed == 7
    assert gens.on("mps").device == torch.device("mps")


@pytest.mark.parametrize("name", DRAFTERS)
def test_every_random_draw_uses_a_generator_on_the_sampled_tensors_device(monkeypatch, name):
    """Every ``torch.multinomial`` / ``torch.rand`` of a seeded decode (drafters and verification)
    gets a generator whose device is that of the tensor it samples; the engine hands drafters
    :class:`Generators`, not a CPU generator (on CUDA the old CPU one crashed the first draw)."""
    target, make = _drafters()[name]
    seen = []
    multinomial, rand = torch.multinomial, torch.rand

    def checked_multinomial(probs, n, *args, generator=None, **kwargs):
        seen.append((probs.device, generator.device))
        return multinomial(probs, n, *args, generator=generator, **kwargs)

    def checked_rand(*size, generator=None, device=None, **kwargs):
        seen.append((torch.device(device or "cpu"), generator.device))
        return rand(*size, generator=generator, device=device, **kwargs)

    handed = []
    drafter = make()
    propose = drafter.propose

    def spy(context, k, params, generator):
        handed.append(generator)
        return propose(context, k, params, generator)
    drafter.propose = spy
    monkeypatch.setattr(torch, "multinomial", checked_multinomial)
    monkeypatch.setattr(torch, "rand", checked_rand)
    params = SamplingParams(temperature=0.8, seed=3)
    generate(KVModel(target), PROMPT, CharTokenizer(), drafter=drafter, params=params,
             max_new_tokens=16)
    assert seen and all(tensor == gen for tensor, gen in seen)
    assert handed and all(isinstance(g, Generators) for g in handed)


def test_seeded_sampling_is_reproducible_with_generators():
    target, make = _drafters()["eagle3"]
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=11)
    runs = [generate(KVModel(target), PROMPT, CharTokenizer(), drafter=make(), params=params,
                     max_new_tokens=20).token_ids for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 20


# --- 5. host-device transfers per round in greedy mode ------------------------------------------

class Transfers:
    """Counts, per kind, the calls that copy a tensor to the host (or wait for it) made from
    specdemo's own code: ``.item()``, ``.tolist()``, ``.cpu()``, ``int()``, ``float()``, ``bool()``."""

    KINDS = {"item": "item", "tolist": "tolist", "cpu": "cpu", "__int__": "int",
             "__float__": "float", "__bool__": "bool", "__index__": "index"}

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, str]] = []
        package = str(Path(__file__).resolve().parent.parent / "specdemo")
        for method, kind in self.KINDS.items():
            original = getattr(torch.Tensor, method)

            def wrapper(tensor, *args, _original=original, _kind=kind, **kwargs):
                caller = sys._getframe(1).f_code
                if caller.co_filename.startswith(package):
                    self.calls.append((_kind, f"{Path(caller.co_filename).name}:{caller.co_name}"))
                return _original(tensor, *args, **kwargs)
            monkeypatch.setattr(torch.Tensor, method, wrapper)


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_rounds_move_only_argmaxes_in_one_transfer_each(monkeypatch, name):
    """Per verification round: one ``.tolist()`` of the target's k+1 argmaxes, and one of the
    drafter's ids (none for prompt lookup); no full-vocabulary row, no per-token ``int``/``float``.
    Before: ~10 transfers a round at k=4 (a row per position, int(argmax) per drafted token)."""
    target, make = _drafters()[name]
    plain = generate(KVModel(target), PROMPT, CharTokenizer(), max_new_tokens=24)
    drafter = make()  # built before counting: a drafter may look at its vocabulary once
    monkeypatch.setattr(clock, "HOST_READS", False)  # the device path, on this CPU
    counter = Transfers(monkeypatch)
    out = generate(KVModel(target), PROMPT, CharTokenizer(), drafter=drafter,
                   policy=FixedDraftLength(4), max_new_tokens=24)
    monkeypatch.undo()
    assert out.token_ids == plain.token_ids  # still exactly plain greedy
    prefill = [c for c in counter.calls if c[1] == "engine.py:probs_at" or c[1] == "sampling.py:choose"]
    assert prefill == [("cpu", "engine.py:probs_at"), ("int", "sampling.py:choose")]  # the first token
    rounds = [c for c in counter.calls if c not in prefill]
    verify = [c for c in rounds if c[1] == "engine.py:_argmax_rows"]
    drafts = [c for c in rounds if c[1] == "base.py:proposal"]
    assert len(verify) == out.stats.rounds and set(verify) == {("tolist", "engine.py:_argmax_rows")}
    if name == "ngram":
        assert drafts == []
    else:  # every round proposes but a last one with a single token left to emit
        assert out.stats.rounds - 1 <= len(drafts) <= out.stats.rounds
        assert set(drafts) == {("tolist", "base.py:proposal")}
    assert [c for c in rounds if c not in verify and c not in drafts] == []


def test_greedy_with_a_repetition_penalty_still_equals_plain_and_transfers_once(monkeypatch):
    target, make = _drafters()["eagle3"]
    params = SamplingParams(repetition_penalty=1.3)
    plain = generate(KVModel(target), PROMPT, CharTokenizer(), params=params, max_new_tokens=20)
    monkeypatch.setattr(clock, "HOST_READS", False)  # the device path, on this CPU
    counter = Transfers(monkeypatch)
    spec = generate(KVModel(target), PROMPT, CharTokenizer(), drafter=make(), params=params,
                    max_new_tokens=20)
    monkeypatch.undo()
    assert spec.token_ids == plain.token_ids
    assert len([c for c in counter.calls if c[1] == "engine.py:_argmax_rows"]) == spec.stats.rounds


# --- 7. accelerate-hooked (offloaded) targets -------------------------------------------------

def _offloaded(tmp_path, layers=3):
    """A tiny Llama dispatched by accelerate with layers 1.. offloaded to disk (hooked forwards
    on the CPU, as ``device_map="auto"`` leaves a target that does not fit the GPU)."""
    from accelerate import dispatch_model
    model = tiny_llama(seed=4, layers=layers)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.rotary_emb": "cpu",
                  "model.norm": "cpu", "lm_head": "cpu",
                  **{f"model.layers.{i}": "disk" for i in range(1, layers)}}
    return dispatch_model(model, device_map, main_device="cpu", offload_dir=str(tmp_path))


def test_early_exit_on_an_accelerate_hooked_target_runs_only_its_first_layers(tmp_path):
    """It returned exactly the full model's logits: the copied view kept accelerate's forward,
    bound to the original model."""
    hooked = _offloaded(tmp_path)
    assert "_hf_hook" in hooked.__dict__  # really hooked
    reference = tiny_llama(seed=4, layers=3)
    ids = torch.tensor([PROMPT[:6]])
    with torch.no_grad():
        full = hooked(ids).logits
        assert torch.allclose(full, reference(ids).logits, atol=1e-6)
        for n in (1, 2):
            ours = early_exit_view(hooked, n)(ids).logits
            theirs = early_exit_view(reference, n)(ids).logits
            assert torch.allclose(ours, theirs, atol=1e-6), n
            assert not torch.allclose(ours, full, atol=1e-3), n
        assert torch.allclose(hooked(ids).logits, full)  # the target itself is untouched


def test_early_exit_drafting_on_a_hooked_target_is_lossless(tmp_path):
    hooked = _offloaded(tmp_path)
    plain = generate(KVModel(hooked), PROMPT, CharTokenizer(), max_new_tokens=16)
    drafter = ModelDrafter(early_exit_view(hooked, 1), 32, name="early-exit:1", shares_weights=True)
    spec = generate(KVModel(hooked), PROMPT, CharTokenizer(), drafter=drafter, max_new_tokens=16)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted < spec.stats.drafted  # not the full model drafting (100%)


def test_offloaded_layers_are_named(tmp_path):
    hooked = _offloaded(tmp_path)
    assert loaded(hooked).offloaded_layers == {"model.layers.1": "disk", "model.layers.2": "disk"}
    assert loaded(tiny_llama()).offloaded_layers == {}
    on_gpu = loaded(hooked, device="cpu")
    on_gpu.device = torch.device("cuda", 0)  # a CUDA target: its CPU modules are offloaded too
    assert on_gpu.offloaded_layers == {"model.embed_tokens": "cpu", "model.layers.0": "cpu",
                                       "model.layers.1": "disk", "model.layers.2": "disk",
                                       "model.rotary_emb": "cpu", "model.norm": "cpu",
                                       "lm_head": "cpu"}


def test_the_page_and_the_json_say_when_layers_are_offloaded(tmp_path, monkeypatch, capsys):
    from specdemo.interfaces import decode_cli, ui_state
    hooked = _offloaded(tmp_path)
    target = loaded(hooked, spec="tiny-offloaded")

    class Pipe:
        pass
    pipe = Pipe()
    pipe.target = target
    assert decode_cli.offloaded(pipe) == {"model.layers.1": "disk", "model.layers.2": "disk"}
    assert "2 modules of tiny-offloaded are offloaded to disk" in capsys.readouterr().err
    pipe.draft = None
    monkeypatch.setattr(ui_state, "_pairing", lambda name: ui_state.Pairing(
        "tiny-offloaded", "none", dtype="float32", quantization=None))
    monkeypatch.setattr(ui_state.CACHE, "loaded", lambda *a: pipe)
    line = ui_state.model_status(None, "none")
    assert "2 of its modules offloaded to disk" in line


# --- CUDA (scripts/device_check.sh; skipped without a GPU) ----------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", DRAFTERS)
def test_cuda_greedy_speculative_equals_plain_in_float32(name):
    target, make = _drafters("cuda")[name]
    plain = generate(KVModel(target), PROMPT, CharTokenizer(), max_new_tokens=24)
    spec = generate(KVModel(target), PROMPT, CharTokenizer(), drafter=make(), max_new_tokens=24)
    assert spec.token_ids == plain.token_ids


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", DRAFTERS)
def test_cuda_seeded_sampling_with_each_drafter(name):
    target, make = _drafters("cuda")[name]
    params = SamplingParams(temperature=0.8, top_k=20, seed=5)
    runs = [generate(KVModel(target), PROMPT, CharTokenizer(), drafter=make(), params=params,
                     max_new_tokens=16).token_ids for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 16


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_bfloat16_gemma4_assistant(tmp_path):
    gemma = tiny_gemma4(seed=1)
    tiny_gemma4_assistant(gemma, seed=3).save_pretrained(tmp_path / "assistant")
    gemma = gemma.to("cuda", torch.bfloat16)
    back = load_learned(str(tmp_path / "assistant"), loaded(gemma, torch.bfloat16, device="cuda"))
    assert {p.dtype for p in back.model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in back.model.parameters()} == {"cuda"}
    out = generate(KVModel(gemma), PROMPT, CharTokenizer(), drafter=back.new_drafter(gemma, 32, "a"),
                   params=SamplingParams(temperature=0.7, seed=1), max_new_tokens=12)
    assert out.stats.new_tokens == 12 and out.stats.drafted > 0


# --- 3. train-draft builds the new head where the target runs ------------------------------------

def _training_target():
    return loaded(tiny_llama(seed=6, vocab_size=32, layers=4), spec="tiny-llama")


def _recipe():
    from specdemo.services.training import train
    return train.Recipe(draft_vocab_size=24, ttt_steps=2, epochs=1, batch_tokens=64,
                        feature_layers=(1, 2, 3))


def test_the_new_head_and_every_training_batch_are_on_the_targets_device():
    from specdemo.services.training import train
    target = _training_target()
    head = train.new_head(target, _recipe(), torch.ones(32, dtype=torch.long))
    devices = {t.device for t in [*head.parameters(), *head.buffers()]}
    assert devices == {target.device}
    assert {p.dtype for n, p in head.named_parameters() if not n.startswith("embed_tokens")} \
        == {torch.float32}
    item = {"ids": torch.arange(6), "n_prompt": 2, "features": torch.zeros(6, 3 * 32),
            "last": torch.zeros(6, 32)}
    batch = train.to_device(train.collate([item], 2), target.device)
    assert train.placement_problems(head, target, batch) == []


def test_a_misplaced_head_is_named_before_training():
    from specdemo.services.training import train
    target = _training_target()
    head = train.new_head(target, _recipe(), torch.ones(32, dtype=torch.long))
    head.norm.weight = torch.nn.Parameter(head.norm.weight.detach().to("meta"))
    head.fc.weight = torch.nn.Parameter(head.fc.weight.detach().to(torch.bfloat16))
    assert train.placement_problems(head, target, (torch.zeros(1, device="meta"),)) == [
        "head tensor fc.weight is torch.bfloat16, training needs float32",
        "head tensor norm.weight is on meta, the target on cpu",
        "batch tensor 0 is on meta, the target on cpu"]


def test_preflight_runs_one_step_on_the_targets_device():
    from specdemo.services.training import train
    target = _training_target()
    train.preflight(target, _recipe())  # raises on a placement or dtype mistake
    assert all(p.grad is None for p in target.model.parameters())  # the target is not trained


# --- 6. presets count drafters at the bytes they load in ----------------------------------------

def test_every_learned_drafter_preset_counts_the_bytes_its_drafter_loads_in():
    """The Llama 8B EAGLE-3 head took 3.8 GB (float32) where its preset counted 1.9: drafters now
    load in the target's dtype, which is what the presets count."""
    from dataclasses import replace

    from specdemo.services import presets as P
    from specdemo.models.loading import resolve_dtype
    learned = [p for p in P.list_presets() if p.draft_is_learned and p.draft_params]
    assert {p.name for p in learned} >= {"llama3.1-8b-eagle3", "qwen3-4b-dflash",
                                         "gemma4-e2b-assistant", "smollm2-135m-eagle3"}
    for preset in learned:
        for kind in preset.devices:
            dtype = target_dtype(loaded(tiny_llama(), resolve_dtype(preset.dtype, torch.device(kind))))
            loads = torch.empty(0, dtype=dtype).element_size() * preset.draft_params
            counted = (preset.weight_bytes(device=kind)
                       - replace(preset, draft_params=0).weight_bytes(device=kind))
            assert counted == loads, (preset.name, kind)


def test_an_auto_dtype_preset_counts_float32_on_the_cpu_and_is_refused_where_that_does_not_fit():
    from dataclasses import replace

    from specdemo.models import hardware as H
    from specdemo.services import presets as P
    base = P.get_preset("smollm2-135m-eagle3")
    auto = replace(base, dtype="auto", memory_bytes=base.memory_bytes // 2 + 10)
    assert auto.weight_bytes(device="cpu") == 4 * (auto.target_params + auto.draft_params)
    assert auto.weight_bytes(device="cuda") == 2 * (auto.target_params + auto.draft_params)
    free = auto.memory_bytes + auto.weight_bytes(device="cpu") // 4  # fits the bfloat16 count only
    cpu = H.HardwareInfo("cpu", "Fake CPU", free, free, 2, free, free)
    ok, why = H.fits(auto, cpu)
    assert not ok and why.startswith(f"needs {P.format_bytes(auto.memory_on('cpu'))} but only")
    gpu = H.HardwareInfo("cuda", "Fake GPU", free, free, 2, free, free)
    assert H.fits(auto, gpu)[0]


# --- 8. Apple silicon ---------------------------------------------------------------------------

def test_bfloat16_on_mps_needs_macos_14():
    from specdemo.models.loading import mps_bfloat16_problem
    assert mps_bfloat16_problem("13.6.1") == (
        "bfloat16 on Apple MPS needs macOS 14 or later and this Mac runs macOS 13.6.1; use "
        "--dtype float16 or float32, or update macOS")
    assert mps_bfloat16_problem("14.0") is None and mps_bfloat16_problem("15.2") is None
    assert mps_bfloat16_problem("") is None  # not a Mac


def test_a_bfloat16_load_on_an_old_mac_is_refused_before_loading(monkeypatch):
    import platform

    from specdemo.models import loading as models
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(platform, "mac_ver", lambda: ("13.5", ("", "", ""), "arm64"))
    monkeypatch.setattr(models, "_load", lambda *a, **k: pytest.fail("loaded anyway"))
    with pytest.raises(models.ModelLoadError, match="needs macOS 14 or later and this Mac runs macOS 13.5"):
        models.load_model("builtin:smollm2-135m", "mps", "bfloat16")


def test_bfloat16_presets_are_refused_on_an_old_mac_with_the_reason(monkeypatch):
    import platform

    from specdemo.models import hardware as H
    from specdemo.services import presets as P
    mac = H.HardwareInfo("mps", "Fake Apple silicon 64 GB", 64 * 2**30, 60 * 2**30, 8,
                         64 * 2**30, 60 * 2**30)
    preset = P.get_preset("qwen2.5-1.5b-0.5b")
    assert preset.dtype == "bfloat16" and H.fits(preset, mac)[0]
    monkeypatch.setattr(platform, "mac_ver", lambda: ("13.6", ("", "", ""), "arm64"))
    ok, why = H.fits(preset, mac)
    assert not ok and why.startswith("bfloat16 on Apple MPS needs macOS 14 or later")
    assert H.fits(P.get_preset("smollm2-135m-ngram"), mac)[0]  # float32 presets still run


def test_mps_loads_straight_to_the_device():
    from specdemo.models.loading import _placement
    assert _placement(torch.device("mps"), torch.float32, None) == {"device_map": {"": "mps"}}
    assert _placement(torch.device("cpu"), torch.float32, None) == {}


def test_out_of_memory_cleanup_empties_the_mps_cache(monkeypatch):
    from specdemo.services import race
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "empty_cache", lambda: emptied.append("mps"))
    race._free_device_memory()
    assert emptied == ["mps"]


# --- 9. the bench says how peak memory was measured -------------------------------------------

def test_peak_memory_names_how_it_was_measured():
    from specdemo.services.bench.config import PEAK_METHODS, PeakMemory
    with PeakMemory("cpu") as memory:
        big = torch.ones(4 << 20)
        memory.sample()
    assert memory.peak > 0 and big.numel()
    assert memory.method == PEAK_METHODS["cpu"] == "process RSS sampled at each streamed token"
    assert PEAK_METHODS["cuda"].startswith("torch.cuda.max_memory_allocated")
    from specdemo.services.bench.report import CSV_COLUMNS
    assert CSV_COLUMNS[CSV_COLUMNS.index("peak_memory_bytes") + 1] == "peak_memory_method"


# --- the accelerator check's script ---------------------------------------------------------------

def test_device_check_script_parses_and_refuses_an_unknown_argument(tmp_path):
    """Its plumbing on the CPU (the real model, minutes) is ``scripts/device_check.sh
    --cpu-dry-run``; here: bash syntax, and one usage line with exit status 2."""
    import subprocess
    script = Path(__file__).resolve().parent.parent / "scripts" / "device_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    out = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True,
                         env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and out.stderr.strip().endswith("[--cpu-dry-run]")
    assert list(tmp_path.iterdir()) == []  # nothing written on a usage error
