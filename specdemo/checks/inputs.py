"""What people type, checked once for the command line, the ``/race`` API and the page.

Each function returns the clean value or raises :class:`InputError`, whose message names the
field, says what was wrong and lists the valid values, so that no raw Python message ("could not
convert string to float", "'utf-8' codec can't encode ...") reaches a user. The CLI turns it into
an argparse error (exit status 2), the API and the page into ``gr.Error``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..models import loading as models

DRAFT_LENGTH_MAX = 64  # the engine's limit (policy.make_policy)
NON_MODEL_DRAFT_FORMS = ("none", "ngram", "self", "early-exit:<layers>")


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


def _looks_like_path(spec: str) -> bool:
    """A local path rather than a hub id (``org/name``) or a named drafter."""
    return (spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec
            or spec.lower().endswith(".gguf"))


def _model_forms() -> str:
    return ("builtin:<name> (" + ", ".join(models.builtin_names()) + "), a local model folder, a .gguf "
            "file or a Hugging Face id like org/name")


def _drafter_forms() -> str:
    """The learned-drafter forms a draft spec may also take."""
    from ..models.learned import BUILTIN_DRAFTERS  # deferred: imports torch
    shipped = ", ".join(f"builtin:{n}" for n in BUILTIN_DRAFTERS)
    return (f"a learned drafter ({shipped}, an EAGLE-3/DFlash folder or hub id, mtp), and a "
            "learned drafter with +ngram")


def _missing_path(field: str, spec: str, forms: str) -> None:
    """Refuse a spec that looks like a local path (``<path>+ngram`` included) but names nothing."""
    if _looks_like_path(spec) and not Path(spec.removesuffix("+ngram")).expanduser().exists():
        raise InputError(f"{field} {spec!r}: no such file or folder; valid forms: {forms}")


def target(field: str, spec) -> str:
    """A target model spec: ``builtin:<name>``, a local folder or ``.gguf`` file that exists, or
    a hub id (checked when it is loaded).

    Raises:
        InputError: empty text, a path that does not exist, or an unknown built-in name (the
            message lists the forms and the built-in names).
    """
    spec = text(field, spec).strip()
    forms = _model_forms()
    _missing_path(field, spec, forms)
    if spec.startswith("builtin:") and spec.split(":", 1)[1] not in models.builtin_names():
        raise InputError(f"{field} {spec!r} is not a built-in model; valid forms: {forms}")
    return spec


def draft(field: str, spec) -> str:
    """A draft spec in one of the accepted forms (README, "Command line").

    Names that are not models are checked here (``early-exit:`` needs a layer count >= 1,
    ``builtin:`` a built-in name), and a local path must exist; the rest of a model spec is
    checked when it is loaded, which a race does for both lanes before either runs. Whether an
    early-exit layer count fits the target is ``compat.check_specs``' question (it needs the
    target's config).

    Raises:
        InputError: a malformed spec (the message lists the forms and the built-in names).
    """
    spec = text(field, spec).strip()
    forms = ", ".join(NON_MODEL_DRAFT_FORMS) + ", " + _model_forms() + "; " + _drafter_forms()
    if spec.startswith("early-exit"):
        _, _, layers = spec.partition(":")
        if not layers.isdigit() or int(layers) < 1:
            raise InputError(f"{field} {spec!r}: early-exit needs a layer count of at least 1, "
                             f"e.g. early-exit:8; valid forms: {forms}")
        return spec
    _missing_path(field, spec, forms)
    if spec.startswith("builtin:") and spec.split(":", 1)[1] not in models.builtin_names():
        from ..models.learned import BUILTIN_DRAFTERS, COMBINE  # deferred: imports torch
        if spec.split(":", 1)[1].removesuffix(COMBINE) not in BUILTIN_DRAFTERS:
            raise InputError(f"{field} {spec!r} is not a built-in model or drafter; valid forms: "
                             f"{forms}; built-in drafters: "
                             + ", ".join(f"builtin:{n}" for n in BUILTIN_DRAFTERS))
    return spec
