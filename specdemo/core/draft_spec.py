"""The draft spec (``--draft``, a preset's ``draft``, the page's draft box) parsed once into a
typed value, :class:`DraftSpec`: a ``str`` of its text that carries its parse, handed inwards
as it is (:func:`as_draft_spec` parses what still comes as text). Text only: no torch, no disk,
no network, so the flag checks (``checks/inputs.py``) and the drafter factory
(``core/drafters/make_drafter``) read the same parse. Whether a named model exists, can be
obtained or fits the target is asked elsewhere (``checks/inputs.py``, ``checks/compat.py``).

The forms (README, "Command line"):

========================  =============  ==============================================
text                      ``kind``       what drafts
========================  =============  ==============================================
``none`` (or empty)       none           nothing: plain decoding
``ngram``                 ngram          prompt lookup over prompt + output
``self``                  self           the target itself
``early-exit:N``          early-exit     the target's first N layers, its norm and head
``mtp``                   mtp            the target's own multi-token-prediction layers
``builtin:<name>``        builtin        a built-in model or shipped learned drafter
``./dir``, ``x.gguf``     path           a local model or learned-drafter folder or file
``org/name``              hub            a Hugging Face id
``name``                  name           a bare name (a folder here or a cached hub model)
``<learned>+ngram``       (the base's)   prompt lookup stacked over a learned drafter
========================  =============  ==============================================
"""

from __future__ import annotations

import re

from .model_spec import FrozenText, builtin_name, looks_like_path

#: suffix that stacks prompt lookup over a learned drafter (``models.learned.COMBINE``)
COMBINE = "+ngram"
EARLY_EXIT = "early-exit"
#: the kinds that are not a model to load (nothing, prompt lookup, views of the target)
NON_MODEL_KINDS = ("none", "ngram", "self", EARLY_EXIT)
#: the one line of forms an error message names
FORMS = ("none, ngram, self, early-exit:<layers>, mtp, builtin:<name>, a local model or "
         "learned-drafter folder or .gguf file, a Hugging Face id org/name, <learned>+ngram")
_WHOLE = re.compile(r"-?[0-9]+")


class DraftSpecError(ValueError):
    """A draft spec that no form accepts; the message is one sentence without the spec's text
    (callers name the field and the text). ``kind`` is the form it was refused as
    (``early-exit`` for ``early-exit:abc``)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class DraftSpec(FrozenText):
    """One draft spec, parsed: the text itself (a ``str``: it compares, hashes, prints and
    serialises as its text, so argparse fields, JSON and the page's values carry it as they
    are), with what its form says. Built by :meth:`parse` (or :func:`as_draft_spec`); frozen.

    Attributes:
        text: the spec as given, stripped (``builtin:smollm2-135m-eagle3+ngram``), a plain str.
        kind: one of none, ngram, self, early-exit, mtp, builtin, path, hub, name (module doc).
        base: ``text`` without the ``+ngram`` suffix (the learned drafter's own spec).
        layers: for early-exit, N (>= 1); else None.
        stacked: True when prompt lookup is stacked over the drafter (``+ngram``).
    """

    __slots__ = ("kind", "base", "layers", "stacked")
    kind: str
    base: str
    layers: int | None
    stacked: bool

    def __new__(cls, text: str, kind: str, base: str, layers: int | None = None,
                stacked: bool = False) -> DraftSpec:
        """The value of an already parsed spec (use :meth:`parse` for text)."""
        spec = super().__new__(cls, text)
        spec._fields(kind=kind, base=base, layers=layers, stacked=stacked)
        return spec

    def __reduce__(self):
        return (DraftSpec, (str(self), self.kind, self.base, self.layers, self.stacked))

    @classmethod
    def parse(cls, text: str) -> DraftSpec:
        """Parse ``text`` (surrounding blanks ignored; empty means none). The one parser of a
        draft spec: everything else reads its result (:func:`as_draft_spec`).

        Raises:
            DraftSpecError: ``early-exit`` without a layer count, with one that is not a whole
                number or below 1, or ``+ngram`` over something that is not a learned drafter.
        """
        text = str(text).strip()
        stacked = text.endswith(COMBINE)
        base = text.removesuffix(COMBINE) if stacked else text
        kind, layers = _kind(base)
        if stacked and kind in NON_MODEL_KINDS:
            raise DraftSpecError(f"{COMBINE} stacks prompt lookup over a learned drafter, and "
                                 f"{base!r} is not one", kind)
        return cls(text, kind, base, layers, stacked)

    @property
    def is_model(self) -> bool:
        """True when something is loaded for it: a draft model or a learned drafter (mtp,
        builtin, path, hub, name), not none, ngram, self or early-exit:N."""
        return self.kind not in NON_MODEL_KINDS

    @property
    def is_early_exit(self) -> bool:
        """True for ``early-exit:N`` (the target's first N layers)."""
        return self.kind == EARLY_EXIT


def as_draft_spec(spec: str | DraftSpec) -> DraftSpec:
    """``spec`` as a :class:`DraftSpec`: itself when it is one already (parsed at the edge: a
    ``--draft`` flag, a preset, the page's draft box), else :meth:`DraftSpec.parse` of it.

    Raises:
        DraftSpecError: text no form accepts; the message ends with ``; got '<text>'``.
    """
    if isinstance(spec, DraftSpec):
        return spec
    try:
        return DraftSpec.parse(spec)
    except DraftSpecError as exc:
        raise DraftSpecError(f"{exc}; got {spec!r}", exc.kind) from None


def _kind(base: str) -> tuple[str, int | None]:
    """(kind, early-exit layers) of a spec without its ``+ngram`` suffix."""
    if base in ("", "none"):
        return "none", None
    if base in ("ngram", "self", "mtp"):
        return base, None
    if base.startswith(EARLY_EXIT):
        _, _, count = base.partition(":")
        if not count:
            raise DraftSpecError("early-exit needs a layer count, e.g. early-exit:8", EARLY_EXIT)
        if not _WHOLE.fullmatch(count):
            raise DraftSpecError(f"early-exit's layer count {count!r} is not a whole number, "
                                 "e.g. early-exit:8", EARLY_EXIT)
        if int(count) < 1:
            raise DraftSpecError("early-exit needs a layer count of at least 1, e.g. early-exit:8",
                                 EARLY_EXIT)
        return EARLY_EXIT, int(count)
    if builtin_name(base) is not None:
        return "builtin", None
    if looks_like_path(base):
        return "path", None
    if base.count("/") == 1:
        return "hub", None
    return "name", None
