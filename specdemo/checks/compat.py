"""Can this draft serve this target? A verdict from the tokenizers themselves, with the reason.

The engine hands token ids back and forth: the target's ids become the draft's context, the
draft's proposals are verified as target ids. So what matters is that an id means the same text to
both (the token->id maps), plus how each treats BOS/EOS and the chat template. Vocabulary *size*
alone decides nothing: Qwen2.5-7B pads its embeddings to 152,064 rows and Qwen2.5-0.5B to 151,936,
yet both use the same 151,665-token tokenizer (transformers' size check wrongly refuses the pair).

Rules (after llama.cpp's ``common_speculative_are_compatible``, which compares vocab type, special
tokens and token texts):

* a regular token whose text differs at the same id, or regular target tokens missing from the
  draft: ``incompatible``;
* differences confined to added/special tokens, different BOS/EOS, different chat templates, or
  regular tokens only the draft has: ``compatible with warnings``;
* otherwise ``compatible``.

The verdict is recomputed on every call (no cache), so an edited tokenizer file is seen at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from . import inputs
from ..core.draft_spec import DraftSpec, DraftSpecError, as_draft_spec
from ..models import loading as models

COMPATIBLE = "compatible"
WARNINGS = "compatible with warnings"
INCOMPATIBLE = "incompatible"
EXIT_STATUS = {COMPATIBLE: 0, WARNINGS: 0, INCOMPATIBLE: 2}

NON_MODEL_DRAFTS = {
    "none": "no draft: plain decoding needs no second tokenizer",
    "ngram": "ngram copies token ids from the prompt and the output, in the target's own vocabulary",
    "self": "self uses the target's own weights and tokenizer",
}
SHOWN = 5  # tokens named in a reason


@dataclass(frozen=True)
class Verdict:
    """``status`` is compatible, compatible with warnings, or incompatible; ``reasons`` say why."""

    status: str
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True unless incompatible."""
        return self.status != INCOMPATIBLE

    @property
    def exit_status(self) -> int:
        """0, 0 or 2, for ``python -m specdemo check``."""
        return EXIT_STATUS[self.status]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Vocab:
    """One tokenizer's id->token map, which ids are added/special tokens, and a description."""

    by_id: dict[int, str]
    added: frozenset[int]
    size: int
    family: str


def _family(tokenizer, label: str | None) -> str:
    """E.g. "BPE tokenizer of 'builtin:smollm2-135m'" (backend model type, and spec or path)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = type(backend.model).__name__ if backend is not None else type(tokenizer).__name__
    name = label or getattr(tokenizer, "name_or_path", "") or ""
    return f"{model} tokenizer" + (f" of {name!r}" if name else "")


def _vocab(tokenizer, label: str | None = None) -> _Vocab:
    token_to_id = tokenizer.get_vocab()
    added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    added |= set(getattr(tokenizer, "all_special_ids", []) or [])
    by_id = {i: t for t, i in token_to_id.items()}
    return _Vocab(by_id, frozenset(added), len(token_to_id), _family(tokenizer, label))


def _show(tokens: list[str]) -> str:
    """``['a', 'b', ...]`` as "'a', 'b', ..." with at most SHOWN entries."""
    shown = ", ".join(repr(t) for t in tokens[:SHOWN])
    return shown + (", ..." if len(tokens) > SHOWN else "")


def _describe(vocab: _Vocab) -> str:
    return f"{vocab.family} with {vocab.size:,} tokens"


def _regular(ids: list[int], vocab: _Vocab) -> list[int]:
    """The ids that are ordinary tokens (not added/special) in ``vocab``."""
    return [i for i in ids if i not in vocab.added]


def _compare_vocab(target: _Vocab, draft: _Vocab) -> tuple[list[str], list[str]]:
    """(incompatibilities, warnings) from the two id->token maps.

    "Lacks" compares token texts (a target token found nowhere in the draft's vocabulary);
    "differ" compares ids (the same id meaning different text). Every membership test is a set
    or dict lookup, so the time is O(V log V) for V ids (sorting), never quadratic: Gemma 3's
    262k ids against SmolLM2's 49k take about a second.
    """
    problems: list[str] = []
    warnings: list[str] = []
    target_texts, draft_texts = set(target.by_id.values()), set(draft.by_id.values())
    differ = [i for i in sorted(target.by_id) if i in draft.by_id and draft.by_id[i] != target.by_id[i]]
    lacks = [i for i in sorted(target.by_id) if target.by_id[i] not in draft_texts]
    extra = [i for i in sorted(draft.by_id) if draft.by_id[i] not in target_texts]
    differ_regular, lacks_regular = _regular(differ, target), _regular(lacks, target)
    extra_regular = _regular(extra, draft)
    lacks_set = set(lacks)
    if differ_regular or lacks_regular:
        problems.append(f"different tokenizers: target {_describe(target)}, draft {_describe(draft)}")
    if lacks_regular:
        problems.append(f"draft vocabulary lacks {len(lacks_regular):,} of the target's "
                        f"{target.size:,} tokens; first: {_show([target.by_id[i] for i in lacks_regular])}")
    if differ_regular:
        pairs = [f"id {i} is {target.by_id[i]!r} to the target but {draft.by_id[i]!r} to the draft"
                 for i in differ_regular[:SHOWN]]
        problems.append(f"{len(differ_regular):,} token id(s) mean different text: " + "; ".join(pairs)
                        + ("; ..." if len(differ_regular) > SHOWN else ""))
    special_differ = [i for i in differ if i in target.added and i not in lacks_set]
    if special_differ:
        warnings.append("special tokens differ at the same id: " + "; ".join(
            f"id {i} is {target.by_id[i]!r} vs {draft.by_id[i]!r}" for i in special_differ[:SHOWN]))
    special_lacks = [i for i in lacks if i in target.added]
    if special_lacks:
        warnings.append(f"draft lacks {len(special_lacks)} of the target's special tokens: "
                        f"{_show([target.by_id[i] for i in special_lacks])}")
    if extra_regular:
        warnings.append(f"draft has {len(extra_regular):,} tokens the target lacks "
                        f"(never accepted): {_show([draft.by_id[i] for i in extra_regular])}")
    return problems, warnings


def _token_of(tokenizer, which: str) -> tuple[str | None, int | None]:
    return getattr(tokenizer, f"{which}_token", None), getattr(tokenizer, f"{which}_token_id", None)


def _compare_specials(target_tok, draft_tok) -> list[str]:
    """Warnings for BOS/EOS that differ, by text or id."""
    warnings = []
    for which in ("bos", "eos"):
        t, d = _token_of(target_tok, which), _token_of(draft_tok, which)
        if t != d:
            warnings.append(f"{which.upper()} differs: target {t[0]!r} (id {t[1]}), "
                            f"draft {d[0]!r} (id {d[1]}); "
                            f"the target's {which.upper()} decides, the draft may predict it less well")
    return warnings


def _compare_templates(target_tok, draft_tok) -> list[str]:
    t, d = getattr(target_tok, "chat_template", None), getattr(draft_tok, "chat_template", None)
    if t == d:
        return []
    if not t or not d:
        return [f"only the {'target' if t else 'draft'} has a chat template; "
                f"prompts use the target's formatting"]
    return ["chat templates differ; prompts are formatted with the target's, which the draft "
            "was not tuned on (lower acceptance, same output)"]


def _compare_rows(target: _Vocab, draft: _Vocab, target_rows: int | None,
                  draft_rows: int | None) -> tuple[list[str], list[str]]:
    """Embedding rows vs tokenizer ids: padding is fine, too few rows is not."""
    problems, notes = [], []
    for who, vocab, rows in (("target", target, target_rows), ("draft", draft, draft_rows)):
        if rows is None:
            continue
        top = max(vocab.by_id, default=-1) + 1
        if rows < top:
            problems.append(f"{who} model has {rows:,} embedding rows but its tokenizer uses ids "
                            f"up to {top - 1:,}")
        elif rows > top:
            notes.append(f"{who} pads its embeddings to {rows:,} rows for {top:,} token ids (fine: "
                         f"padded rows are never real tokens)")
    return problems, notes


def check_compatibility(target_tokenizer, draft_tokenizer, *, target_rows: int | None = None,
                        draft_rows: int | None = None, target_label: str | None = None,
                        draft_label: str | None = None) -> Verdict:
    """Decide whether ``draft_tokenizer``'s model can draft for ``target_tokenizer``'s.

    Args:
        target_tokenizer, draft_tokenizer: transformers tokenizers (``get_vocab``,
            ``added_tokens_decoder``, ``bos_token``/``eos_token`` and ids, ``chat_template``).
        target_rows, draft_rows: optional embedding-row counts of the models; rows beyond the
            tokenizer's ids (padding) are fine, fewer rows than ids are not.
        target_label, draft_label: names to show in reasons (default: the tokenizers' paths).
    Returns:
        A :class:`Verdict` whose reasons name the tokens or settings that differ.
    """
    target, draft = _vocab(target_tokenizer, target_label), _vocab(draft_tokenizer, draft_label)
    problems, warnings = _compare_vocab(target, draft)
    row_problems, notes = _compare_rows(target, draft, target_rows, draft_rows)
    problems += row_problems
    warnings += _compare_specials(target_tokenizer, draft_tokenizer)
    warnings += _compare_templates(target_tokenizer, draft_tokenizer)
    if problems:
        return Verdict(INCOMPATIBLE, problems + warnings)
    same = f"same vocabulary: {target.size:,} tokens with identical token->id maps"
    if warnings:
        return Verdict(WARNINGS, [same] + warnings + notes)
    return Verdict(COMPATIBLE, [same + ", same BOS/EOS and chat template"] + notes)


def non_model_verdict(draft_spec: str) -> Verdict | None:
    """The verdict for none, ngram and self (always compatible, nothing read), else None.

    ``early-exit:N`` is not among them: whether N fits depends on the target's layer count
    (:func:`early_exit_verdict`)."""
    if draft_spec in NON_MODEL_DRAFTS:
        return Verdict(COMPATIBLE, [NON_MODEL_DRAFTS[draft_spec]])
    return None


def early_exit_verdict(target_spec: str, draft_spec: DraftSpec | str, *,
                       trust_remote_code: bool = False) -> Verdict:
    """``early-exit:N`` (a ``DraftSpec`` or its text) for ``target_spec``: compatible (same
    tokenizer by construction) when N is within 1..(target layers - 1), read from the target's
    config (no weights loaded); incompatible, saying why, for text no form accepts.

    Raises:
        specdemo.models.loading.ModelLoadError: the target's config cannot be read ("cannot check ...").
    """
    try:
        layers = as_draft_spec(draft_spec).layers
    except DraftSpecError as exc:
        return Verdict(INCOMPATIBLE, [str(exc)])
    from ..core.drafters.draft_model import early_exit_problem  # deferred: imports torch
    try:
        total = models.layer_count(target_spec, trust_remote_code=trust_remote_code)
    except models.ModelLoadError as exc:
        raise models.ModelLoadError(f"cannot check {draft_spec}: the layer count of "
                                    f"{target_spec} is unknown ({exc})") from exc
    problem = early_exit_problem(layers, total)
    if problem:
        return Verdict(INCOMPATIBLE, [problem])
    return Verdict(COMPATIBLE, [f"{draft_spec} runs the first {layers} of the target's {total} "
                                "layers and its head: same tokenizer by construction"])


def check_specs(target_spec: str, draft_spec: DraftSpec | str, *,
                trust_remote_code: bool = False) -> Verdict:
    """:func:`check_compatibility` for two model specs (hub id, local dir, .gguf, ``builtin:``).

    Loads tokenizers only (no weights) through ``specdemo.models.loading.load_tokenizer``, afresh on
    every call. none, ngram and self are compatible; ``early-exit:N`` is when N fits the target's
    layer count (:func:`early_exit_verdict`, from its config). ``draft_spec`` is a ``DraftSpec``
    or its text (:func:`as_draft_spec`); text no form accepts is incompatible, saying why.

    A local target (and a local draft model) that cannot be a model at all (a system file, a
    folder without a readable config.json, a weight file cut short) is refused first, in the
    words ``run`` uses (``models.check_local``).

    Raises:
        specdemo.models.loading.ModelLoadError: a local spec that is not a model, or a tokenizer (or, for
            early-exit, the target's config) that cannot be loaded.
    """
    from ..models import loading as models  # lazy: transformers is heavy
    models.check_local(target_spec)
    try:
        draft_spec = as_draft_spec(draft_spec)
    except DraftSpecError as exc:
        return Verdict(INCOMPATIBLE, [str(exc)])
    verdict = non_model_verdict(draft_spec)
    if verdict is not None:
        return verdict
    if draft_spec.is_early_exit:
        return early_exit_verdict(target_spec, draft_spec, trust_remote_code=trust_remote_code)
    from ..models.learned import is_learned  # deferred: imports torch
    if is_learned(draft_spec):  # EAGLE-3 / DFlash / MTP: checked against the target's weights
        return learned_verdict(target_spec, draft_spec)

    models.check_local(draft_spec)
    target = models.load_tokenizer(target_spec, trust_remote_code=trust_remote_code)
    draft = models.load_tokenizer(draft_spec, trust_remote_code=trust_remote_code)
    return check_compatibility(target, draft, target_label=target_spec, draft_label=draft_spec)


def learned_verdict(target_spec: str, draft_spec: str, load_target: Callable | None = None) -> Verdict:
    """The verdict of a learned drafter against a target (loads both; no decoding): incompatible
    with the drafter's problems when it is refused, else what it reads and predicts.

    Args:
        load_target: spec -> loaded target (default ``models.load_model``).
    Raises:
        ModelLoadError: the target cannot be loaded.
    """
    from ..models.learned import DrafterRefused, describe, load_learned  # deferred: imports torch
    target = (load_target or models.load_model)(target_spec)
    try:
        loaded = load_learned(draft_spec, target)
    except DrafterRefused as exc:
        return Verdict(INCOMPATIBLE, exc.problems)
    summary = describe(loaded)
    return Verdict(WARNINGS, [summary] + loaded.warnings) if loaded.warnings \
        else Verdict(COMPATIBLE, [summary])


def before_load(target_spec: str, draft_spec: DraftSpec | str, *,
                trust_remote_code: bool = False) -> None:
    """The input checks that need more than the text, run after every flag's own check and
    before anything loads (``run``, ``compare``, ``bench`` and the app's ``/race`` share them):
    a hub id of either spec that cannot be obtained (:func:`inputs.obtainable`), and an
    ``early-exit:N`` whose N does not fit the target's layer count, read from its config or
    GGUF metadata without weights (:func:`early_exit_verdict`; a target whose config cannot be
    read is left to the load, which says why).

    Raises:
        inputs.InputError: the reason, in the words the command line and the page show.
    """
    inputs.obtainable("target", target_spec)
    try:
        draft_spec = as_draft_spec(draft_spec)
    except DraftSpecError as exc:
        raise inputs.InputError(f"draft: {exc}") from None
    if draft_spec.is_early_exit:
        try:
            verdict = early_exit_verdict(target_spec, draft_spec,
                                         trust_remote_code=trust_remote_code)
        except models.ModelLoadError:
            return
        if not verdict.ok:
            raise inputs.InputError(f"draft {draft_spec!r} does not fit target {target_spec}: "
                                    + "; ".join(verdict.reasons))
    elif draft_spec.is_model:
        inputs.obtainable("draft", draft_spec)
