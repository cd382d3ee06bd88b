"""From text to decodes: chat template, settings, drafter per run, plain-vs-speculative comparison.

This is the one place the CLI, the app's race and the benchmark share: they pass a target (and
optionally a draft model) plus :class:`DecodeSettings`, and get engine events or results back.
"""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ..core import backend_family
from ..core.draft_spec import DraftSpec, as_draft_spec
from ..core.drafters import make_drafter
from ..core.engine import DecodeEvent, DecodeResult, collect, decode
from ..core.machine import busy_warning
from ..core.policy import AdaptiveDraftLength, make_policy, measure_forward_s
from ..core.sampling import SamplingParams
from ..core.stats import DecodeStats, RaceExplanation, explain, speedup
from ..core.tree import TreeShape
from ..models.backends import attach_drafter, backend_of, target_kv
from ..models.learned import is_learned, load_learned


@dataclass(frozen=True)
class DecodeSettings:
    """User-facing knobs, identical for both modes.

    Attributes:
        max_new_tokens: tokens to generate at most.
        temperature, top_k, top_p, repetition_penalty, seed: see :class:`SamplingParams`.
        draft_length: k (int) or "auto".
        stop_strings: generation ends before the first of these in the text.
        tree: a draft tree shape (``core.tree``) for the learned drafter's rounds, or None
            (chains); used where exact (greedy, an EAGLE-3 drafter, a target with tree
            attention: ``engine.decode``).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    draft_length: int | str = 4
    stop_strings: tuple[str, ...] = ()
    tree: TreeShape | None = None

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.repetition_penalty,
                              self.seed)


@dataclass
class Comparison:
    """Plain and speculative decodes of one prompt, run one after the other.

    Attributes:
        explanation: why the speedup is what it is, from both runs' measurements
            (``stats.explain``: verification and drafting costs in one-token steps, the
            break-even mean acceptance length, the projection where verification costs one
            step); None when a run has no decode forward.
        warnings: sentences on why the numbers may not hold, e.g. other processes used more
            than ``machine.BUSY_SHARE`` of the CPU during a run (see :func:`race_warnings`).
        lossless_expected, lossless_note: whether greedy outputs are expected to be identical
            in the target's precision, and why not (:func:`lossless_expectation`); None when
            not known (set by :meth:`Pipeline.compare`).
    """

    plain: DecodeResult
    speculative: DecodeResult
    speedup: float | None = field(init=False)
    explanation: RaceExplanation | None = field(init=False)
    identical: bool = field(init=False)
    first_divergence: int | None = field(init=False)
    warnings: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.speedup = speedup(self.plain.stats, self.speculative.stats)
        self.explanation = explain(self.plain.stats, self.speculative.stats)
        self.first_divergence = first_divergence(self.plain.token_ids, self.speculative.token_ids)
        self.identical = self.first_divergence is None
        self.warnings = race_warnings(self.plain.stats, self.speculative.stats)

    lossless_expected: bool | None = field(default=None, init=False)
    lossless_note: str | None = field(default=None, init=False)

    def as_dict(self) -> dict:
        return {"plain": result_dict(self.plain), "speculative": result_dict(self.speculative),
                "speedup": self.speedup,
                "explanation": self.explanation.as_dict() if self.explanation else None,
                "identical": self.identical,
                "first_divergence": self.first_divergence, "warnings": self.warnings,
                "lossless_expected": self.lossless_expected, "lossless_note": self.lossless_note}


#: a drafter that accepted less than this share of its drafts ...
LOW_ACCEPTANCE = 0.05
#: ... over at least this many drafts accepts almost nothing (said in words beside the speedup)
LOW_ACCEPTANCE_MIN_DRAFTS = 40


def low_acceptance_warnings(stats: DecodeStats | None) -> list[str]:
    """One sentence per drafter of a speculative run that accepted almost nothing: under
    :data:`LOW_ACCEPTANCE` of at least :data:`LOW_ACCEPTANCE_MIN_DRAFTS` drafts (per drafter,
    from ``drafted_by``/``accepted_by``; prompt lookup, which drafts only where the text repeats,
    is left out). Such a drafter stays lossless but only costs time: it does not predict this
    target on this text."""
    if stats is None:
        return []
    out = []
    for source, drafted in (stats.drafted_by or {}).items():  # None: a server lane's stats
        accepted = (stats.accepted_by or {}).get(source, 0)
        if source == "ngram" or drafted < LOW_ACCEPTANCE_MIN_DRAFTS or accepted >= LOW_ACCEPTANCE * drafted:
            continue
        out.append(f"drafter {source} accepted almost nothing: {accepted} of {drafted} drafts "
                   f"({accepted / drafted:.0%}); it does not predict this target on this text "
                   "(a language or kind of text it was not trained on, or a drafter for another "
                   "target), so speculative decoding only adds its cost here")
    return out


def race_warnings(plain: DecodeStats | None, speculative: DecodeStats | None) -> list[str]:
    """Warnings about a plain-vs-speculative comparison, in words: one sentence naming the runs
    during which other processes used more than ``machine.BUSY_SHARE`` of the CPU (their
    ``other_cpu_share``), since the speedup then compares a slowed run with another; and one
    per drafter that accepted almost nothing (:func:`low_acceptance_warnings`)."""
    lanes = {"plain": plain, "speculative": speculative}
    shares = {name: s.other_cpu_share for name, s in lanes.items() if s is not None}
    warning = busy_warning(shares)
    return ([warning] if warning else []) + low_acceptance_warnings(speculative)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (a length difference counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def output_divergence(a_ids, b_ids, a_text: str, b_text: str) -> tuple[int | None, str]:
    """(first divergence, unit): token ids compared when both outputs have them (or both are
    empty), else the texts, character by character (a server lane that returns no token ids)."""
    if (a_ids and b_ids) or (not a_text and not b_text):
        return first_divergence(list(a_ids), list(b_ids)), "token"
    return first_divergence(list(a_text), list(b_text)), "character"


def result_dict(result: DecodeResult) -> dict:
    """Metric names of docs/design.md plus ``text``, ``token_ids`` and ``from_draft``."""
    return {**result.stats.as_dict(), "text": result.text, "token_ids": result.token_ids,
            "from_draft": result.from_draft}


REDUCED_PRECISION_REASON = (
    "batched verification in a reduced precision can differ from one-token steps: the target's "
    "forward over k+1 tokens rounds its sums differently from k+1 one-token forwards, so a "
    "near-tie between two tokens can flip and greedy speculative output can leave plain greedy "
    "output")


def lossless_expectation(dtype, quantization: str | None = None) -> tuple[bool, str | None]:
    """Whether greedy speculative output is expected to equal plain greedy output token for
    token, and why not.

    In float32 the verification forward over k+1 tokens and the one-token steps agree to the
    last bits, so a divergence is rare; in bfloat16/float16 (and with int4/int8 or 4/8-bit
    weights, whose layers compute in a reduced precision) it is common: measured in
    ``docs/losslessness.md`` (``scripts/lossless_dtypes.py``). The decoding rule is lossless in
    every dtype (Leviathan et al. 2023); the arithmetic is not bit-identical.

    Args:
        dtype: the target's compute dtype (a ``torch.dtype`` or its name, e.g. ``bfloat16``).
        quantization: the target's quantisation (None/"none" for none).
    Returns:
        (True, None) for float32 (and float64) without quantisation, else (False, the reason
        as a sentence naming the dtype or quantisation).
    """
    name = str(dtype).replace("torch.", "")
    if quantization not in (None, "", "none"):
        return False, (f"the target runs with {quantization} weights (computed in a reduced "
                       f"precision): {REDUCED_PRECISION_REASON}")
    if name in ("bfloat16", "float16"):
        return False, f"the target runs in {name}: {REDUCED_PRECISION_REASON}"
    return True, None


#: why greedy outputs may differ on llama.cpp's kernels (docs/cpu-backends.md, "Exactness")
GGML_REASON = ("llama.cpp computes a token's numbers differently in a one-token and a "
               "multi-token decode (its kernels and summation order change with the batch), so a "
               "near-tie between two tokens can flip and greedy speculative output can leave "
               "plain greedy output")


def on_llama_cpp(target) -> bool:
    """Whether ``target`` runs on one of the ggml backends (llama.cpp's kernels)."""
    return backend_family(backend_of(target)) == "ggml"


def target_lossless_expectation(target) -> tuple[bool, str | None]:
    """:func:`lossless_expectation` of a loaded target (``models.LoadedModel``, or anything
    with a ``model``: its parameters' dtype); on a ggml backend (False, why) always:
    measured 0 of 20 prompts differing with the Q4_1 file at k = 4, 8 of 20 with its BF16 copy,
    and 2 of 5 bench tasks with draft length ``auto``."""
    if on_llama_cpp(target):
        return False, (f"the target runs on llama.cpp's kernels (backend {target.backend}): "
                       f"{GGML_REASON}")
    dtype = getattr(target, "dtype", None)
    if dtype is None:
        dtype = next(target.model.parameters()).dtype
    return lossless_expectation(dtype, getattr(target, "quantization", None))


def self_draft_kv(target):
    """The KV cache ``--draft self`` drafts with on ``target``'s backend: a second cache of the
    same forward (``backends.target_kv``) on the ``int8`` and native backends, or None where
    the drafter keeps the transformers model (``transformers``: it is the target's forward;
    ``ggml``: a second llama.cpp context would double its memory).

    On the native and int8 backends a token's numbers do not depend on the forward's width, so
    drafting with the target's own forward proposes exactly the target's greedy tokens (100%
    acceptance at temperature 0). Drafting with the float32 transformers model instead proposes
    that model's tokens: on ``native-w8a8`` (int8 activations) 11 of 16 drafts were accepted on
    "Say hi", output still identical to plain."""
    if backend_family(getattr(target, "backend", "transformers")) in ("int8", "native"):
        return target_kv(target)
    return None


FORWARD_COSTS_ATTR = "_specdemo_forward_s"  # the table, kept on the target model


class Pipeline:
    """A target, a drafter spec and (for model drafts) the draft model.

    Args:
        target: a loaded target (``models.LoadedModel``: model, tokenizer, vocab_size, eos_token_ids).
        draft_spec: ``none``, ``ngram``, ``self``, ``early-exit:N`` or the spec of ``draft``,
            a ``core.draft_spec.DraftSpec`` or its text (:func:`as_draft_spec`); held as
            ``spec`` (``draft_spec`` reads it too) and handed to ``make_drafter`` as such for
            every decode.
        draft: for model specs the loaded draft model (``models.LoadedModel``), for learned
            drafters what ``models.learned.load_learned`` returned, else None.
    Raises:
        DraftSpecError: (a ValueError) a draft spec no form accepts.
    """

    def __init__(self, target, draft_spec: DraftSpec | str = "none", draft=None) -> None:
        self.target = target
        self.spec = as_draft_spec(draft_spec)
        self.draft = draft
        self.kv = target_kv(target)  # a core.kv.TargetKV of the target's backend

    @property
    def draft_spec(self) -> DraftSpec:
        """:attr:`spec`, by the name the callers that print or compare the spec use."""
        return self.spec

    @property
    def draft_source(self):
        """What ``make_drafter`` builds drafters from: a learned drafter, a draft model, or None."""
        if self.draft is None or hasattr(self.draft, "new_drafter"):
            return self.draft
        return self.draft.model

    def new_drafter(self):
        """A fresh drafter of this pipeline (None for ``none``): ``make_drafter``'s, with the
        EAGLE-3 head's steps in C when the target runs on the native backend
        (``backends.attach_drafter``), and ``self`` drafting through a second cache of the
        target's own backend (:func:`self_draft_kv`)."""
        drafter = make_drafter(self.spec, self.target.model, self.target.vocab_size,
                               self.draft_source)
        attach_drafter(drafter, self.target)  # the native backends' C head step
        if self.spec.kind == "self":
            own = self_draft_kv(self.target)
            if own is not None:
                drafter.kv = own
        return drafter

    def forward_costs(self) -> dict[int, float]:
        """Seconds of a target forward by width (for ``auto``), measured once per target model
        and backend in this process: every pipeline over the same loaded target (any drafter)
        reuses it."""
        if not self.forward_costs_known:
            setattr(self.target.model, self._costs_attr,
                    measure_forward_s(self.kv, AdaptiveDraftLength().max_k + 1))
        return getattr(self.target.model, self._costs_attr)

    @property
    def _costs_attr(self) -> str:
        backend = getattr(self.target, "backend", "transformers")
        return FORWARD_COSTS_ATTR if backend == "transformers" else f"{FORWARD_COSTS_ATTR}_{backend}"

    @property
    def forward_costs_known(self) -> bool:
        """True when :meth:`forward_costs` would not measure (this target was measured before)."""
        return getattr(self.target.model, self._costs_attr, None) is not None

    @property
    def context_length(self) -> int | None:
        limit = getattr(self.target.model.config, "max_position_embeddings", None)
        n_ctx = getattr(self.kv, "n_ctx", None)  # a ggml context holds at most this many
        return min(x for x in (limit, n_ctx) if x) if (limit or n_ctx) else None

    def prompt_ids(self, messages: list[dict] | str, system: str | None = None) -> list[int]:
        """Token ids of a prompt: the chat template when the tokenizer has one, else raw text.

        Args:
            messages: a user message, or a list of {"role", "content"} dicts (multi-turn).
            system: an optional system prompt.
        Raises:
            ValueError: when the prompt is empty.
        """
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if not any(m["content"].strip() for m in messages):
            raise ValueError("the prompt is empty: type something to send")
        if system:
            messages = [{"role": "system", "content": system}] + messages
        tok = self.target.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):  # BatchEncoding in newer transformers
                ids = ids["input_ids"]
            return list(ids)
        return tok.encode("\n\n".join(m["content"] for m in messages))

    def check_length(self, prompt_ids: list[int], max_new_tokens: int) -> None:
        """Raise ValueError when prompt + max_new_tokens exceeds the target's context."""
        limit = self.context_length
        if limit and len(prompt_ids) >= limit:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens but the model's context is "
                             f"{limit}; shorten it")
        if limit and len(prompt_ids) + max_new_tokens > limit:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max new tokens ({max_new_tokens}) "
                             f"exceeds the model's context of {limit}; lower max new tokens to "
                             f"{limit - len(prompt_ids)} or less")

    def stream(self, prompt_ids: list[int], settings: DecodeSettings, speculative: bool,
               cancel: threading.Event | None = None) -> Iterator[DecodeEvent]:
        """Engine events of one decode; a fresh drafter each call (no state leaks between runs)."""
        self.check_length(prompt_ids, settings.max_new_tokens)
        drafter, costs = None, None
        if speculative and settings.draft_length == "auto":
            costs = self.forward_costs()  # measured before the clock of this decode starts
        if speculative:
            drafter = self.new_drafter()
        return decode(self.kv, prompt_ids, self.target.tokenizer, drafter=drafter,
                      policy=make_policy(settings.draft_length, costs), params=settings.sampling,
                      max_new_tokens=settings.max_new_tokens,
                      eos_token_ids=self.target.eos_token_ids,
                      stop_strings=settings.stop_strings, cancel=cancel, tree=settings.tree)

    def run(self, prompt_ids: list[int], settings: DecodeSettings, speculative: bool) -> DecodeResult:
        """One whole decode."""
        return collect(self.stream(prompt_ids, settings, speculative))

    def compare(self, prompt_ids: list[int], settings: DecodeSettings,
                prepare: Callable | None = None) -> Comparison:
        """Plain, then speculative, each timed alone on the same prompt and settings.

        Args:
            prepare: ``prepare(pipe, speculative, draft_length, prompt_ids)``, run for both modes
                before either clock starts (``services.startup.prepare_timed``: every forward
                width either run may use, the drafter, ``auto``'s cost table), so that no
                one-time cost lands in one of the two clocks; None when the caller prepared
                already (``compare`` on the command line does).
        """
        if prepare is not None:
            for speculative in (False, True):
                prepare(self, speculative, settings.draft_length, prompt_ids)
        runs = []
        for speculative in (False, True):
            gc.collect()  # garbage of the loads and of the other run: collected outside the clock
            runs.append(self.run(prompt_ids, settings, speculative))
        comparison = Comparison(*runs)
        comparison.lossless_expected, comparison.lossless_note = \
            target_lossless_expectation(self.target)
        return comparison


def build_pipeline(target, draft_spec: DraftSpec | str, *, load_draft: Callable,
                   check_draft: Callable, on_backend: Callable,
                   warn: Callable[[str], None] | None = None) -> Pipeline:
    """Target + backend + draft -> :class:`Pipeline`: the one builder of the command line
    (``interfaces.decode_cli``) and the app (``services.race.PipelineCache``).

    Args:
        target: the loaded target (``models.loading.LoadedModel``), before a backend is set.
        draft_spec: the ``--draft`` spec (``none``, ``ngram``, a folder, a model id ...), a
            ``DraftSpec`` or its text (:func:`as_draft_spec`).
        load_draft: ``load_draft(spec, device) -> LoadedModel`` for a draft model.
        check_draft: ``check_draft(draft_spec)``, run before a draft model loads; raises (or
            exits) when its tokenizer cannot serve the target.
        on_backend: ``on_backend(target, draft_spec, draft) -> target`` on its backend
            (``auto``: weighed for a race with this drafter).
        warn: called with each warning of a learned drafter (EAGLE-3 / DFlash / MTP).

    Raises:
        ModelLoadError / DrafterRefused: a draft that cannot load or cannot serve the target.
    """
    draft, draft_spec = None, as_draft_spec(draft_spec)
    if is_learned(draft_spec):  # EAGLE-3 / DFlash / MTP: checked against the target
        draft = load_learned(draft_spec, target)
        for warning in (draft.warnings if warn is not None else ()):
            warn(warning)
    elif draft_spec.is_model:
        check_draft(draft_spec)
        draft = load_draft(draft_spec, str(target.device))
    return Pipeline(on_backend(target, draft_spec, draft), draft_spec, draft)
