"""What people type, checked once for the command line, the ``/race`` API and the page.

Each function returns the clean value or raises :class:`InputError`, whose message names the
field, says what was wrong and lists the valid values, so that no raw Python message ("could not
convert string to float", "'utf-8' codec can't encode ...") reaches a user. The CLI turns it into
an argparse error (exit status 2), the API and the page into ``gr.Error``.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
from pathlib import Path

from ..core.draft_spec import COMBINE, FORMS, DraftSpec, DraftSpecError
from ..core.model_spec import ModelSpec, builtin_name, looks_like_path
from ..models import loading as models
from ..models.builtin import BUILTIN_DRAFTERS

DRAFT_LENGTH_MAX = 64  # the engine's limit (policy.make_policy)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+")


class InputError(ValueError):
    """A value a person gave that cannot be used; the message says which field and why."""


def checked(check, *args, **kwargs):
    """An argparse ``type=`` from a check of this module: its message, exit status 2."""
    def parse(value: str):
        try:
            return check(*args, value, **kwargs)
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = check.__name__  # argparse names the type in some messages
    return parse


def text(field: str, value, *, required: bool = True) -> str:
    """A string that can be encoded as UTF-8 (a lone surrogate cannot: it comes from a shell byte
    escape or a broken paste, and tokenizers fail on it with a TypeError).

    Raises:
        InputError: not a string, not encodable, or empty when ``required``.
    """
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InputError(f"{field} must be text, got {type(value).__name__} {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{field} has a character that is not valid text at position "
                         f"{exc.start} ({ascii(value[exc.start:exc.end])}, half of a surrogate "
                         "pair, e.g. from a shell byte escape or a broken paste): remove or "
                         "retype it") from None
    if required and not value.strip():
        raise InputError(f"the {field} is empty: type something to send")
    return value


def number(field: str, value, *, minimum: float | None = None, maximum: float | None = None,
           integer: bool = False, above: float | None = None) -> float | int:
    """A finite number (an integer when ``integer``) within the given bounds.

    Args:
        minimum, maximum: inclusive bounds; above: exclusive lower bound.
    Raises:
        InputError: not a number, not whole when ``integer``, or out of bounds (the message
            gives the valid range).
    """
    bounds = _range_text(minimum, maximum, above, integer)
    kind = "a whole number" if integer else "a number"
    try:
        parsed = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise InputError(f"{field} must be {kind}{bounds}, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(parsed) or (integer and parsed != int(parsed)):
        raise InputError(f"{field} must be {kind}{bounds}, got {value!r}")
    if ((minimum is not None and parsed < minimum) or (maximum is not None and parsed > maximum)
            or (above is not None and parsed <= above)):
        raise InputError(f"{field} must be {kind}{bounds}, got {value!r}")
    return int(parsed) if integer else parsed


def _range_text(minimum, maximum, above, integer: bool) -> str:
    show = (lambda x: f"{x:g}") if not integer else (lambda x: str(int(x)))
    if above is not None and maximum is not None:
        return f" above {show(above)} and at most {show(maximum)}"
    if minimum is not None and maximum is not None:
        return f" from {show(minimum)} to {show(maximum)}"
    if minimum is not None:
        return f" of at least {show(minimum)}"
    if above is not None:
        return f" above {show(above)}"
    return ""


def draft_length(field: str, value) -> int | str:
    """``"auto"`` or an integer k in 1..64 (given as an int or as text).

    Raises:
        InputError: anything else (0 included: it is not a way to say ``auto``).
    """
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return number(field, value, minimum=1, maximum=DRAFT_LENGTH_MAX, integer=True)
    except InputError:
        raise InputError(f"{field} must be 'auto' or a whole number from 1 to {DRAFT_LENGTH_MAX}, "
                         f"got {value!r}") from None


def preset(name: str, names: list[str]) -> str:
    """One of the preset ``names``.

    Raises:
        InputError: an unknown name (the message lists the valid ones).
    """
    if name not in names:
        raise InputError(f"preset {name!r} does not exist; valid presets: "
                         + (", ".join(names) or "none (presets/ is empty)"))
    return name


_looks_like_path = looks_like_path  # text only: core/model_spec.py


def _is_hub_id(spec: str) -> bool:
    """``org/name`` (one slash, hub characters only), not a local path."""
    return (spec.count("/") == 1 and not _looks_like_path(spec)
            and HUB_ID.fullmatch(spec) is not None)


def _model_forms() -> str:
    return ("builtin:<name> (" + ", ".join(models.builtin_names()) + "), a local model folder, a .gguf "
            "file or a Hugging Face id like org/name")


def _draft_forms() -> str:
    return FORMS


def _missing_path(field: str, spec: str, forms: str) -> None:
    """Refuse a spec that looks like a local path (``<path>+ngram`` included) but names nothing."""
    if _looks_like_path(spec) and not Path(spec.removesuffix(COMBINE)).expanduser().exists():
        raise InputError(f"{field} {spec!r}: no such file or folder; valid forms: {forms}")


def hub_cached(spec: str) -> bool:
    """Whether the Hugging Face cache on this machine holds ``spec``'s ``config.json`` (no
    network, no torch)."""
    from huggingface_hub import try_to_load_from_cache
    try:
        return isinstance(try_to_load_from_cache(spec, "config.json"), str)
    except Exception:  # not a valid repo id for huggingface_hub
        return False


def closest_name(spec: str, names) -> str | None:
    """The one of ``names`` that ``spec`` looks like a typo of (difflib, cutoff 0.6; a
    ``kind:N`` spec is matched by its kind), or None."""
    close = []
    if ":" in spec and builtin_name(spec) is None:  # early_exit:4 -> early-exit:4
        head, _, tail = spec.partition(":")
        close = [f"{c}:{tail}" for c in difflib.get_close_matches(head.lower(), [
            n.partition(":")[0] for n in names if ":" in n], n=1, cutoff=0.6)]
    close = close or difflib.get_close_matches(spec.lower(), list(names), n=1, cutoff=0.6)
    return close[0] if close else None


def _did_you_mean(spec: str, names: list[str]) -> str:
    """``" (did you mean ngram?)"`` when ``spec`` is close to one of ``names``, else ""."""
    close = closest_name(spec, names)
    return f" (did you mean {close}?)" if close else ""


def _unknown_name(field: str, spec: str, names: list[str], forms: str) -> None:
    """Refuse a word that is none of ``names``, not a local file or folder and not a model in
    the local Hugging Face cache (a typo, not a model to download: hub ids are ``org/name``)."""
    if spec in names or "/" in spec or Path(spec).expanduser().exists() or hub_cached(spec):
        return
    raise InputError(f"{field} {spec!r} is not a known name, a local file or folder, or a model "
                     f"in the local Hugging Face cache{_did_you_mean(spec, names)}; valid forms: "
                     f"{forms}")


def target(field: str, spec) -> ModelSpec:
    """A target model spec: ``builtin:<name>``, a local folder or ``.gguf`` file that exists, a
    hub id ``org/name`` (whether it can be obtained: :func:`obtainable`), or a bare hub name
    already in the local Hugging Face cache. No network, no torch. Returns it as a
    :class:`ModelSpec` (a ``str`` of the stripped text that carries its ``kind`` and
    ``builtin``), which the layers below read without looking at the text again.

    Raises:
        InputError: empty text, a path that does not exist, an unknown built-in name or an
            unknown word (the message lists the forms and the built-in names, and suggests a
            close one).
    """
    spec = ModelSpec(text(field, spec).strip())
    forms = _model_forms()
    _missing_path(field, spec, forms)
    names = [f"builtin:{n}" for n in models.builtin_names()]
    if spec.builtin is not None and spec not in names:
        raise InputError(f"{field} {spec!r} is not a built-in model{_did_you_mean(spec, names)}; "
                         f"valid forms: {forms}")
    _unknown_name(field, spec, names, forms)
    return spec


def _builtins_accepted(shipped: list[str]) -> str:
    """Every ``builtin:`` name ``--draft`` takes, in one clause: the built-in models (run as a
    draft model) and the learned drafters shipped with specdemo."""
    models_ = ", ".join(f"builtin:{n}" for n in models.builtin_names())
    return (f"built-in draft models: {models_}; built-in learned drafters: "
            + ", ".join(shipped))


def draft(field: str, spec) -> DraftSpec:
    """A draft spec in one of the accepted forms (README, "Command line"), checked from its text
    and the local disk only: no network, no torch, so every flag is checked at once whatever
    its order. Returns it parsed, a :class:`DraftSpec` (a ``str`` of the stripped text that
    carries its kind), which the layers below read without parsing it again.

    Names that are not models are checked here (``early-exit:`` needs a layer count >= 1,
    ``builtin:`` a built-in name), a local path must exist, and a word that is none of the
    names, not a local file or folder and not in the local Hugging Face cache is refused (with
    the closest name, e.g. "did you mean ngram?"). Whether a hub id ``org/name`` can be
    obtained is :func:`obtainable`'s question (it may ask the network), whether an early-exit
    layer count fits the target ``compat.before_load``'s (it reads the target's config).

    Raises:
        InputError: a malformed or unknown spec (the message lists the forms and the built-in
            names).
    """
    spec = text(field, spec).strip()
    forms = _draft_forms()
    try:
        parsed = DraftSpec.parse(spec)
    except DraftSpecError as exc:
        raise InputError(f"{field} {spec!r}: {exc}; valid forms: {forms}") from None
    if not parsed.is_model:
        return parsed
    _missing_path(field, spec, forms)
    shipped = [f"builtin:{n}" for n in BUILTIN_DRAFTERS]
    builtins = [f"builtin:{n}" for n in models.builtin_names()] + shipped
    if parsed.kind == "builtin" and spec not in builtins and parsed.base not in shipped:
        raise InputError(f"{field} {spec!r} is not a built-in model or drafter"
                         f"{_did_you_mean(spec, builtins)}; valid forms: {forms}; "
                         + _builtins_accepted(shipped))
    names = ["none", "ngram", "self", "mtp", "mtp" + COMBINE, "early-exit:8"] + builtins
    _unknown_name(field, parsed.base, names, forms)
    return parsed


def obtainable(field: str, spec: str) -> str:
    """``spec`` unless it is a hub id (``org/name``, ``+ngram`` aside) that is not in the local
    Hugging Face cache while the hub is off limits (``HF_HUB_OFFLINE=1``) or does not answer:
    then it could only fail after everything before it loaded. One quick request at most
    (``models._hub_reachable``), no torch.

    Raises:
        InputError: such a hub id, saying so and what to do.
    """
    name = spec.removesuffix(COMBINE)
    if not _is_hub_id(name) or Path(name).expanduser().exists() or hub_cached(name):
        return spec
    if models._hub_offline() or not models._hub_reachable():
        raise InputError(f"{field} {spec!r} is not in the local Hugging Face cache and the model "
                         "hub is not reachable (or HF_HUB_OFFLINE=1): download it on a connected "
                         "machine, or give a local folder or file")
    return spec


def fits_context(field: str, max_new_tokens: int, target_spec: str, *,
                 trust_remote_code: bool = False) -> int:
    """``max_new_tokens`` unless it cannot fit the target's context even after a one-token
    prompt: the context read from the target's config or GGUF metadata without its weights
    (``models.context_limit``), so that such a value is refused before anything loads. A config
    that cannot be read says nothing here (the load reports it); a prompt + ``max_new_tokens``
    just over the context is refused once the prompt's tokens are known
    (``Pipeline.check_length``).

    Raises:
        InputError: ``max_new_tokens`` >= the context (the message gives the valid range).
    """
    try:
        limit = models.context_limit(target_spec, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - unknown here; the load says what is wrong
        return max_new_tokens
    if limit and max_new_tokens >= limit:
        raise InputError(f"{field} must be a whole number from 1 to {limit - 1} ({target_spec}'s "
                         f"context is {limit} tokens, the prompt included), got {max_new_tokens!r}")
    return max_new_tokens
